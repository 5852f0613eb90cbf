"""The ``distsim`` command group and its entry point (one-line errors, exit status 2 for bad input)."""

from __future__ import annotations

import importlib
import sys

import click

from distsim.core.errors import DistsimError
from distsim.io.output import silence_stdout, standard_output


class LazyGroup(click.Group):
    """A command group whose commands live in modules imported only when a command is asked for (`lazy`: command
    name -> module, which registers the command on this group when imported): ``distsim simulate`` loads the
    simulator, not the profiler, the executor or the search drivers, and ``import distsim.cli`` loads none."""

    def __init__(self, *args: object, lazy: dict[str, str] | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(self.lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            importlib.import_module(self.lazy[cmd_name])
        return super().get_command(ctx, cmd_name)


COMMANDS = {
    "simulate": "distsim.cli.simulate", "models": "distsim.cli.info", "clusters": "distsim.cli.info",
    "frameworks": "distsim.cli.info", "schedule": "distsim.cli.info", "profile": "distsim.cli.profile",
    "execute": "distsim.cli.execute", "validate": "distsim.cli.validate", "search": "distsim.cli.search",
    "cluster-sim": "distsim.cli.cluster_sim",
}  # fmt: skip
"""Each top-level command's module (see :class:`LazyGroup`)."""


@click.group(cls=LazyGroup, lazy=COMMANDS,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})  # fmt: skip
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
