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

    def __init__(self, *args: object, lazy: dict[str, str] | None = None, summaries: dict[str, str] | None = None,
                 **kwargs: object) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = dict(lazy or {})
        self.summaries = dict(summaries or {})
        """Command name -> the first sentence of its help: what ``--help`` lists for a command not imported yet,
        so that listing the commands imports none of them (a test checks each against the command's own)."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``--help``, from :attr:`summaries` for the commands not imported (as click lists
        them: name and short help, cut to the width)."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(map(len, names))
        rows = []
        for name in names:
            if name in self.commands or name not in self.summaries:
                cmd = self.get_command(ctx, name)
                if cmd is None or cmd.hidden:
                    continue
                rows.append((name, cmd.get_short_help_str(limit)))
            else:
                rows.append((name, click.Command(name, help=self.summaries[name]).get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

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
SUMMARIES = {
    "cluster-sim": "Simulate a job trace on a GPU cluster: JCT (mean, p50, p95), makespan and GPU allocation ratio "
    "(EasyScale 5.2).",
    "clusters": "List the built-in clusters with their figures and sources.",
    "execute": "Run a plan for real with torch.distributed and record its per-GPU timeline.",
    "frameworks": "List the framework presets (--framework of simulate, search and validate) with their sources.",
    "models": "List the built-in workloads: size, graph layers (what --partition counts), source, and the named specs.",
    "profile": "Measure every distinct compute and communication event of a model's strategies.",
    "schedule": "Print a pipeline schedule's action lists and its step x rank grid (unit-time F and B).",
    "search": "Search strategies with the simulator: DistSim's grid search, DAPPLE's or DeepPool's planner, MG-WFBP's "
    "gradient merging, or EasyScale's placement of elastic workers on heterogeneous GPUs.",
    "simulate": "Simulate one training iteration and summarise it.",
    "validate": "Compare a prediction with a measured run: batch time, per-GPU activity and per-stage errors (DistSim "
    "Sec. 5).",
}
"""Each top-level command's summary in ``distsim --help`` (see :attr:`LazyGroup.summaries`)."""


@click.group(cls=LazyGroup, lazy=COMMANDS, summaries=SUMMARIES,
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
