"""``distsim profile`` (measure the distinct events of strategies on real ranks) and ``distsim profile show``."""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import click

from distsim.cli.app import cli
from distsim.cli.common import (
    TIMEOUT_MAX_S,
    FiniteFloatRange,
    RegistryChoice,
    invoked_command,
    load_model_and_cluster,
    need_torch,
    parse_bytes,
    parse_int_list,
    portable,
    scale_options,
    strategy_overrides,
    with_scale_options,
)
from distsim.cli.options import ModelOptions, ProfileArgs, TargetOptions
from distsim.core.errors import DistsimError
from distsim.core.schedules import SCHEDULES
from distsim.io.output import check_output


@cli.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "-m", "model_name", metavar="NAME|FILE", help="Zoo model spec or model file.")
@click.option("--torch-model", metavar="MODULE:FUNCTION", help="Your own torch module instead: FUNCTION() returns "
              "(nn.Module, example micro-batch); its repeated blocks are found and timed, and --out gets its layer "
              "graph for `distsim simulate --model OUT`. MODULE may be path/to/file.py. Its blocks run whole: "
              "tensor parallelism 1 (strategies with tp > 1 are refused), pipeline and data parallelism.")  # fmt: skip
@click.option("--cluster", "-c", "cluster_name", metavar="NAME|FILE",
              help="The cluster the strategies are for (decides group sizes and intra/inter scopes).")  # fmt: skip
@click.option("--nodes", type=click.IntRange(min=1), help="Override the cluster's node count.")
@click.option("--strategy", "-s", "strategies", multiple=True, metavar="xMyPzD",
              help="A strategy whose events to profile (repeatable); --micro-batches etc. apply to each.")  # fmt: skip
@click.option("--plan", "plan_paths", multiple=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="A plan file whose events to profile (repeatable; a burst plan's compute at each shard size, its "
              "re-distributions and per-layer all-reduces); its model and cluster are the defaults.")  # fmt: skip
@click.option("--micro-batches", type=click.IntRange(min=1), help="M for every --strategy.")
@click.option("--micro-batch-size", type=click.IntRange(min=1), help="Micro-batch size for every --strategy.")
@click.option("--schedule", type=RegistryChoice(SCHEDULES), help="Schedule for every --strategy.")
@scale_options
@click.option("--grid-gpus", type=click.IntRange(min=1), help="Profile every strategy a grid over this many GPUs "
              "visits (with --recompute etc. where they apply: sequence parallelism where tp > 1, sharding where "
              "dp > 1).")  # fmt: skip
@click.option("--global-batch", type=click.IntRange(min=1), help="Global batch of the grid (with --grid-gpus).")
@click.option("--micro-batch-sizes", default="1", show_default=True, help="Grid micro-batch sizes, e.g. 1,2,4.")
@click.option("--schedules", default="1f1b", show_default=True, help="Grid schedules, e.g. gpipe,1f1b,interleaved.")
@click.option("--out", "-o", default="profile.json", show_default=True, type=click.Path(dir_okay=False),
              help="Profile database to write; an existing one is extended (see --overwrite).")  # fmt: skip
@click.option("--overwrite", is_flag=True, help="Replace --out instead of extending it.")
@click.option("--emulate-nodes", type=click.IntRange(min=1), help="Launch all ranks on this machine as N nodes.")
@click.option("--procs-per-node", type=click.IntRange(min=1), default=1, show_default=True,
              help="Ranks per emulated node.")  # fmt: skip
@click.option("--link-bandwidth", metavar="RATE", help="As root: shape the link between 2 emulated nodes (tc rate, "
              "e.g. 1gbit); each node gets its own network namespace.")  # fmt: skip
@click.option("--timeout", type=FiniteFloatRange(min=1, max=TIMEOUT_MAX_S), default=1800, show_default=True,
              help="Seconds before a hung run is stopped.")  # fmt: skip
@click.option(
    "--repeats", type=click.IntRange(min=1), default=10, show_default=True, help="Timed runs per compute event."
)
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Untimed runs first.")
@click.option(
    "--comm-repeats", type=click.IntRange(min=1), default=5, show_default=True, help="Timed runs per message."
)
@click.option(
    "--max-comm-bytes", default="16MiB", show_default=True, help="Largest message measured (fits cover more)."
)
@click.option("--max-group", type=click.IntRange(min=2), default=8, show_default=True,
              help="Largest collective group measured (DistSim: 8; larger groups scale by ring volume).")  # fmt: skip
@click.option("--no-compute", is_flag=True, help="Measure communication only.")
@click.option("--no-comm", is_flag=True, help="Measure compute only.")
@click.option(
    "--no-self-check",
    is_flag=True,
    help="Skip timing a short chain of each stage's blocks in situ against their isolated times.",
)
@click.option("--collocation", is_flag=True, help="Also measure how much a background job at lower priority on the "
              "same device slows the foreground (simulate --background's slowdown): on CPU two processes pinned to "
              "one core, the background SCHED_IDLE; on CUDA two streams with priorities (untested). A few seconds; "
              "without --strategy only this is measured.")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Only report the events the strategies contain and need.")
@click.pass_context
def profile(ctx: click.Context, **kw: Any) -> None:
    """Measure every distinct compute and communication event of a model's strategies.

    \b
    On two real nodes (G GPUs each), run on every node:
      torchrun --nnodes 2 --nproc-per-node G --node-rank K --rdzv-endpoint HOST:PORT \\
          -m distsim profile --model gpt2-345m --cluster dgx-a100 --strategy 8M16P8D --out gpt2.json
    On one machine, emulating two nodes joined by a 1 Gbit/s link (root for --link-bandwidth):
      distsim profile --model gpt2-345m:seq=128,precision=fp32 --cluster cpu-2x1 --strategy 1M2P1D \\
          --emulate-nodes 2 --procs-per-node 1 --link-bandwidth 1gbit --out cpu.json
    Your own torch module (a function returning it and an example batch), then its prediction:
      distsim profile --torch-model train.py:make --out mine.json
      distsim simulate --model mine.json --cluster cpu-1x2 --strategy 1M2P1D --micro-batches 4
    Each rank times a fixed reference workload before and after, and warns when the machine was busy or its speed
    moved (the readings are kept in the profile). On GPUs each compute event is timed with the GPU kept fed and L2
    swept, and the host's launch time of the block is recorded too. A self-check then times a short chain of each
    stage's blocks in situ and records isolated / in-situ per event, so the profile states its own bias.
    A recomputed forward is its forward's event (nothing new to measure); sequence parallelism and optimizer sharding
    communicate by reduce-scatter and all-gather, measured and fitted per group like all-reduce.
    `distsim profile show FILE` summarises a profile; `distsim simulate --profile FILE` uses it.
    """
    if ctx.invoked_subcommand is not None:
        return
    args = ProfileArgs.from_params(**kw)
    if args.targets.torch_model:
        from distsim.cli.profile_torch import profile_torch_model

        profile_torch_model(args)
        return

    from distsim.io.files import load_profile
    from distsim.profiler.worker import check_extension
    from distsim.search.discovery import discover
    from distsim.sim.costs import AnalyticCosts

    measure = args.measure
    plans, job = _load_plans(args.job, args.targets.plan_paths)
    if not job.model_name or not job.cluster_name:
        raise click.UsageError("distsim profile needs --model and --cluster (or use `distsim profile show FILE`)")
    if not measure.dry_run:
        check_output(measure.out, "--out", stream_ok=False)
    model, cluster = load_model_and_cluster(job)
    strategies, plans, cluster = _targets(args, model, cluster, plans)
    if not strategies and not plans and not measure.collocation:
        raise DistsimError("give the strategies to profile: --strategy (repeatable), --plan FILE or --grid-gpus with "
                           "--global-batch")  # fmt: skip
    emulation = args.launch.emulation()
    max_comm_bytes = parse_bytes(measure.max_comm_bytes)
    out = measure.out
    existing = None
    if not measure.dry_run and os.path.exists(out) and not measure.overwrite:
        existing = load_profile(out)  # a malformed one is refused before anything is measured
    targets = [*strategies, *plans]
    found = discover(model, cluster, targets, AnalyticCosts(cluster)) if targets else None
    if found is not None:
        click.echo(found.report(), err=True)
    if measure.dry_run:
        return
    if existing is not None:
        click.echo(f"extending {out} ({len(existing.compute)} compute events, {len(existing.comm)} comm measurements; "
                   "--overwrite replaces it)", err=True)  # fmt: skip
    need_torch("profile")
    if existing is not None:
        check_extension(existing, out, emulation, measure.no_comm)
    cfg = _config(args, job, cluster, strategies, plans, max_comm_bytes, emulation)
    if not _measure(cfg, emulation, args.launch.timeout):
        return
    db = load_profile(out)
    if found is not None:
        click.echo(_profile_cost_report(found, db), err=True)


def _load_plans(job: ModelOptions, paths: tuple[str, ...]) -> tuple[list[Any], ModelOptions]:
    """--plan files; the first one's model, cluster and nodes fill in what was not given (the job returned)."""
    from distsim.cli.common import load_plan_for

    plans = []
    for i, path in enumerate(paths):
        given = TargetOptions(model_name=job.model_name, cluster_name=job.cluster_name, nodes=job.nodes, plan_path=path)
        plan, given = load_plan_for(given)  # fills model, cluster and nodes where not given
        plans.append(plan)
        if i == 0:
            job = ModelOptions(model_name=given.model_name, cluster_name=given.cluster_name, nodes=given.nodes)
    return plans, job


def _targets(args: ProfileArgs, model: Any, cluster: Any, plans: list[Any]) -> tuple[list[Any], list[Any], Any]:
    """The strategies to profile (--strategy, the plans that are strategies, a grid's), the other plans (checked),
    and the cluster (resized to --grid-gpus)."""
    from distsim.core.strategy import Strategy
    from distsim.search.space import cluster_for, enumerate_strategies

    targets = args.targets
    overrides, _ = strategy_overrides(args.strategy)
    strategies = [Strategy.from_str(s, **overrides) for s in targets.strategies]
    strategies += [p.strategy for p in plans if p.kind == "uniform"]
    for path, plan in zip(targets.plan_paths, plans, strict=True):  # every plan, before the uniform ones leave
        try:
            plan.check(model.num_layers, cluster.num_gpus)
        except DistsimError as exc:
            raise DistsimError(f"{path}: {exc}") from None
    plans = [p for p in plans if p.kind != "uniform"]
    if targets.grid_gpus:
        if not targets.global_batch:
            raise DistsimError("--grid-gpus needs --global-batch")
        cluster = cluster_for(cluster, targets.grid_gpus)
        grid, _ = enumerate_strategies(model, cluster, targets.grid_gpus, targets.global_batch,
                                       parse_int_list(targets.micro_batch_sizes, "--micro-batch-sizes"),
                                       [x.strip() for x in targets.schedules.split(",") if x.strip()])  # fmt: skip
        strategies += [with_scale_options(s, overrides) for s in grid]
    return strategies, plans, cluster


def _config(args: ProfileArgs, job: ModelOptions, cluster: Any, strategies: list[Any], plans: list[Any],
            max_comm_bytes: int, emulation: Any) -> Any:  # fmt: skip
    """The ranks' configuration (:class:`~distsim.profiler.worker.ProfileConfig`)."""
    from distsim.plans import plan_to_dict
    from distsim.profiler.worker import ProfileConfig

    m, targets = args.measure, [*strategies, *plans]
    return ProfileConfig(
        model=portable(job.model_name),
        cluster=portable(job.cluster_name),
        nodes=cluster.nodes,
        strategies=[st.describe() for st in strategies], out=os.path.abspath(m.out), warmup=m.warmup,
        repeats=m.repeats, comm_repeats=m.comm_repeats, max_comm_bytes=max_comm_bytes,
        max_group=m.max_group, timeout_s=args.launch.timeout, overwrite=m.overwrite,
        compute=not m.no_compute and bool(targets), comm=not m.no_comm and bool(targets),
        self_check=not m.no_self_check, emulation=emulation.to_dict() if emulation else {},
        collocation=m.collocation, command=invoked_command(),
        plans=[{**plan_to_dict(p), "model": portable(job.model_name), "cluster": portable(job.cluster_name)}
               for p in plans],
    )  # fmt: skip


def _measure(cfg: Any, emulation: Any, timeout: float) -> bool:
    """Run the profiler's ranks: this process is one under torchrun (False: the profile is not reported here), else
    one process (compute events only) or the emulated nodes' ranks."""
    from distsim.profiler import worker
    from distsim.profiler.worker import CONFIG_ENV

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: this process is one rank
        worker.run(cfg)
        return False
    if emulation is None:
        worker.run(cfg)  # one process: compute events only
    else:
        from distsim.infra.launch import launch

        launch("distsim.profiler.worker", {CONFIG_ENV: cfg.to_json()}, emulation, timeout, what="profiling")
    return True


def _profile_cost_report(found: Any, db: Any) -> str:
    run = (db.provenance.get("runs") or [{}])[-1]
    return (
        f"profiling cost: the strategies contain {found.events_total:,} per-GPU events "
        f"({found.events_unique} distinct); this run measured {run.get('compute_events', 0)} compute/optimizer "
        f"events and {run.get('comm_measurements', 0)} communication sizes in {run.get('seconds', 0):.0f} s"
    )


@profile.command("show")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the whole database.")
def profile_show(path: str, as_json: bool) -> None:
    """Summarise a profile database: provenance, compute events, communication fits."""
    from distsim.infra.machine_load import describe_load
    from distsim.infra.self_check import describe as describe_self_check
    from distsim.io.files import load_profile

    db = load_profile(path)
    if as_json:
        click.echo(json.dumps(db.to_dict(), indent=1))
        return
    p = db.provenance
    click.echo(f"{path}: {p.get('device', '?')}, backend {p.get('backend', '?')}, torch {p.get('torch', '?')}, "
               f"{p.get('nodes', '?')} node(s) x {p.get('procs_per_node', '?')} rank(s)")  # fmt: skip
    if p.get("emulation"):
        click.echo(f"  emulated on one machine: {p['emulation']}")
    if p.get("note"):
        click.echo(f"  note: {p['note']}")
    for run in p.get("runs", []):
        layout = f"{run.get('nodes', '?')}x{run.get('procs_per_node', '?')} {run.get('backend', '')}".rstrip()
        if (run.get("emulation") or {}).get("link_bandwidth"):
            layout += f", link {run['emulation']['link_bandwidth']}"
        counts = f"{run.get('compute_events')} compute, {run.get('comm_measurements')} comm"
        click.echo(f"  run {run.get('date')} ({layout}): {counts} in {run.get('seconds')} s  {run.get('model', '')}")
        if run.get("load"):
            click.echo(f"    reference workload ({run['load'].get('workload', '?')}), before and after profiling:")
            for line in describe_load(run["load"]):
                click.echo(f"      {line}")
            for message in run["load"].get("warnings", []):
                click.echo(f"    warning: {message}")
    if db.model is not None:
        m = db.model
        click.echo(f"model: {m.get('name', '?')}, {len(m.get('layers', []))} layers ({m.get('description', '')}), "
                   f"micro-batch size {m.get('micro_batch_size', '?')}: simulate --model {path}")  # fmt: skip
    ops: dict[str, int] = {}
    for key in db.compute:
        op = key.split("[", 1)[0].split("/", 1)[0]
        ops[op] = ops.get(op, 0) + 1
    click.echo(f"compute events: {len(db.compute)} (" + ", ".join(f"{n} {op}" for op, n in sorted(ops.items())) + ")")
    click.echo(f"communication: {len(db.comm)} measurements, {len(db.fits)} alpha-beta fits")
    notes: dict[str, set[str]] = {}  # what the backend runs for a collective (gloo's, see profiler.comm.GLOO_NOTES)
    for m in db.comm:
        if m.note:
            notes.setdefault(m.collective, set()).add(m.note)
    fits = sorted(db.fits, key=lambda f: (f.collective, f.scope, f.group_size))
    for collective, group in itertools.groupby(fits, key=lambda f: f.collective):
        for f in group:
            click.echo(f"  {f.collective:<15} {f.scope:<6} x{f.group_size:<3} alpha {f.alpha_s * 1e6:9.1f} us   "
                       f"bandwidth {f.bandwidth_bytes_per_s / 1e9:8.3f} GB/s   ({f.points} sizes)")  # fmt: skip
        for note in sorted(notes.pop(collective, ())):
            click.echo(f"    note: {note}")
    for collective, unfitted in sorted(notes.items()):  # measured at one size only: no fit to list it under
        for note in sorted(unfitted):
            click.echo(f"  note on {collective}: {note}")
    for f in db.compute_fits:
        click.echo(f"optimizer fit {f.family}: {f.alpha_s * 1e3:.3f} ms + {f.beta_s_per_unit * 1e9:.3f} ns/param")
    if db.collocation is not None:
        c = db.collocation
        ran = "" if c.background_busy is None else f"; the background ran {c.background_busy:.0%} of the time"
        click.echo(f"collocation: a background job slows the foreground's compute by {c.slowdown:+.1%} (cycle "
                   f"{c.alone_s * 1e3:.3f} ms alone, {c.collocated_s * 1e3:.3f} ms collocated, kernel "
                   f"{c.compute_s * 1e3:.3f} ms, {c.cycles} cycles each{ran})")  # fmt: skip
        click.echo(f"  measured: {c.method}")
    for i in db.interference:
        click.echo(f"overlap interference {i.scope}: compute {i.compute_slowdown:+.0%} while a "
                   f"{i.bytes / 2**20:.0f} MiB all-reduce runs, the all-reduce {i.comm_slowdown:+.0%}")  # fmt: skip
    launches = [m.launch_s for m in db.compute.values() if m.launch_s is not None]
    if launches:
        mean = sum(launches) / len(launches)
        click.echo(f"host launch time: {len(launches)} compute events take {min(launches) * 1e3:.3f}-"
                   f"{max(launches) * 1e3:.3f} ms to enqueue (mean {mean * 1e3:.3f} ms)")  # fmt: skip
    for line in _describe_host(db.host):
        click.echo(line)
    for line in describe_self_check(p, {k: m.insitu_ratio for k, m in db.compute.items() if m.insitu_ratio}):
        click.echo(line)
    if p.get("not_profiled"):
        click.echo(f"not profiled ({len(p['not_profiled'])}): " + "; ".join(list(p["not_profiled"].values())[:3]))


def _describe_host(host: Any) -> list[str]:
    """The profiling host's speed (a :class:`~distsim.sim.profile_db.HostSpeed`, or None): per eager operator, and
    per kernel of the measured blocks where recorded."""
    if host is None:
        return []
    lines = []
    if host.forward_op_s is not None and host.backward_op_s is not None:
        call = "" if host.backward_call_s is None else f", {host.backward_call_s * 1e6:.1f} us per backward call"
        lines.append(f"host: {host.forward_op_s * 1e6:.1f} us per forward op, {host.backward_op_s * 1e6:.1f} us per "
                     f"backward op{call} ({host.method or 'method not recorded'})")  # fmt: skip
    names = {"F": "forward", "B": "backward"}
    phases = [p for p in ("F", "B") if p in host.per_kernel_s]
    if phases:
        figures = ", ".join(f"{host.per_kernel_s[p] * 1e6:.0f} us {names[p]}" for p in phases)
        counts = " and ".join(f"{host.per_kernel_events.get(p, 0)} {names[p]}" for p in phases)
        lines.append(f"host per kernel (from the measured blocks): {figures} (median of {counts} events)")
    return lines
