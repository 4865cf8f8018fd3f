"""rlscale: make RL post-training as predictable as pre-training."""

__version__ = "0.1.0"
