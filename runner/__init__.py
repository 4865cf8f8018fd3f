"""Runner: runs planned points as RL jobs. `rl/` is the algorithm (torch), `builtin/` the job on Ray (the built-in
engine), `sweep/` the orchestration above any engine. Imports torch/Ray/vLLM lazily (the `runner` extra)."""
