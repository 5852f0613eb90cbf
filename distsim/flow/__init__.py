"""The event flow: its types and tensor-parallel level (events), the builders of a uniform strategy (uniform) and of a
stages plan (stages), the communication they emit (comm), and gradient synchronisation as a pass (sync)."""
