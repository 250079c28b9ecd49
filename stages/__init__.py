"""The DVC stages: each runs as `python -m stages.<name>` with the paths dvc.yaml gives it."""
