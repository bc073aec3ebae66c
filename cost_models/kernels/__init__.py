"""Measured kernel data and its lookup: the bottom layer of `cost_models` (see `atlas`)."""
