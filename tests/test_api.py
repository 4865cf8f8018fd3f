"""The notebook API (rlscale/api.py): what `rlscale fit` prints, what a stored study decides, as frames and the one
Decision; and `import rlscale` loads none of it."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rlscale.db.store import Store
from rlscale.fitting.sigmoid import sigmoid

import rlscale

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "scalerl_runs.csv"


def sweep_frame(seed: int = 0) -> pd.DataFrame:
    """An IsoCompute sweep over n at B_p 16 (0.05 GPU-hours each; a step costs more with more rollouts)."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in (2, 4, 8, 16):
        per_step = 1e-5 + 16 * n * 2e-6
        steps = np.arange(5, int(0.05 / per_step) + 1, 5)
        truth = sigmoid(steps * per_step, 0.5 + 0.05 * np.log2(n), 1.6, 0.002 * n**0.5, 0.12)
        rows += [
            {
                "run": f"n{n}",
                "prompts_per_batch": 16,
                "rollouts": n,
                "step": int(s),
                "compute": s * per_step,
                "reward": r,
            }
            for s, r in zip(steps, rng.binomial(1024, truth) / 1024)
        ]
    return pd.DataFrame(rows)


def same(a: dict, b: dict) -> bool:
    """Whether two JSON-ready dicts are equal, NaN equal to NaN."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def test_importing_rlscale_loads_no_api_until_a_name_is_used():
    code = (
        "import sys, rlscale; assert 'pandas' not in sys.modules and 'rlscale.api' not in sys.modules; "
        "f = rlscale.fit; import rlscale.api; assert f is rlscale.api.fit; print(sorted(rlscale.API))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.replace("'", '"')) == ["decide", "decision_text", "fit", "plot", "predict"]
    with pytest.raises(AttributeError, match="no attribute 'fits'"):
        rlscale.fits  # noqa: B018


def test_fit_and_predict_give_what_rlscale_fit_prints(cli):
    code, out, err = cli("fit", str(EXAMPLE), "--json", "--at", "4000")
    assert code == 0, err
    printed = pd.DataFrame(json.loads(out))
    frame = pd.read_csv(EXAMPLE, comment="#")
    fits, at = rlscale.fit(frame), rlscale.predict(frame, at=4000)
    assert fits["run"].tolist() == printed["run"].tolist()
    for key in ("A", "A_lo", "A_hi", "B", "C_mid", "R0"):
        assert fits[key].to_numpy() == pytest.approx(printed[key].astype(float).to_numpy(), nan_ok=True)
    assert fits["identified"].tolist() == printed["identified"].tolist() == [True, True, True, False]
    for key in ("predicted", "predicted_lo", "predicted_hi"):
        assert at[key].to_numpy() == pytest.approx(printed[key].to_numpy())
    held = rlscale.fit(frame, r0=0.1)  # `fit --r0 0.1`
    assert (held["R0"].dropna() == 0.1).all()


def test_a_frame_is_decided_as_the_same_runs_stored_as_a_study(tmp_path):
    frame = sweep_frame()
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with Store(url) as store:
        store.import_runs(
            "sweep",
            [
                (
                    name,
                    {"prompts_per_batch": 16, "rollouts": int(group["rollouts"].iloc[0])},
                    [
                        {"step": int(r.step), "gpu_hours": float(r.compute), "val_reward": float(r.reward)}
                        for r in group.itertuples()
                    ],
                )
                for name, group in frame.groupby("run", sort=False)
            ],
        )
    from_frame = rlscale.decide(frame, budget=0.04, study="sweep")
    stored = rlscale.decide("sweep", budget=0.04, db=url)
    assert same(from_frame.to_dict(), stored.to_dict())
    rec = from_frame.recommendation
    assert from_frame.kind == "allocation" and from_frame.decided and rec.rollouts == 16
    assert rec.predicted_interval[0] < rec.predicted_reward < rec.predicted_interval[1]
    text = rlscale.decision_text(stored, db=url)
    assert text.splitlines()[0].startswith(f"decided: B_p 16, n {rec.rollouts}, M {rec.steps} steps")
    # runs with no study file behind them (a log, a frame) give no recipe a command could export
    assert "rlscale export" not in text
    assert rlscale.decision_text(from_frame) == rlscale.decision_text(stored)


def test_a_frame_without_geometry_decides_its_best_run():
    frame = sweep_frame().drop(columns=["prompts_per_batch", "rollouts"])
    decision = rlscale.decide(frame)
    assert decision.kind == "best_run" and decision.budget == pytest.approx(frame.groupby("run")["compute"].max().min())


def test_bad_input_says_which_column_or_argument():
    frame = pd.read_csv(EXAMPLE, comment="#")
    with pytest.raises(ValueError, match="no column 'reward'"):
        rlscale.fit(frame.drop(columns=["reward"]))
    with pytest.raises(ValueError, match="column 'rollouts': expected one value per run"):
        rlscale.decide(frame)  # a run log's cumulative rollouts are not n
    with pytest.raises(ValueError, match="at: expected a finite compute > 0"):
        rlscale.predict(frame, at=-1)
    with pytest.raises(TypeError, match="unknown option"):
        rlscale.fit(frame, r_zero=0.1)
    with pytest.raises(TypeError, match="fitted as its study file says"):
        rlscale.fit("ablation", r0=0.1)
    with pytest.raises(TypeError, match="expected a pandas DataFrame"):
        rlscale.fit([1, 2, 3])


def test_plot_writes_the_png_rlscale_fit_plot_writes(tmp_path):
    path = rlscale.plot(pd.read_csv(EXAMPLE, comment="#"), tmp_path / "fits.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="ending in .png"):
        rlscale.plot(pd.read_csv(EXAMPLE, comment="#"), tmp_path / "fits.svg")
