"""`early_terminate: {type: hyperband}`: Optuna's HyperbandPruner on a sweep's runs (a trial each, rewards by step),
for comparison with the asymptote rule. Its brackets live in memory: a resumed sweep starts them afresh."""


class HyperbandStopper:
    """Reports each run's evaluations to an Optuna trial and asks the pruner whether to stop it."""

    def __init__(self, steps: int, min_fraction: float, eta: int, seed: int = 0, study: str = "rlscale"):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        pruner = optuna.pruners.HyperbandPruner(
            min_resource=max(1, int(min_fraction * steps)), max_resource=steps, reduction_factor=eta
        )
        # Optuna picks a trial's bracket from a hash of the study name (random if unnamed): reruns prune alike
        self.study = optuna.create_study(
            study_name=f"rlscale-hyperband:{study}",
            direction="maximize",
            pruner=pruner,
            sampler=optuna.samplers.RandomSampler(seed),
        )
        self.trials: dict[int, object] = {}
        self.reported: dict[int, set[int]] = {}

    def check(self, run_id: int, evaluations: list[tuple[int, float]]) -> str | None:
        """Report (step, val_reward) pairs not reported yet; a reason if the pruner stops the run, else None."""
        import optuna

        trial = self.trials.get(run_id)
        if trial is None:
            trial = self.trials[run_id] = self.study.ask()
            self.reported[run_id] = set()
        for step, reward in evaluations:
            if step not in self.reported[run_id]:
                trial.report(float(reward), step=int(step))
                self.reported[run_id].add(step)
        if evaluations and trial.should_prune():
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            self.trials[run_id] = None
            step, reward = evaluations[-1]
            return f"pruned by Hyperband at step {step} (val reward {reward:.3f})"
        return None

    def finish(self, run_id: int, value: float | None) -> None:
        """Tell the pruner a run ended (value: its final objective, None when it failed)."""
        import optuna

        trial = self.trials.get(run_id)
        if trial is None:
            return
        if value is None:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, value)
        self.trials[run_id] = None
