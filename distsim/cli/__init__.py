"""Command line: ``distsim simulate | models | clusters | schedule | profile | execute | validate | search``.

One module per command (or search driver); each registers itself on the :func:`~distsim.cli.app.cli` group when
imported. Mistakes in the input (unknown model, invalid strategy, malformed file, unwritable output) print one line
on stderr and exit with status 2; ``--help`` on every command explains the options with examples.
"""

from __future__ import annotations

from distsim.cli import (  # noqa: F401 - each registers its command (the search drivers on `search`)
    cluster_sim,
    execute,
    info,
    profile,
    search,
    search_dapple,
    search_deeppool,
    search_elastic,
    search_grid,
    search_merge,
    simulate,
    validate,
)
from distsim.cli.app import cli, main

__all__ = ["cli", "main"]
