# The two commands of the README. Both set up .venv on first use (scripts/setup.sh, ~2 min with a warm
# pip cache); `make test` also builds the export checkers' venvs (scripts/checker_envs.sh, ~4 min more).
.PHONY: setup venv demo test test-fast ci example bench

setup: venv
	@ls .venv-verl/.rlscale-checker .venv-trl/.rlscale-checker .venv-openrlhf/.rlscale-checker >/dev/null 2>&1 || \
	  echo "make: building the export checkers' venvs (first time: ~4 min)"
	@bash scripts/checker_envs.sh  # verl / TRL / OpenRLHF, each in its own venv, for the export tests

venv:
	@bash scripts/setup.sh

demo: venv
	.venv/bin/rlscale sweep studies/quickstart.yaml

test: setup
	.venv/bin/python -m pytest -q -n 2 --dist worksteal --durations=15  # two workers; the slowest tests, for the 20 min

test-fast: setup
	.venv/bin/python -m pytest -q -n 2 --dist worksteal -m "not slow"

# CI on a fresh machine (as root): PostgreSQL + `make test` (see .ci/run)
ci:
	bash .ci/run

# Regenerate the bundled example run logs (deterministic)
example: venv
	.venv/bin/python examples/make_example.py
