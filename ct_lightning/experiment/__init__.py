"""The experiment layer: runs, reproductions and tracking."""
