"""What a sweep decides for and what it should run next: the decision budget, and the extension that identifies the
fits and the optimal-n law (pure: frames in)."""

from dataclasses import dataclass

import numpy as np
import pandas as pd
from rlscale.fitting.curves import compute_column
from rlscale.fitting.rules.reasons import Reason

MAX_EXTEND = 8.0  # the most one extension multiplies a run's compute by: beyond it, plan a new study


def decision_budget(study, runs: pd.DataFrame, records: pd.DataFrame) -> float:
    """The compute a study's decision is for, in its unit (0 without records): for IsoCompute what every finished run
    reached at its last evaluation; otherwise all the study spent, as if on one run."""
    if not len(records):
        return 0.0
    column = compute_column(study)
    if study is not None and study.method == "isocompute":
        done = runs.loc[runs["status"] == "done", "run_id"]
        # the fits reach each run's last evaluation, not its last step
        evaluated = records[records[study.metric].notna() & records["run_id"].isin(done)]
        if len(evaluated):
            return float(evaluated.groupby("run_id")[column].max().min())
    return float(records.groupby("run_id")[column].max().sum())


@dataclass(frozen=True)
class NextAllocation:
    """The runs to extend, and by how much, so that their fits and the optimal-n law can be identified."""

    factor: float  # multiply every run's compute by this (runs of an IsoCompute study stay at equal compute)
    runs: list[dict]  # {run, compute (reached), target, why}: why it needs the compute, "" for equal compute
    goal: Reason  # what the extension should identify: identify_fits, identify_fits_and_law or identify_law

    def to_dict(self) -> dict:
        """Plain JSON-ready values: factor, runs and goal ({code, values})."""
        return {"factor": self.factor, "runs": self.runs, "goal": self.goal.to_dict()}


def next_allocation(curves: pd.DataFrame, law_identified: bool | None) -> NextAllocation | None:
    """Which runs to extend, to what compute, so the fits and law get identified (law_identified None: no law to fit);
    None when all are or nothing can extend. A run under 2 x C_mid gets at least that (x2^k, <= MAX_EXTEND), else 2x."""
    usable = curves[np.isfinite(curves["c_max"].astype(float)) & (curves["c_max"].astype(float) > 0)]
    if usable.empty:
        return None
    needs = {}
    for row in usable.itertuples():
        if bool(row.identified):
            continue
        factor = 2.0
        if np.isfinite(row.C_mid) and row.C_mid > row.c_max / 2:
            factor = max(factor, 2.0 ** np.ceil(np.log2(2 * row.C_mid / row.c_max)))
        needs[row.run] = (min(factor, MAX_EXTEND), row.reason or "not identified")
    law_open = law_identified is False
    if not needs and not law_open:
        return None
    factor = max([factor for factor, _ in needs.values()], default=2.0)
    counts = {"unidentified": len(needs), "runs": len(usable)}
    if needs:
        goal = Reason("identify_fits_and_law" if law_open else "identify_fits", counts)
    else:
        goal = Reason("identify_law", counts)
    runs = [
        {
            "run": row.run,
            "compute": float(row.c_max),
            "target": float(row.c_max * factor),
            "why": needs[row.run][1] if row.run in needs else "",
        }
        for row in usable.itertuples()
    ]
    return NextAllocation(factor=float(factor), runs=runs, goal=goal)
