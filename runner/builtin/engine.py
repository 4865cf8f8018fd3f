"""The `builtin` engine: each run is rlscale.runner.builtin.job.run_job on Ray, and consecutive runs share one
generator (vLLM) and one trainer actor while they use the same model and devices."""

from collections.abc import Callable

from rlscale.runner.engine import Engine, JobResult


class BuiltinEngine(Engine):
    """Runs jobs on a Ray cluster: joins `ray_address`, or starts a local one on first use (stopped on close)."""

    name = "builtin"

    def __init__(self, *, ray_address: str | None = None):
        self.ray_address = ray_address
        self._actors: dict[str, tuple[tuple, object]] = {}  # role -> (key, live actor) shared by consecutive jobs
        self._started_ray = False

    def run(self, recipe, *, run_key: str, on_records: Callable[[list[dict]], None],
            until_step: int | None = None, should_stop: Callable[[], str | None] | None = None,
            progress: Callable[[dict], None] | None = None, gpu_hours: float | None = None) -> JobResult:
        """See Engine.run. A dead actor (a crashed vLLM engine, an OOM-killed trainer) is released before the
        error is raised, so a retry starts fresh ones."""
        import ray

        from rlscale.runner.builtin.job import run_job

        self._started_ray = _init_ray(self.ray_address) or self._started_ray
        try:
            result = run_job(recipe, run_key=run_key, on_records=on_records, resume=True, ray_address=self.ray_address,
                             generator=self._shared_actor("generator", recipe),
                             trainer=self._shared_actor("trainer", recipe),
                             progress=progress, should_stop=should_stop, until_step=until_step,
                             gpu_hours=gpu_hours)
        except ray.exceptions.RayActorError:
            self._release_actors()
            raise
        return JobResult(steps=int(result["steps"]), stopped=bool(result.get("stopped")),
                         compute_reached=bool(result.get("compute_reached")),
                         stop_reason=result.get("stop_reason", ""), busy_seconds=float(result.get("busy_seconds", 0.0)),
                         timings=dict(result.get("timings") or {}))

    def close(self) -> None:
        """Stop the shared actors, and the local Ray cluster if this engine started it."""
        if not self._actors and not self._started_ray:
            return
        self._release_actors()
        if self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False

    def _shared_actor(self, role: str, recipe):
        """The live generator or trainer for `recipe`, started on first use and kept for the next job on the same
        model: reloading base weights costs far less than a new actor (a vLLM engine takes 5-45 s to start, a
        trainer a few seconds); a job on another model, head precision or device count gets fresh ones."""
        if role == "generator":
            from rlscale.runner.builtin.generator import create_generator as create

            key = (recipe.model, recipe.fp32_head, recipe.generator_devices)
        else:
            from rlscale.runner.builtin.trainer import create_trainer as create

            key = (recipe.model, recipe.trainer_devices)
        held = self._actors.get(role)
        if held is not None and held[0] != key:
            self._release_actors(role)
        if role not in self._actors:
            self._actors[role] = (key, create(recipe))
        return self._actors[role][1]

    def _release_actors(self, *roles: str) -> None:
        import ray

        for role in roles or list(self._actors):
            _key, actor = self._actors.pop(role, (None, None))
            if actor is not None:
                try:
                    ray.kill(actor)
                except Exception:  # already dead: nothing left to release
                    pass


def _init_ray(address: str | None) -> bool:
    """Start (or join) Ray unless it is up; True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    return True
