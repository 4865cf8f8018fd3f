# The two commands of the README. Both set up .venv on first use (scripts/setup.sh).
.PHONY: setup demo test test-fast bench

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/rlscale sweep studies/quickstart.yaml

test: setup
	.venv/bin/python -m pytest -q

test-fast: setup
	.venv/bin/python -m pytest -q -m "not slow"
