"""Laws across runs: the power law across sizes (powerlaw.py, model_size.py), the optimal-n law (optimal_n.py), a
run's reward at a compute with its interval (predict.py) and the compute to reach a reward (target.py)."""
