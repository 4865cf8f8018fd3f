"""Benchmark: is the tiny base policy the same on every CPU?

`base_model_dir()` (runner/rl/policy.py) builds the base with fixed seeds on one thread, so a build is reproducible on
one machine. Across CPUs it is not: torch picks its kernels by the CPU's vector instruction set (AVX-512, AVX2, ...)
and MKL and oneDNN do the same, and the SFT is chaotic: a rounding difference early on moves the step at which the
sampled pass rate first reaches SFT_TARGET_PASS_RATE by hundreds of steps. RL from such different bases behaves
differently (the quickstart demo decided on one, kept creeping on another: README, "Sweep").

This builds the base four times on this machine, each time in a child process with the instruction sets capped
differently, as on CPUs of different generations: twice with the kernels chosen as a user's build chooses them (the
CPU's best, and capped at AVX2), twice with the portable settings of PORTABLE (torch's own kernels at their
baseline level, MKL's and oneDNN's reproducible paths), once with MKL free and once capped at AVX2. Reports the SFT
steps, the pass rate, the weights' SHA-256 and the seconds of each build. Writes
bench/results/base_policy_portability.json.

Run: `.venv/bin/python bench/base_policy_portability.py` (~14 minutes on one core).
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

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench" / "results" / "base_policy_portability.json"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# Numerics that do not depend on the CPU (read by torch, MKL and oneDNN when they load, so set for a child process)
PORTABLE = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
CASES = {  # name: (environment of the build, portable)
    "native, the CPU's best": ({}, False),
    "native, capped at AVX2": (AVX2, False),
    "portable, MKL free": (PORTABLE, True),
    "portable, MKL capped at AVX2": ({**PORTABLE, "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, True),
}
BUILD = "import sys; from pathlib import Path; from rlscale.runner.rl.policy import _build_into; _build_into(Path(sys.argv[1]))"


def build(env: dict) -> dict:
    """Build the base into a fresh directory in a child with `env`; what came out."""
    directory = Path(tempfile.mkdtemp(prefix="base_portability_"))
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", BUILD, str(directory)], check=True, capture_output=True,
                   env={**os.environ, **ONE_THREAD, **env})
    seconds = time.perf_counter() - started
    info = json.loads((directory / "rlscale_base_model.json").read_text())
    digest = hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()
    return {"torch_cpu_capability": info["torch_cpu_capability"], "sft_steps": info["sft_steps"],
            "sampled_pass_rate": info["sampled_pass_rate"], "sha256": digest, "seconds": round(seconds, 1),
            "seconds_per_sft_step": round(seconds / info["sft_steps"], 4)}


def main() -> None:
    rows = {}
    for name, (env, portable) in CASES.items():
        row = rows[name] = {"environment": env, "portable": portable, **build(env)}
        print(f"{name:30s} torch {row['torch_cpu_capability']:8s} {row['sft_steps']:5d} SFT steps, "
              f"pass rate {row['sampled_pass_rate']:.3f}, sha256 {row['sha256'][:16]}, {row['seconds']:.0f} s",
              flush=True)
    hashes = {portable: {row["sha256"] for row in rows.values() if row["portable"] == portable}
              for portable in (True, False)}
    result = {"cases": rows, "native_builds_identical": len(hashes[False]) == 1,
              "portable_builds_identical": len(hashes[True]) == 1,
              "machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "cpu_flags_avx512f": "avx512f" in Path("/proc/cpuinfo").read_text()}}
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"native builds identical: {result['native_builds_identical']}; portable builds identical: "
          f"{result['portable_builds_identical']}; wrote {RESULT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
