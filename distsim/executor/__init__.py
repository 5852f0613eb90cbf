"""Thin real executor: runs a plan with torch.distributed and records what happened as a Timeline (torch only)."""
