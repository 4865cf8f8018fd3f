"""The sweep: the driver (planned runs -> engine jobs -> records in the store), the rung scheduler, bayes, hyperband."""
