# The two commands of the README. Both set up .venv on first use (scripts/setup.sh).
.PHONY: setup demo test test-fast ci example bench

setup:
	@bash scripts/setup.sh
	@bash scripts/checker_envs.sh  # verl / TRL / OpenRLHF, each in its own venv, for the export tests

demo: setup
	.venv/bin/rlscale sweep studies/quickstart.yaml

test: setup
	.venv/bin/python -m pytest -q

test-fast: setup
	.venv/bin/python -m pytest -q -m "not slow"

# CI on a fresh machine (as root): PostgreSQL + `make test` (see .ci/run)
ci:
	bash .ci/run

# Regenerate the bundled example run logs (deterministic)
example: setup
	.venv/bin/python examples/make_example.py
