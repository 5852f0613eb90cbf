"""Command line: ``distsim simulate | models | clusters | schedule | profile | execute | validate | search``.

One module per command (or search driver); each registers itself on the :func:`~distsim.cli.app.cli` group when
imported, which happens when its command is asked for (:class:`~distsim.cli.app.LazyGroup`). Mistakes in the input
(unknown model, invalid strategy, malformed file, unwritable output) print one line on stderr and exit with status 2;
``--help`` on every command explains the options with examples.
"""

from __future__ import annotations

from distsim.cli.app import cli, main

__all__ = ["cli", "main"]
