"""The event flow: its types (events), its tensor-parallel level (templates) with activation recomputation as a pass
(recompute), the builders of a uniform strategy (uniform) and of a stages plan (stages), the communication they emit
(comm), and gradient synchronisation with optimizer sharding as a pass (sync)."""
