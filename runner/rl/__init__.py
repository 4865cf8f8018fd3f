"""The RL algorithm: tasks and verifiers, the tiny policy, sampling, advantages, losses, the train step.
Pure torch: no Ray, no vLLM, no store."""
