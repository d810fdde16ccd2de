"""CTModule's training kit: the counterfactual pool, the fused epoch loop, evaluation mode and trainer data access."""
