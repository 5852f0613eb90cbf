"""The commands' options as typed values: groups of options that travel together (frozen dataclasses whose fields
are named as click names the parameters), built once from a command's parameters and passed to the helpers.

A command declares its groups as a :class:`CommandArgs` and builds them from click's keyword arguments::

    @dataclass(frozen=True)
    class SimulateArgs(CommandArgs):
        job: TargetOptions
        costs: CostOptions
        ...

    def simulate(**kw: Any) -> None:
        args = SimulateArgs.from_params(**kw)  # every parameter lands in a group, or it is a TypeError

The groups several commands share are here, and the groups of a command that spans two modules (execute, profile);
a group only one command's module uses lives in that module.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields, replace
from typing import Any, Self

from distsim.core.errors import DistsimError


@dataclass(frozen=True)
class Options:
    """A group of options. A field a command does not have keeps its default."""

    @classmethod
    def names(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls))

    @classmethod
    def from_params(cls, **params: Any) -> Self:
        """The group from a command's parameters (click's keyword arguments): those it has a field for."""
        names = cls.names()
        return cls(**{name: value for name, value in params.items() if name in names})


@dataclass(frozen=True)
class CommandArgs:
    """All the option groups of one command, each field an :class:`Options` (a parameter may be in several)."""

    @classmethod
    def groups(cls) -> dict[str, type[Options]]:
        hints = typing.get_type_hints(cls)
        return {f.name: hints[f.name] for f in fields(cls)}

    @classmethod
    def names(cls) -> frozenset[str]:
        """The parameters of all the groups."""
        return frozenset().union(*(group.names() for group in cls.groups().values()))

    @classmethod
    def from_params(cls, **params: Any) -> Self:
        """Every group from a command's parameters; a parameter that no group takes is a TypeError (a programming
        error: an option was added to the command but not to its groups)."""
        groups = cls.groups()
        left = set(params).difference(*(group.names() for group in groups.values()))
        if left:
            raise TypeError(f"{cls.__name__}: no option group takes {', '.join(sorted(left))}")
        return cls(**{name: group.from_params(**params) for name, group in groups.items()})

    def value(self, name: str) -> Any:
        """The value of the parameter `name`, from the first group that has it."""
        for f in fields(self):
            group = getattr(self, f.name)
            if name in group.names():
                return getattr(group, name)
        raise KeyError(name)


@dataclass(frozen=True)
class ModelOptions(Options):
    """``--model``, ``--cluster`` and ``--nodes``: the model, and the cluster (resized by --nodes) it trains on."""

    model_name: str | None = None
    cluster_name: str | None = None
    nodes: int | None = None


@dataclass(frozen=True)
class TargetOptions(ModelOptions):
    """The model and cluster, and what runs on them: ``--strategy`` or ``--plan``."""

    strategy_text: str | None = None
    plan_path: str | None = None


@dataclass(frozen=True)
class StrategyOptions(Options):
    """The Strategy fields given on the command line (:data:`~distsim.cli.common.STRATEGY_OPTIONS`), with
    ``--partition`` and ``--sequence-parallel``; None (False) where not given."""

    micro_batches: int | None = None
    micro_batch_size: int | None = None
    schedule: str | None = None
    virtual_stages: int | None = None
    policy: str | None = None
    max_in_flight: int | None = None
    grad_sync: str | None = None
    bucket_cap_mb: float | None = None
    recompute: str | None = None
    recompute_layers: int | None = None
    optimizer_sharding: str | None = None
    partition: str | None = None
    sequence_parallel: bool = False
    global_batch: int | None = None
    """--global-batch: the micro-batches from the samples per iteration (not a Strategy field itself)."""


@dataclass(frozen=True)
class CostOptions(Options):
    """``--profile``, ``--strict``, ``--allreduce`` and ``--framework``: where the event costs come from (loaded by
    :func:`~distsim.cli.common.load_costs_for`)."""

    profile_path: str | None = None
    strict: bool = False
    allreduce: str = "nccl"
    framework_name: str | None = None
    """--framework; None: megatron-core's host costs and the model's own attention."""

    def for_model(self, model_name: str | None) -> CostOptions:
        """With a torch module's profile as --model, that profile as --profile too (its measured events go with
        its graph), unless --profile was given."""
        from distsim.io.files import is_model_profile

        if not self.profile_path and is_model_profile(model_name):
            return replace(self, profile_path=model_name)
        return self


@dataclass(frozen=True)
class OutputOptions(Options):
    """Where a command's results go: ``--json``, the files it writes, and whether it shows progress."""

    as_json: bool = False
    trace_path: str | None = None
    plot_path: str | None = None
    csv_path: str | None = None
    table_path: str | None = None
    plan_out: str | None = None
    all_gpus: bool = False
    show_schedule: bool = False
    quiet: bool = False


@dataclass(frozen=True)
class RankTraceOptions(Options):
    """``--trace-dir`` and ``--trace-format``: one trace file per rank (:mod:`distsim.io.rank_traces`), for tools
    that read a distributed job's traces (Holistic Trace Analysis, Chakra)."""

    trace_dir: str | None = None
    trace_format: str | None = None

    def check(self, measured: bool = False) -> None:
        """One line now, before any work, for a half-given pair, a format a measured run cannot write, or a
        directory that cannot be made."""
        import click

        if self.trace_format and not self.trace_dir:
            raise click.UsageError("--trace-format needs --trace-dir DIR (where the per-rank files go)")
        if self.trace_dir and not self.trace_format:
            raise click.UsageError("--trace-dir needs --trace-format (kineto, or chakra for simulate)")
        if not self.trace_dir:
            return
        from distsim.io.output import check_directory
        from distsim.io.rank_traces import NEEDS_RESULT, writer

        if measured and self.trace_format in NEEDS_RESULT:
            raise click.UsageError(f"--trace-format {self.trace_format} writes a simulation's event flow, which a "
                                   "measured run has none of; use kineto (or distsim simulate for chakra)")  # fmt: skip
        writer(self.trace_format)  # importable: a format this distsim lacks is refused before the run
        check_directory(self.trace_dir, "--trace-dir")


def rank_trace_options(run: str, measured: bool = False) -> Any:
    """The --trace-dir and --trace-format options of a command that writes one trace per rank of `run` (a
    `measured` run refuses chakra, which needs the simulated event flow: :meth:`RankTraceOptions.check`)."""
    import click

    chakra = ("chakra needs the simulated event flow: distsim simulate writes it" if measured
              else "chakra, Chakra execution traces of the simulated event flow")  # fmt: skip

    def decorate(f: Any) -> Any:
        f = click.option("--trace-format", type=click.Choice(["kineto", "chakra"]), metavar="kineto|chakra",
                         help="Format of the --trace-dir files. kineto: PyTorch-profiler (Kineto) JSON, what Holistic "
                         "Trace Analysis reads (HTA: its get_temporal_breakdown() gives "
                         "each rank's compute, non-compute = exposed communication, and idle time, as distsim "
                         f"counts them) and Perfetto (ui.perfetto.dev) opens; {chakra}.")(f)  # fmt: skip
        return click.option("--trace-dir", type=click.Path(file_okay=False), metavar="DIR",
                            help=f"Write one trace file per rank of {run} into DIR (made if missing): "
                            "<stem>.rank<gpu>.json (kineto), <stem>.<gpu>.et (chakra).")(f)  # fmt: skip

    return decorate


@dataclass(frozen=True)
class LaunchOptions(Options):
    """How ranks are started on this machine (``--emulate-nodes``, ``--procs-per-node``, ``--link-bandwidth``) and
    how long they may run (``--timeout``)."""

    emulate_nodes: int | None = None
    procs_per_node: int = 1
    link_bandwidth: str | None = None
    timeout: float = 900.0

    def emulation(self) -> Any:
        """The emulated nodes to launch (:class:`~distsim.infra.launch.Emulation`), or None: one process, or ranks
        started by torchrun."""
        from distsim.infra.launch import Emulation

        emulation = (
            Emulation(self.emulate_nodes, self.procs_per_node, self.link_bandwidth) if self.emulate_nodes else None
        )
        if self.link_bandwidth and emulation is None:
            raise DistsimError("--link-bandwidth shapes emulated nodes: add --emulate-nodes 2")
        return emulation


@dataclass(frozen=True)
class RunOptions(Options):
    """How a plan's run goes and what it writes (``distsim execute``): --p2p, --iterations, --warmup, --seed, --out,
    --check, --force; and --elastic, the other kind of run."""

    p2p_mode: str = "nonblocking"
    iterations: int = 5
    warmup: int = 2
    seed: int = 0
    out: str = "trace.json"
    check: str | None = None
    force: bool = False
    elastic: bool = False
    torch_profiler: bool = False
    """--torch-profiler: each rank records torch.profiler's trace of its measured iterations."""
    table_path: str | None = None
    """--table: the median measured iteration's timeline as a table (Parquet or CSV)."""


@dataclass(frozen=True)
class ElasticOptions(Options):
    """The options only ``distsim execute --elastic`` runs take (:mod:`distsim.cli.execute_elastic`)."""

    max_workers: int | None = None
    steps: int = 1
    checkpoint_out: str | None = None
    resume: str | None = None
    mask_tokens: float | None = None
    params_out: str | None = None
    naive_allreduce: bool = False


@dataclass(frozen=True)
class ExecuteArgs(CommandArgs):
    """The option groups of ``distsim execute`` (:mod:`distsim.cli.execute`, :mod:`distsim.cli.execute_elastic`)."""

    job: TargetOptions
    strategy: StrategyOptions
    costs: CostOptions
    launch: LaunchOptions
    run: RunOptions
    elastic: ElasticOptions
    rank_traces: RankTraceOptions


@dataclass(frozen=True)
class ProfileTargets(Options):
    """What ``distsim profile`` profiles: --torch-model, or --strategy and --plan (each repeatable) and a grid's
    strategies (--grid-gpus, --global-batch, --micro-batch-sizes, --schedules)."""

    torch_model: str | None = None
    strategies: tuple[str, ...] = ()
    plan_paths: tuple[str, ...] = ()
    grid_gpus: int | None = None
    global_batch: int | None = None
    micro_batch_sizes: str = "1"
    schedules: str = "1f1b"


@dataclass(frozen=True)
class MeasureOptions(Options):
    """How ``distsim profile`` measures the events, and the profile it writes them to (--out, --overwrite)."""

    out: str = "profile.json"
    overwrite: bool = False
    repeats: int = 10
    warmup: int = 2
    comm_repeats: int = 5
    max_comm_bytes: str = "16MiB"
    max_group: int = 8
    no_compute: bool = False
    no_comm: bool = False
    no_self_check: bool = False
    collocation: bool = False
    dry_run: bool = False


@dataclass(frozen=True)
class ProfileArgs(CommandArgs):
    """The option groups of ``distsim profile`` (:mod:`distsim.cli.profile`, :mod:`distsim.cli.profile_torch`)."""

    job: ModelOptions
    targets: ProfileTargets
    strategy: StrategyOptions
    launch: LaunchOptions
    measure: MeasureOptions
