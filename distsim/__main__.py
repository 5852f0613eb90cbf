"""`python -m distsim` (also what torchrun launches with `-m distsim`)."""

from distsim.cli import main

main()
