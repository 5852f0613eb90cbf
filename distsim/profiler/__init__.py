"""Torch-side code: block modules, compute and communication profiling."""
