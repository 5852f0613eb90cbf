"""Layer 1: processes: the launcher of ranks and emulated nodes, machine load, the self-check."""
