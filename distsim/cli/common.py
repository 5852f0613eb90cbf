"""What the commands share: number formats, option parsers, loading model/cluster/costs, a progress line."""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from distsim.core.errors import DistsimError

if TYPE_CHECKING:
    from distsim.cli.options import CostOptions, ModelOptions, OutputOptions, StrategyOptions, TargetOptions

GB = 1e9


TIMEOUT_MAX_S = 365 * 86400
"""The longest --timeout: a year (a timedelta, and gloo's timeout, overflow far beyond)."""


class RegistryChoice(click.Choice):
    """click's Choice over the names of a registry (schedules, sync modes), read each time the option is parsed or
    its help shown: a name registered after the CLI was imported (a plugin's, a test's) is a choice too."""

    def __init__(self, registry: Mapping[str, Any], case_sensitive: bool = True) -> None:
        self._registry = registry
        super().__init__(list(registry), case_sensitive)

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        return tuple(self._registry)

    @choices.setter
    def choices(self, value: Any) -> None:  # click's __init__ assigns the names: the registry is the truth
        pass


class RegistryHelpOption(click.Option):
    """A click option whose help names a registry's entries where it says ``{names}`` (``A10, A40, ...``) and
    explains them where it says ``{summaries}`` (``name: its summary; ...``), read each time the help is shown: an
    entry registered after the CLI was imported is in it too. ``cls=RegistryHelpOption, registry=GPUS``."""

    def __init__(self, *args: Any, registry: Mapping[str, Any], **kwargs: Any) -> None:
        self._registry = registry
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def help(self) -> str | None:
        if not self._help:
            return self._help
        text = self._help.replace("{names}", ", ".join(self._registry))
        if "{summaries}" in text:
            text = text.replace("{summaries}", "; ".join(f"{k}: {v.summary}" for k, v in self._registry.items()))
        return text

    @help.setter
    def help(self, value: str | None) -> None:
        self._help = value


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange, which lets 'nan' through every bound (and 'inf' through a missing one), refusing both."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def fmt_count(n: float) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def parse_stragglers(values: tuple[str, ...]) -> dict[int, float]:
    out = {}
    for v in values:
        gpu, sep, factor = v.partition("=")
        try:
            if not sep:
                raise ValueError
            out[int(gpu)] = float(factor)
        except ValueError:
            raise DistsimError(f"--straggler expects GPU=FACTOR (e.g. 3=1.5), got {v!r}") from None
    return out


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); anything else is a one-line error naming the option."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise DistsimError(f"{option} takes comma-separated integers, e.g. 1,2,4; got {text!r}") from None
    if not values or min(values) < 1:
        raise DistsimError(f"{option} takes positive integers, got {text!r}")
    return values


def parse_partition(text: str) -> tuple[int, ...]:
    """Layers per stage: '23:25' (also '23/25' or '23,25')."""
    try:
        values = tuple(int(x) for x in re.split(r"[:/,]", text))
    except ValueError:
        raise DistsimError(f"--partition expects layer counts like 23:25, got {text!r}") from None
    return values


def parse_bytes(text: str, option: str = "--max-comm-bytes") -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]i?b?|b)?\s*", text.lower())
    if not m:
        raise DistsimError(f"{option} takes a size like 16MiB or 4194304, got {text!r}")
    unit = (m.group(2) or "b").rstrip("b") or "b"
    scale = {"b": 1, "k": 1e3, "ki": 2**10, "m": 1e6, "mi": 2**20, "g": 1e9, "gi": 2**30}[unit]
    return int(float(m.group(1)) * scale)


def parse_schedules(text: str) -> tuple[str, ...]:
    from distsim.core.schedules import SCHEDULES

    names = tuple(x.strip().lower() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in SCHEDULES and n != "dapple"]
    if not names or bad:
        raise DistsimError(f"--schedules takes a comma-separated subset of {','.join(SCHEDULES)}; got {text!r}")
    return tuple("1f1b" if n == "dapple" else n for n in names)


# option name -> Strategy field, for the options simulate and execute share
STRATEGY_OPTIONS = (
    ("micro_batches", "num_micro_batches"),
    ("micro_batch_size", "micro_batch_size"),
    ("schedule", "schedule"),
    ("virtual_stages", "virtual_stages"),
    ("policy", "warmup_policy"),
    ("max_in_flight", "max_in_flight"),
    ("grad_sync", "grad_sync"),
    ("bucket_cap_mb", "bucket_cap_mb"),
    ("recompute", "recompute"),
    ("recompute_layers", "recompute_layers"),
    ("optimizer_sharding", "optimizer_sharding"),
)


def grad_sync_options(default: str | None = None, framework: bool = False) -> Any:
    """``--grad-sync`` (the modes of :mod:`distsim.core.sync`, each explained) and ``--bucket-cap-mb``; `framework`:
    when not given, the --framework's synchronisation applies (``Framework.synchronised``)."""
    from distsim.core.sync import DDP_BUCKET_CAP_MB, MODES

    modes = "; ".join(f"{name}: {mode.summary}" for name, mode in MODES.items())
    shown = "" if default is not None else " [default: bulk]"
    if framework:
        shown = (" [default: bulk, or under a framework with overlap_grad_reduce (megatron-core-overlap) Megatron's "
                 "buckets of max(40M, 1M x dp) parameters, reduced during backward (ddp)]")  # fmt: skip

    def decorate(f: Any) -> Any:
        cap = f"DDP bucket size in MiB (--grad-sync ddp). [default: {DDP_BUCKET_CAP_MB:g}]"
        f = click.option("--bucket-cap-mb", type=FiniteFloatRange(min=0, min_open=True), default=None, help=cap)(f)
        return click.option("--grad-sync", type=RegistryChoice(MODES), default=default,
                            show_default=default is not None,
                            help=f"Data-parallel gradient synchronisation. {modes}.{shown}")(f)  # fmt: skip

    return decorate


def scale_options(f: Any) -> Any:
    """``--recompute``, ``--recompute-layers``, ``--sequence-parallel`` and ``--optimizer-sharding``: what large
    transformer runs use (activation recomputation, Megatron's sequence parallelism, a sharded optimizer), each
    choice explained from its registry (:mod:`distsim.sim.flow.recompute`, :mod:`distsim.core.sync`)."""
    from distsim.core.sync import SHARDINGS
    from distsim.sim.flow.recompute import MODES as RECOMPUTE

    recompute = "; ".join(f"{name}: {mode.summary}" for name, mode in RECOMPUTE.items())
    sharding = "; ".join(f"{name}: {s.summary}" for name, s in SHARDINGS.items())
    f = click.option("--optimizer-sharding", type=click.Choice(list(SHARDINGS)), default=None,
                     help=f"Optimizer state sharded over the data-parallel group (ZeRO). {sharding}. "
                     "[default: none]")(f)  # fmt: skip
    f = click.option("--sequence-parallel", is_flag=True, default=False,
                     help="Megatron's sequence parallelism (needs tp > 1): the tensor-parallel all-reduces become "
                     "reduce-scatter + all-gather pairs; layer norms and dropouts run on 1/tp of the sequence.",
                     )(f)  # fmt: skip
    f = click.option("--recompute-layers", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Recompute only the first N layers of each stage. [default: all]")(f)  # fmt: skip
    return click.option("--recompute", type=click.Choice(list(RECOMPUTE)), default=None,
                        help=f"Activation recomputation (Korthikanti et al. 2022). {recompute}. [default: none]",
                        )(f)  # fmt: skip


def strategy_overrides(options: StrategyOptions) -> tuple[dict[str, Any], list[str]]:
    """Strategy fields given on the command line, and the options that gave them (for messages)."""
    overrides: dict[str, Any] = {}
    given: list[str] = []
    for opt, field_name in STRATEGY_OPTIONS:
        if getattr(options, opt) is not None:
            overrides[field_name] = getattr(options, opt)
            given.append("--" + opt.replace("_", "-"))
    if options.partition:
        overrides["partition"] = parse_partition(options.partition)
        given.append("--partition")
    if options.sequence_parallel:
        overrides["sequence_parallel"] = True
        given.append("--sequence-parallel")
    return overrides, given


SCALE_FIELDS = ("recompute", "recompute_layers", "sequence_parallel", "optimizer_sharding")
"""The Strategy fields :func:`scale_options` set."""


def with_scale_options(strategy: Any, overrides: dict[str, Any]) -> Any:
    """`strategy` (one of a grid's, whose degrees vary) with the scale options among `overrides` (from
    :func:`strategy_overrides`) where they apply: sequence parallelism where tp > 1, optimizer sharding where dp > 1
    (with dp = 1 it is none's configuration, as in ``search grid``)."""
    skip = {"sequence_parallel"} if strategy.tp == 1 else set()
    skip |= {"optimizer_sharding"} if strategy.dp == 1 else set()
    changes = {k: v for k, v in overrides.items() if k in SCALE_FIELDS and k not in skip}
    return strategy.with_(**changes) if changes else strategy


def load_model_and_cluster(names: ModelOptions, costs: CostOptions | None = None) -> tuple[Any, Any]:
    """--model and --cluster (resized by --nodes when given); with the cost options, the model runs the kernels of
    their --framework (its attention: time and memory)."""
    from distsim.io.files import load_cluster, load_model

    model = load_model(names.model_name)
    if costs is not None and costs.framework_name is not None:  # a framework given: its attention kernel
        model = load_framework_for(costs).apply(model)
    cluster = load_cluster(names.cluster_name)
    if names.nodes:
        cluster = cluster.with_nodes(names.nodes)
    return model, cluster


def allreduce_option(f: Any) -> Any:
    """``--allreduce``: the algorithm the analytic costs give an inter-node all-reduce, a name of
    :data:`distsim.core.collectives.ANALYTIC_ALGORITHMS` (each explained)."""
    from distsim.core.collectives import ANALYTIC_ALGORITHMS

    return click.option(
        "--allreduce", type=RegistryChoice(ANALYTIC_ALGORITHMS), default="nccl", show_default=True,
        cls=RegistryHelpOption, registry=ANALYTIC_ALGORITHMS,
        help="Analytic inter-node all-reduce. {summaries}. Measured collectives (--profile) are unaffected.",
    )(f)  # fmt: skip


def framework_option(f: Any) -> Any:
    """``--framework``: a framework preset or file (:mod:`distsim.core.framework`): the attention kernel, the host
    time per kernel, CUDA graphs."""
    from distsim.core.framework import DEFAULT_FRAMEWORK, FRAMEWORKS

    return click.option(
        "--framework", "framework_name", default=None, metavar="NAME|FILE",
        cls=RegistryHelpOption, registry=FRAMEWORKS,
        help="The training framework the run uses: its attention kernel (time and memory), its host time per "
        "kernel, the SMs its communication kernels take from overlapped compute, and Megatron's --tp-comm-overlap, "
        "--overlap-grad-reduce and --overlap-param-gather, for the analytic estimates. A preset ({names}) or a "
        "YAML/JSON file {name, base, attention, host_op_s, host_backward_op_s, cuda_graphs, comm_sms, "
        "tp_comm_overlap, tp_comm_overlap_chunks, overlap_grad_reduce, overlap_param_gather}; `distsim frameworks` "
        "describes the presets. [default: "
        f"{DEFAULT_FRAMEWORK}'s host time and communication SMs, with the attention the model states (flash unless "
        "its spec says attention=...); `search deeppool` and burst plans: deeppool, DeepPool's runtime; "
        "`--framework ideal`: the GPU's launch per kernel only, overlap free]",
    )(f)  # fmt: skip


def load_framework_for(options: CostOptions, default: str | None = None) -> Any:
    """--framework's framework; when not given, `default` (a command's or a plan kind's own runtime) or the default
    preset."""
    from distsim.core.framework import DEFAULT_FRAMEWORK
    from distsim.io.files import load_framework

    return load_framework(options.framework_name or default or DEFAULT_FRAMEWORK)


def load_costs(cluster: Any, profile_path: str | None, strict: bool = False, allreduce: str = "nccl",
               framework: Any = None) -> Any:  # fmt: skip
    """Analytic costs for the cluster (inter-node all-reduce by `allreduce`, a name of
    :data:`distsim.core.collectives.ANALYTIC_ALGORITHMS`; `framework` a :class:`~distsim.core.framework.Framework`,
    default megatron-core), or a profile's measured costs backed by them."""
    from distsim.io.files import load_profile
    from distsim.sim.costs import AnalyticCosts, ProfileCosts

    costs = AnalyticCosts(cluster, allreduce=allreduce, **({"framework": framework} if framework is not None else {}))
    if profile_path:
        return ProfileCosts(load_profile(profile_path), costs, strict=strict)
    if strict:
        raise DistsimError("--strict needs --profile")
    return costs


def load_costs_for(options: CostOptions, cluster: Any, default_framework: str | None = None) -> Any:
    """:func:`load_costs` by the --profile, --strict, --allreduce and --framework options (`default_framework` when
    --framework is not given: :func:`load_framework_for`)."""
    framework = load_framework_for(options, default_framework)
    return load_costs(cluster, options.profile_path, options.strict, options.allreduce, framework)


def check_outputs(outputs: OutputOptions, files: dict[str, str], figures: dict[str, str] | None = None) -> str | None:
    """Check the output options (field of `outputs` -> option name) before any work is done; figures also by format.

    Returns the option that writes to standard output ('-'), if one does: the command's own report then goes to
    stderr. Two outputs on stdout, or one with --json, are refused."""
    from distsim.io.output import check_output, is_stdout

    on_stdout = []
    for key, option in (*files.items(), *(figures or {}).items()):
        check_output(getattr(outputs, key), option, figure=key in (figures or {}))
        if is_stdout(getattr(outputs, key)):
            on_stdout.append(option)
    if outputs.as_json:
        on_stdout.append("--json")
    if len(on_stdout) > 1:
        raise click.UsageError(f"{' and '.join(on_stdout)} would both write to standard output")
    return on_stdout[0] if on_stdout and on_stdout[0] != "--json" else None


def need_torch(command: str) -> Any:
    try:
        import torch
    except ImportError:
        raise DistsimError(f"distsim {command} needs torch: pip install torch==2.13.0 (CPU) or a CUDA build") from None
    return torch


def portable(name: str) -> str:
    """A file by absolute path (rank processes may start elsewhere); a zoo or preset name as it is."""
    import os

    return os.path.abspath(name) if os.path.exists(name) else name


def invoked_command() -> str:
    return "distsim " + " ".join(sys.argv[1:])


def profile_out_name(model: str, cluster: str) -> str:
    """A profile file name for a model on a cluster, in the current directory: ``profile-gpt2-cpu-cpu-2x1.json``."""
    import os

    def slug(name: str) -> str:
        if os.path.exists(name) or name.endswith((".json", ".py", ".yaml", ".yml")):
            name = os.path.splitext(os.path.basename(name))[0]
        return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"

    return f"profile-{slug(model)}-{slug(cluster)}.json"


def strategy_args(strategy: Any) -> list[str]:
    """Options of ``distsim profile`` that give `strategy` exactly: ``--strategy 1M2P1D --micro-batches 8 ...`` where
    those options can say everything, else its readable form (``--strategy 'tp=1 pp=1 dp=2 ... sync=wfbp'``)."""
    from distsim.core.strategy import Strategy

    default = Strategy(strategy.tp, strategy.pp, strategy.dp, strategy.micro_batch_size, strategy.num_micro_batches,
                       strategy.schedule)  # fmt: skip
    if default != strategy:  # a partition, virtual stages, policy, D or wfbp: only the readable form has them
        return ["--strategy", strategy.describe()]
    args = ["--strategy", str(strategy)]
    if strategy.pp > 1:
        args += ["--schedule", strategy.schedule]
    if strategy.num_micro_batches > 1:
        args += ["--micro-batches", str(strategy.num_micro_batches)]
    if strategy.micro_batch_size > 1:
        args += ["--micro-batch-size", str(strategy.micro_batch_size)]
    return args


def profile_command(model: str, cluster: str, strategy: Any, out: str, *, nodes: int | None = None,
                    emulation: dict[str, Any] | None = None, world: int = 1, run_nodes: int = 1,
                    plan_path: str | None = None) -> str:  # fmt: skip
    """The shell command that profiles every event of one plan's `strategy` (or of the plan file `plan_path`: a
    burst plan) on this machine.

    `nodes` overrides the cluster's node count when given. With the `emulation` a run recorded
    (``Emulation.to_dict``), the ranks are launched the same way on this machine; without one, a plan of several ranks
    runs under torchrun (run on each of its `run_nodes` nodes, K = its rank).
    """
    import shlex

    args = ["--model", model, "--cluster", cluster]
    if nodes is not None:
        args += ["--nodes", str(nodes)]
    args += ["--plan", plan_path] if plan_path else strategy_args(strategy)
    if emulation:
        args += ["--emulate-nodes", str(emulation.get("nodes", 1)),
                 "--procs-per-node", str(emulation.get("procs_per_node", 1))]  # fmt: skip
        if emulation.get("link_bandwidth"):
            args += ["--link-bandwidth", str(emulation["link_bandwidth"])]
    args += ["--out", out]
    text = " ".join(shlex.quote(a) for a in args)
    if emulation or world <= 1:
        return f"distsim profile {text}"
    per_node = max(1, world // max(run_nodes, 1))
    return (f"torchrun --nnodes {run_nodes} --nproc-per-node {per_node} --node-rank K --rdzv-endpoint HOST:PORT "
            f"-m distsim profile {text}")  # fmt: skip


class Progress:
    """A progress line on stderr: redrawn in place on a terminal, a line every 10% otherwise."""

    def __init__(self, total: int, what: str, enabled: bool = True, after_s: float = 0.0):
        self.total, self.what, self.enabled, self.after_s = total, what, enabled, after_s
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.next_mark = 0.1
        self.shown = False

    def __call__(self, done: int, total: int, *_: Any) -> None:
        """`after_s`: say nothing until the work has taken that long (quick work stays quiet)."""
        if not self.enabled or total <= 0:
            return
        frac = done / total
        elapsed = time.perf_counter() - self.t0
        if not self.shown and elapsed < self.after_s:
            return
        self.shown = True
        if self.tty:
            bar = "#" * int(30 * frac)
            eta = f", ~{elapsed / frac - elapsed:.0f} s left" if 0 < frac < 1 else ""
            click.echo(f"\r[{bar:<30}] {done}/{total} {self.what} ({elapsed:.1f} s{eta})", nl=False, err=True)
            if done == total:
                click.echo("", err=True)
        elif frac >= self.next_mark or done == total:
            click.echo(f"{done}/{total} {self.what} ({elapsed:.1f} s)", err=True)
            while self.next_mark <= frac:
                self.next_mark += 0.1


TRACE_FORMATS = "*.json: JSON, *.json.gz: gzip-compressed JSON, *.pftrace: Perfetto's protobuf format, ~2x smaller"


def write_trace(path: str, timeline: Any, title: str, expand: bool = False, quiet: bool = False) -> None:
    """Write a Chrome/Perfetto trace (format by name), warning on stderr first if it is too big for Perfetto's UI
    and showing progress when the write takes more than a few seconds."""
    from distsim.io.files import write_chrome_trace

    progress = Progress(0, "trace events written", enabled=not quiet, after_s=3.0)
    write_chrome_trace(path, timeline, title, expand=expand, report=lambda line: click.echo(line, err=True),
                       progress=progress)  # fmt: skip


def load_plan_for(target: TargetOptions) -> tuple[Any, TargetOptions]:
    """Read --plan; the plan's model and cluster fill --model/--cluster/--nodes unless those are given (the target
    returned with the plan)."""
    import os
    from dataclasses import replace

    from distsim.io.files import load_plan

    if target.strategy_text:
        raise click.UsageError("give --strategy or --plan, not both")
    plan = load_plan(target.plan_path)
    base = os.path.dirname(os.path.abspath(target.plan_path))
    filled: dict[str, Any] = {}
    for key, name in (("model_name", plan.model), ("cluster_name", plan.cluster)):
        if not getattr(target, key):
            beside = os.path.join(base, name)  # a file named relative to the plan
            filled[key] = beside if not os.path.exists(name) and os.path.exists(beside) else name
    if not target.nodes and plan.nodes is not None:
        filled["nodes"] = plan.nodes
    return plan, replace(target, **filled)


def parse_type_map(text: str, option: str, cast: type, canonical: bool = True, minimum: int = 0) -> dict[str, Any]:
    """'V100:4,T4:8' -> {'V100': 4, 'T4': 8}: GPU counts (`cast` int, at least `minimum`) or rates (float, positive)
    per GPU type, the types' canonical names (`canonical`; else the names as written, labels of a trace); anything
    else is one line naming the option."""
    from distsim.core.cluster import gpu_type

    example = "V100:4,T4:8" if cast is int else "V100:10.5,T4:3.2"
    out: dict[str, Any] = {}
    for item in (x.strip() for x in text.split(",")):
        name, sep, value = item.partition(":")
        try:
            if not sep or not name.strip():
                raise ValueError
            v = cast(value)
        except ValueError:
            raise DistsimError(f"{option} takes TYPE:{'COUNT' if cast is int else 'RATE'} pairs, e.g. {example}; "
                               f"got {text!r}") from None  # fmt: skip
        key = gpu_type(name)[0] if canonical else name.strip()
        if key in out:
            raise DistsimError(f"{option} names {key} twice: {text!r}")
        if cast is int and v < minimum:
            raise DistsimError(f"{option}: {key} count must be >= {minimum}, got {v}")
        if cast is float and not (math.isfinite(v) and v > 0):
            raise DistsimError(f"{option}: {key} capability must be a positive number of mini-batches/s, got {value}")
        out[key] = v
    return out
