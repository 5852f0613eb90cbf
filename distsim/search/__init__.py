"""Search drivers over strategies and plans; they produce strategies the simulator evaluates."""
