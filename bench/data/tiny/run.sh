#!/usr/bin/env bash
# Re-creates the tiny-policy runs in this folder: each recipe here through `rlscale run --local` on one CPU thread,
# niced (the machine is shared), its JSON output kept beside the recipe. bench/backtest.py reads the JSON.
set -euo pipefail
cd "$(dirname "$0")"
for recipe in "${@:-*.yaml}"; do
  for r in $recipe; do
    name=${r%.yaml}
    [ -s "$name.json" ] && continue  # resumable: a finished run is kept
    nice -n 10 ../../../.venv/bin/rlscale run "$r" --local --threads 1 --json > "$name.json.tmp"
    mv "$name.json.tmp" "$name.json"
  done
done
