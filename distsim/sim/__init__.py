"""Layer 1: the simulator: costs, the event flow, the engine, timelines, metrics and memory. No torch, no I/O."""
