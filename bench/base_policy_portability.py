"""Benchmark: is a build of the tiny base policy the same on every CPU, and is it the shipped one?

rlscale ships the base's weights (runner/rl/base/) because a build is not portable: torch, MKL and oneDNN pick their
kernels by the CPU's vector instruction set, and the SFT is chaotic, so a rounding difference early on moves the step
at which the sampled pass rate first reaches SFT_TARGET_PASS_RATE by hundreds of steps. This builds the base on this
machine in a child process per case, as CPUs of different generations would: with the kernels a plain build picks
(the CPU's best, capped at AVX2, torch's baseline) and with policy.PORTABLE_ENV (how the shipped weights were built;
`rlscale base-model --rebuild`), once as is and once with torch capped at AVX2 beside it. Reports each build's SFT
steps, pass rate, SHA-256 of the weights, seconds, and whether it is the shipped build bit for bit.
Writes bench/results/base_policy_portability.json.

Run: `.venv/bin/python bench/base_policy_portability.py` (~15 minutes on one core).
"""

import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlscale.runner.rl.policy import PORTABLE_ENV, SHIPPED_DIR

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench" / "results" / "base_policy_portability.json"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
CASES = {  # name: (environment of the build, portable)
    "native, the CPU's best": ({}, False),
    "native, capped at AVX2": (AVX2, False),
    "native, torch's baseline kernels": ({"ATEN_CPU_CAPABILITY": "default"}, False),
    "portable (as shipped)": (PORTABLE_ENV, True),
    "portable, MKL capped at AVX2": ({**PORTABLE_ENV, "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, True),
}
BUILD = (
    "import sys; from pathlib import Path; from rlscale.runner.rl.policy import _build_into; "
    "_build_into(Path(sys.argv[1]))"
)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(env: dict) -> dict:
    """Build the base into a fresh directory in a child with `env`; what came out."""
    directory = Path(tempfile.mkdtemp(prefix="base_portability_"))
    started = time.perf_counter()
    clean = {key: value for key, value in os.environ.items() if key not in {*PORTABLE_ENV, *AVX2}}
    subprocess.run(
        [sys.executable, "-c", BUILD, str(directory)],
        check=True,
        capture_output=True,
        env={**clean, **ONE_THREAD, **env},
    )
    seconds = time.perf_counter() - started
    info = json.loads((directory / "rlscale_base_model.json").read_text())
    return {
        "torch": info["torch"],
        "torch_cpu_capability": info["torch_cpu_capability"],
        "sft_steps": info["sft_steps"],
        "sampled_pass_rate": info["sampled_pass_rate"],
        "sha256": sha256(directory / "model.safetensors"),
        "seconds": round(seconds, 1),
        "seconds_per_sft_step": round(seconds / info["sft_steps"], 4),
    }


def main() -> None:
    shipped = sha256(SHIPPED_DIR / "model.safetensors")
    rows = {}
    for name, (env, portable) in CASES.items():
        row = rows[name] = {"environment": env, "portable": portable, **build(env)}
        row["same_as_shipped"] = row["sha256"] == shipped
        print(
            f"{name:34s} {row['torch_cpu_capability']:8s} {row['sft_steps']:5d} SFT steps, pass rate "
            f"{row['sampled_pass_rate']:.3f}, {row['sha256'][:12]}, {row['seconds']:.0f} s"
            f"{', the shipped build' if row['same_as_shipped'] else ''}",
            flush=True,
        )
    hashes = {
        portable: {row["sha256"] for row in rows.values() if row["portable"] == portable} for portable in (True, False)
    }
    shipped_info = json.loads((SHIPPED_DIR / "rlscale_base_model.json").read_text())
    result = {
        "cases": rows,
        "native_builds_identical": len(hashes[False]) == 1,
        "portable_builds_identical": len(hashes[True]) == 1,
        "shipped": {
            "sha256": shipped,
            "sft_steps": shipped_info["sft_steps"],
            "sampled_pass_rate": shipped_info["sampled_pass_rate"],
            "torch": shipped_info["torch"],
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_flags_avx512f": "avx512f" in Path("/proc/cpuinfo").read_text(),
        },
    }
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"native builds identical: {result['native_builds_identical']}; portable builds identical: "
        f"{result['portable_builds_identical']}; wrote {RESULT.relative_to(ROOT)}"
    )


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help, not a run
    main()
