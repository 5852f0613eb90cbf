"""Layer 3: reading and writing files, traces, plots and outputs."""
