"""One MLflow run: training, the store and its outages, checkpoints, artifacts, served models."""
