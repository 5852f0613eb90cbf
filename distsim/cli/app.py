"""The ``distsim`` command group and its entry point (one-line errors, exit status 2 for bad input)."""

from __future__ import annotations

import os
import sys

import click

from distsim.errors import DistsimError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="distsim")
def cli() -> None:
    """Predict hybrid-parallel training (tensor x pipeline x data) before renting the cluster.

    \b
    Examples:
      distsim models                       # built-in workloads
      distsim clusters                     # built-in clusters
      distsim simulate --model gpt2-345m --cluster distsim-testbed --strategy 2M4P2D \\
          --micro-batches 8 --schedule 1f1b --trace out.json --plot out.png
      distsim schedule --schedule 1f1b --pp 4 --micro-batches 8
      distsim search grid --model bert-exlarge --cluster distsim-a10 --global-batch 16
      distsim search dapple --model bert-exlarge --cluster dapple-a --global-batch 64
      distsim profile --help               # measure the events on your machines first
    """


def _silence_stdout() -> None:
    """The reader of our stdout went away (`distsim ... | head`): drop what is still buffered, quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, exit status 2 for bad input."""
    try:
        rc = cli.main(args=argv, prog_name="distsim", standalone_mode=False)
        sys.stdout.flush()
    except click.exceptions.Abort:
        click.echo("distsim: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        where = exc.ctx.command_path if getattr(exc, "ctx", None) is not None else "distsim"
        click.echo(f"{where}: error: {exc.format_message()} (see '{where} --help')", err=True)
        sys.exit(exc.exit_code if exc.exit_code else 2)
    except DistsimError as exc:
        click.echo(f"distsim: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # as click does for a reader that went away: quietly, status 1
        _silence_stdout()
        sys.exit(1)
    sys.exit(rc if isinstance(rc, int) else 0)
