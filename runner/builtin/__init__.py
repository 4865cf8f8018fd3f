"""The `builtin` engine: one RL job as a vLLM generator actor and a torch trainer actor on Ray, with measured
device-hours and checkpoints; `local` runs the same algorithm in one process for debugging."""
