"""The fuzz soak's parts; `python -m bench.soak_fuzz` runs it."""
