#!/usr/bin/env bash
# Regenerate one launch file from a verl launch script: run it with its defaults (HOME and the working directory
# /home/user, nothing else set) where `python3`/`python` only record their arguments; write those arguments,
# shell-quoted, under a header naming the source. Nothing of verl runs (`python3 -c ...` probes fail, so DEVICE is gpu).
#   tests/data/verl_launches/extract.sh SCRIPT 'owner/repo@commit path' OUT
set -euo pipefail
script=$1 source=$2 out=$3
sandbox=$(mktemp -d)
trap 'rm -rf "$sandbox"' EXIT
mkdir -p "$sandbox/bin" "$sandbox/home"
cat > "$sandbox/bin/python3" <<'STUB'
#!/usr/bin/env bash
[ "${1:-}" = "-c" ] && exit 1
printf '%s\0' "$@" > "$CAPTURE"
STUB
chmod +x "$sandbox/bin/python3"
ln -s python3 "$sandbox/bin/python"
for tool in nvidia-smi hf huggingface-cli wget pip; do printf '#!/bin/sh\nexit 0\n' > "$sandbox/bin/$tool"; chmod +x "$sandbox/bin/$tool"; done
# `ray job submit ... -- python3 -m ...`: what follows `--` is the launch
printf '#!/usr/bin/env bash\nwhile [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done\n[ $# -gt 0 ] && shift && exec "$@"\n' > "$sandbox/bin/ray"
chmod +x "$sandbox/bin/ray"
(cd "$sandbox/home" && env -i PATH="$sandbox/bin:/usr/bin:/bin" HOME=/home/user CAPTURE="$sandbox/args" bash "$script" >/dev/null 2>&1) || true
[ -s "$sandbox/args" ] || { echo "extract.sh: $script launched nothing" >&2; exit 1; }
python3 - "$sandbox/args" "$source" "$out" "$sandbox/home" <<'PY'
import shlex, sys
words = open(sys.argv[1], "rb").read().decode().split("\0")[:-1]
words = [word.replace(sys.argv[4], "/home/user") for word in words]  # the script ran in the user's home
lines = [f"# {sys.argv[2]}", "# its launch arguments, as the script passes them with its defaults (HOME=/home/user)"]
lines.append("python3 " + " ".join(shlex.quote(w) for w in words[:2]) + " \\")
lines += [f"    {shlex.quote(w)} \\" for w in words[2:]]
lines[-1] = lines[-1].removesuffix(" \\")
open(sys.argv[3], "w").write("\n".join(lines) + "\n")
PY
