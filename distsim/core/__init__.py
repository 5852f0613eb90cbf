"""Layer 0: values (strategy, cluster, models, schedules) and the registries their names are checked against.
Imports nothing above itself; no torch, no I/O."""
