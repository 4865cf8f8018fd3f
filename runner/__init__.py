"""Runner: one RL job = vLLM generator actor + torch trainer actor on Ray; tasks, losses, sweep driver.
Imports torch/Ray/vLLM (the `runner` extra)."""
