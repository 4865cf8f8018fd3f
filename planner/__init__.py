"""Planner: budget -> IsoCompute grid, cost model, the recipe and study schemas. Never imports torch, Ray or vLLM."""
