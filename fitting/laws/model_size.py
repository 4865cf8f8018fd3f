"""The model size for a budget: per size a line ln L = -k ln C + E (L = 1 - reward; Tan et al.), the lowest one wins;
intervals from a bootstrap over each size's runs (its evaluations when it has one run)."""

from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
from rlscale.fitting.laws.powerlaw import PowerLawFit, crossover_resource, fit_power_law, fit_size
from rlscale.fitting.sigmoid import FitError

MAX_BEYOND = 8.0  # a budget more than this times the largest compute measured is not predicted
CROSSOVER_SPAN = 100.0  # a crossover whose interval spans more than this factor is not located by the data
SIZE_COLUMNS = ["model", "parameters", "run", "compute", "loss"]


def size_frame(
    records: pd.DataFrame, runs: pd.DataFrame, parameters: dict[str, float], *, compute_col: str, reward_col: str
) -> pd.DataFrame:
    """SIZE_COLUMNS, one row per evaluation with compute > 0: each run's model (its config's `model`), that
    model's parameter count (`parameters`: HF directory -> N) and loss 1 - reward. Runs of other models are left out."""
    key = "run_id" if "run_id" in runs.columns and "run_id" in records.columns else "run"
    model_of = {row[key]: (row.get("config") or {}).get("model", row.get("model")) for row in runs.to_dict("records")}
    out = pd.DataFrame(
        {
            "model": records[key].map(model_of),
            "run": records[key].astype(str),
            "compute": pd.to_numeric(records[compute_col], errors="coerce"),
            "loss": 1.0 - pd.to_numeric(records[reward_col], errors="coerce"),
        }
    )
    out["parameters"] = out["model"].map(parameters)
    keep = out["parameters"].notna() & (out["compute"] > 0) & out["loss"].notna()
    return out[keep][SIZE_COLUMNS].reset_index(drop=True)


@dataclass
class SizeLaw:
    """Per-size lines (k, E) at the point estimate and over bootstrap draws, and K_max, N0 across them."""

    models: list[str]  # ordered by parameters
    parameters: np.ndarray
    k: np.ndarray
    E: np.ndarray
    k_draws: np.ndarray  # (draws, sizes)
    E_draws: np.ndarray
    compute_max: np.ndarray  # the largest compute measured at each size
    across: PowerLawFit | None  # K_max, N0 (None below 3 sizes: two sizes always fit it exactly)
    across_identified: bool
    across_reason: str
    level: float = 0.9

    def interval(self, values: np.ndarray) -> tuple[float, float]:
        """The central `level` percentile interval of bootstrap values (NaNs dropped)."""
        values = values[np.isfinite(values)]
        if values.size == 0:
            return float("nan"), float("nan")
        tail = (1 - self.level) / 2 * 100
        return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))

    def to_dict(self) -> dict:
        """JSON-ready: one row per size with k and E [interval], and K_max, N0 across sizes."""
        rows = [
            {
                "model": m,
                "parameters": float(n),
                "k": float(k),
                "k_interval": self.interval(self.k_draws[:, i]),
                "E": float(e),
                "E_interval": self.interval(self.E_draws[:, i]),
                "compute_max": float(c),
            }
            for i, (m, n, k, e, c) in enumerate(zip(self.models, self.parameters, self.k, self.E, self.compute_max))
        ]
        across = None if self.across is None else {"K_max": self.across.K_max, "N0": self.across.N0}
        return {
            "sizes": rows,
            "across": across,
            "across_identified": self.across_identified,
            "across_reason": self.across_reason,
            "level": self.level,
        }


def _bootstrap_sample(group: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    runs = group["run"].unique()
    if runs.size >= 2:
        return pd.concat([group[group["run"] == r] for r in rng.choice(runs, runs.size)])
    return group.iloc[rng.integers(0, len(group), len(group))]


def fit_size_law(frame: pd.DataFrame, *, bootstrap: int = 200, seed: int = 0, level: float = 0.9) -> SizeLaw:
    """The per-size lines of a size_frame and K_max, N0 across them; FitError when fewer than 2 sizes have a line."""
    sizes = frame.groupby("model")["parameters"].first().sort_values()
    if len(sizes) < 2:
        raise FitError(f"need runs at 2 or more model sizes, got {len(sizes)}")
    groups = [frame[frame["model"] == m] for m in sizes.index]
    lines = []
    for model, group in zip(sizes.index, groups):
        try:
            lines.append(fit_size(group["compute"], group["loss"]))
        except FitError as err:
            raise FitError(f"model {model}: {err}") from None
    rng = np.random.default_rng(seed)
    draws = np.full((bootstrap, len(groups), 2), np.nan)
    for b in range(bootstrap):
        for i, group in enumerate(groups):
            sample = _bootstrap_sample(group, rng)
            try:
                draws[b, i] = fit_size(sample["compute"], sample["loss"])
            except FitError:
                pass  # a resample with one distinct compute: no line; the interval uses the others
    k, E = np.array(lines).T
    across, identified, reason = _across_sizes(frame, sizes.to_numpy(float), k)
    return SizeLaw(
        models=list(sizes.index),
        parameters=sizes.to_numpy(float),
        k=k,
        E=E,
        k_draws=draws[:, :, 0],
        E_draws=draws[:, :, 1],
        compute_max=np.array([g["compute"].max() for g in groups], float),
        across=across,
        across_identified=identified,
        across_reason=reason,
        level=level,
    )


def _across_sizes(frame: pd.DataFrame, parameters: np.ndarray, k: np.ndarray):
    if len(parameters) < 3:
        return None, False, f"{len(parameters)} sizes fit K_max and N0 exactly; 3 or more test the law"
    try:
        fit = fit_power_law(frame["parameters"], frame["compute"], 1.0 - frame["loss"])
    except FitError as err:
        return None, False, str(err)
    if not np.all(np.diff(k) > 0):
        return (
            fit,
            False,
            (
                "k(N) does not rise with N (k = "
                + ", ".join(f"{v:.3g}" for v in k)
                + "): the saturating law does not describe these sizes"
            ),
        )
    if not parameters.min() / 10 <= fit.N0 <= parameters.max() * 10:
        return fit, False, f"N0 = {fit.N0:.3g} is outside 10x of the sizes tried: K_max is not pinned"
    return fit, True, f"k(N) rises with N and half-saturates at N0 = {fit.N0:.3g}"


@dataclass
class SizeChoice:
    """The model size for a budget: the winner, each size's predicted reward [interval], and the crossovers."""

    budget: float
    model: str
    parameters: float
    pick_share: float  # the share of bootstrap draws that pick the same size
    predicted: list[dict]  # per size: model, parameters, reward, reward_lo, reward_hi
    crossovers: list[dict]  # where the winner changes: below, above, budget [lo, hi], measured, identified
    level: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def winner_changes(k: np.ndarray, E: np.ndarray) -> list[tuple[int, int, float]]:
    """(index below, index above, compute) where the size with the lowest loss changes, in order of compute."""
    pairs = [(i, j) for i in range(len(k)) for j in range(i + 1, len(k))]
    cuts = sorted({np.log(c) for i, j in pairs if np.isfinite(c := crossover_resource(k[i], E[i], k[j], E[j]))})
    if not cuts:
        return []
    points = [cuts[0] - 1, *((a + b) / 2 for a, b in zip(cuts, cuts[1:])), cuts[-1] + 1]
    best = [int(np.argmin(-k * t + E)) for t in points]
    changes = []
    for cut, before, after in zip(cuts, best, best[1:]):
        if before != after:
            changes.append((before, after, float(np.exp(cut))))
    return changes


def choose_size(law: SizeLaw, budget: float) -> SizeChoice:
    """The size with the lowest predicted loss at `budget` (the study's compute), with intervals; Refusal when a size's
    loss does not clearly fall with compute (size_not_learning) or the budget is far past the data."""
    from rlscale.fitting.rules.reasons import Reason, Refusal

    for i, model in enumerate(law.models):
        lo, _ = law.interval(law.k_draws[:, i])
        if not law.k[i] > 0 or not lo > 0:
            raise Refusal(
                Reason(
                    "size_not_learning", {"model": model, "k": float(law.k[i]), "k_lo": float(lo), "level": law.level}
                )
            )
    for model, reach in zip(law.models, law.compute_max):
        if budget > MAX_BEYOND * reach:
            raise Refusal(
                Reason(
                    "size_budget_past_data",
                    {
                        "budget": budget,
                        "factor": budget / reach,
                        "model": model,
                        "reach": float(reach),
                        "max_beyond": MAX_BEYOND,
                    },
                )
            )
    t = np.log(budget)
    best = int(np.argmin(-law.k * t + law.E))
    loss_draws = np.exp(-law.k_draws * t + law.E_draws)
    picks = np.nanargmin(np.where(np.isfinite(loss_draws), loss_draws, np.inf), axis=1)
    predicted = []
    for i, model in enumerate(law.models):
        lo, hi = law.interval(1.0 - loss_draws[:, i])
        predicted.append(
            {
                "model": model,
                "parameters": float(law.parameters[i]),
                "reward": float(1.0 - np.exp(-law.k[i] * t + law.E[i])),
                "reward_lo": lo,
                "reward_hi": hi,
            }
        )
    crossovers = []
    for below, above, at in winner_changes(law.k, law.E):
        draws = np.array(
            [crossover_resource(kb[below], Eb[below], kb[above], Eb[above]) for kb, Eb in zip(law.k_draws, law.E_draws)]
        )
        lo, hi = law.interval(draws)
        crossovers.append(
            {
                "below": law.models[below],
                "above": law.models[above],
                "budget": at,
                "budget_lo": lo,
                "budget_hi": hi,
                "measured": bool(at <= min(law.compute_max[below], law.compute_max[above])),
                "identified": bool(hi / lo <= CROSSOVER_SPAN),
            }
        )
    notes = [
        f"lines ln(1 - reward) = -k ln C + E per size; {law.level:.0%} intervals from a bootstrap over each "
        "size's runs (its evaluations when it has one run)"
    ]
    beyond = [m for m, reach in zip(law.models, law.compute_max) if budget > reach]
    if beyond:
        notes.append(f"the budget is past the compute measured for {', '.join(beyond)}: their lines are extrapolated")
    notes.append(f"K_max, N0 across sizes: {law.across_reason}")
    return SizeChoice(
        budget=budget,
        model=law.models[best],
        parameters=float(law.parameters[best]),
        pick_share=float(np.mean(picks == best)),
        predicted=predicted,
        crossovers=crossovers,
        level=law.level,
        notes=notes,
    )
