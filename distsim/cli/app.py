"""The ``distsim`` command group and its entry point (one-line errors, exit status 2 for bad input)."""

from __future__ import annotations

import sys

import click

from distsim.core.errors import DistsimError
from distsim.io.output import silence_stdout, standard_output


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


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, exit status 2 for bad input.

    Standard output is guarded while the command runs (:func:`distsim.io.output.standard_output`): a reader that went
    away ends what was being written to it quietly, the command goes on and exits 0 (its summary still reaches
    stderr); a write that fails otherwise (a full disk) is one line, exit status 2, even when it only shows at the
    last flush, and nothing is left to fail again at exit."""
    with standard_output():
        code = _run(argv)
    sys.exit(code)


def _run(argv: list[str] | None) -> int:
    """Run the command line; its exit status (any error reported on stderr)."""
    try:
        rc = cli.main(args=argv, prog_name="distsim", standalone_mode=False)
        sys.stdout.flush()  # a failure that only shows now (a full disk under `> file`) is one line too
    except click.exceptions.Abort:
        click.echo("distsim: aborted", err=True)
        return 130
    except click.ClickException as exc:
        where = exc.ctx.command_path if getattr(exc, "ctx", None) is not None else "distsim"
        click.echo(f"{where}: error: {exc.format_message()} (see '{where} --help')", err=True)
        return exc.exit_code if exc.exit_code else 2
    except DistsimError as exc:
        click.echo(f"distsim: error: {exc}", err=True)
        return exc.exit_code
    except BrokenPipeError:  # a pipe other than the guarded stdout: quietly, status 1, as click does
        silence_stdout()
        return 1
    return rc if isinstance(rc, int) else 0
