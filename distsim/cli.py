"""Command line: ``distsim simulate | models | clusters | schedule | profile | execute | validate | search``.

Mistakes in the input (unknown model, invalid strategy, malformed file, unwritable output) print one line on stderr
and exit with status 2; ``--help`` on every command explains the options with examples.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import click

from distsim.errors import DistsimError

GB = 1e9


def _fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def _fmt_count(n: float) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _parse_stragglers(values: tuple[str, ...]) -> dict[int, float]:
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
    """


@cli.command()
@click.option(
    "--model",
    "-m",
    "model_name",
    metavar="NAME|FILE",
    help="Zoo model (see `distsim models`) or a YAML/JSON model file. [default with --plan: the plan's]",
)
@click.option(
    "--cluster",
    "-c",
    "cluster_name",
    metavar="NAME|FILE",
    help="Cluster preset (see `distsim clusters`) or a YAML/JSON cluster file. [default with --plan: the plan's]",
)
@click.option("--nodes", type=click.IntRange(min=1), help="Override the cluster's node count.")
@click.option(
    "--strategy",
    "-s",
    "strategy_text",
    metavar="xMyPzD",
    help="Degrees in DistSim notation (2M4P2D = tp 2, pp 4, dp 2) or 'tp=2 pp=4 dp=2'.",
)
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="A plan file (YAML/JSON) instead of --strategy: a strategy, or stages with their own layer ranges and "
    "devices (what `distsim search` writes).",
)
@click.option(
    "--micro-batches",
    "micro_batches",
    type=click.IntRange(min=1),
    default=None,
    help="Micro-batches per iteration per replica (M). [default: 1]",
)
@click.option(
    "--micro-batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Samples per micro-batch. [default: 1]",
)
@click.option(
    "--schedule",
    type=click.Choice(["gpipe", "1f1b", "interleaved"]),
    default=None,
    help="Pipeline schedule. [default: 1f1b]",
)
@click.option(
    "--virtual-stages",
    type=click.IntRange(min=2),
    help="Model chunks per rank for --schedule interleaved. [default: 2]",
)
@click.option(
    "--policy",
    type=click.Choice(["A", "B"], case_sensitive=False),
    default=None,
    help="DAPPLE 1F1B warm-up: A, K_i=min(S-i,D); B, K_i=min(2(S-i)-1,D). [default: A]",
)
@click.option("--max-in-flight", type=click.IntRange(min=1), help="DAPPLE's D: most micro-batches a stage holds.")
@click.option(
    "--grad-sync",
    type=click.Choice(["bulk", "wfbp"]),
    default=None,
    help="Gradient all-reduce: bulk after backward (DistSim) or per layer overlapped (WFBP). [default: bulk]",
)
@click.option("--partition", metavar="N:N:...", help="Layers per (virtual) stage, e.g. 23:25. [default: balanced]")
@click.option(
    "--p2p",
    "p2p_mode",
    type=click.Choice(["nonblocking", "blocking"]),
    default="nonblocking",
    show_default=True,
    help="blocking: a send occupies the sender's compute stream (DistSim Algorithm 1).",
)
@click.option(
    "--link-sharing",
    type=click.Choice(["structural", "serialize"]),
    default="structural",
    show_default=True,
    help="structural: traffic kinds overlap, concurrent flows split NICs (optimistic); serialize: all traffic of a "
    "scope on a GPU queues on one link, p2p holding both ends (pessimistic).",
)
@click.option("--rank-order", default="tp,dp,pp", show_default=True, help="Rank placement, innermost first.")
@click.option(
    "--straggler",
    multiple=True,
    metavar="GPU=FACTOR",
    help="Make a GPU's compute FACTOR x slower (repeatable).",
)
@click.option("--full", is_flag=True, help="Simulate every GPU even when replicas are symmetric.")
@click.option("--samples", type=click.IntRange(min=0), default=0, show_default=True,
              help="Stochastic simulation: runs with durations drawn from the profile's repetitions (0: one run "
              "with mean durations).")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --samples.")
@click.option(
    "--profile",
    "profile_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Profile database (JSON) with measured event times. [default: analytic estimates]",
)
@click.option(
    "--strict",
    is_flag=True,
    help="With --profile: fail if an event was not profiled instead of estimating it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of the summary.")
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Write a Chrome/Perfetto trace (JSON).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Write a Gantt chart (PNG/SVG/PDF).",
)
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), metavar="FILE", help="Write the timeline as CSV.")
@click.option(
    "--all-gpus",
    is_flag=True,
    help="Write every GPU's rows to --trace/--csv (default: one row set per group of identical GPUs).",
)
@click.option("--show-schedule", is_flag=True, help="Also print the schedule as a step x rank grid.")
def simulate(**kw: Any) -> None:
    """Simulate one training iteration and summarise it.

    \b
    Example (GPT-2 345M on DistSim's 16-GPU testbed, 1F1B with 8 micro-batches):
      distsim simulate --model gpt2-345m --cluster distsim-testbed --strategy 2M4P2D \\
          --micro-batches 8 --schedule 1f1b --trace gpt2.json --plot gpt2.png
    A plan written by `distsim search` (stages may differ in layers and replicas):
      distsim simulate --plan dapple.plan.yaml --plot dapple.png
    Open the trace in https://ui.perfetto.dev (one process per GPU, one thread per stream).
    """
    from distsim.costs import AnalyticCosts, ProfileCosts
    from distsim.events import FlowOptions
    from distsim.io import load_cluster, load_model, load_profile
    from distsim.simulate import simulate as run_simulation
    from distsim.strategy import Strategy

    plan = None
    if kw["plan_path"]:
        plan = _load_plan_for(kw)
    elif not kw["strategy_text"]:
        raise click.UsageError("give --strategy (e.g. 2M4P2D) or --plan FILE")
    if not kw["model_name"] or not kw["cluster_name"]:
        raise click.UsageError("give --model and --cluster (or a --plan that names them)")
    model = load_model(kw["model_name"])
    cluster = load_cluster(kw["cluster_name"])
    if kw["nodes"]:
        cluster = cluster.with_nodes(kw["nodes"])
    if kw["straggler"]:
        cluster = cluster.with_slowdown(_parse_stragglers(kw["straggler"]))
    overrides: dict[str, Any] = {}
    given: list[str] = []
    for opt, field_name in (
        ("micro_batches", "num_micro_batches"),
        ("micro_batch_size", "micro_batch_size"),
        ("schedule", "schedule"),
        ("virtual_stages", "virtual_stages"),
        ("policy", "warmup_policy"),
        ("max_in_flight", "max_in_flight"),
        ("grad_sync", "grad_sync"),
    ):
        if kw[opt] is not None:
            overrides[field_name] = kw[opt]
            given.append("--" + opt.replace("_", "-"))
    if kw["partition"]:
        try:
            overrides["partition"] = tuple(int(x) for x in kw["partition"].replace("/", ":").split(":"))
        except ValueError:
            raise DistsimError(f"--partition expects layer counts like 23:25, got {kw['partition']!r}") from None
    if plan is not None and (given or kw["partition"]):
        raise DistsimError(f"{(given or ['--partition'])[0]} does not apply to --plan; edit the plan file")
    target = plan if plan is not None else Strategy.from_str(kw["strategy_text"], **overrides)
    strategy = target.pipeline_strategy() if plan is not None else target
    costs: AnalyticCosts | ProfileCosts = AnalyticCosts(cluster)
    if kw["profile_path"]:
        costs = ProfileCosts(load_profile(kw["profile_path"]), costs, strict=kw["strict"])
    elif kw["strict"]:
        raise DistsimError("--strict needs --profile")
    options = FlowOptions(
        p2p_blocking=kw["p2p_mode"] == "blocking",
        symmetric=False if kw["full"] else None,
        rank_order=kw["rank_order"],
        link_sharing=kw["link_sharing"],
    )
    if strategy.pp > 1 and strategy.num_micro_batches < strategy.pp and not kw["as_json"]:
        click.echo(
            f"note: {strategy.num_micro_batches} micro-batch(es) for {strategy.pp} pipeline stages leaves most "
            "of the pipeline idle; pass --micro-batches",
            err=True,
        )
    try:
        result = run_simulation(model, cluster, target, costs, options, samples=kw["samples"], seed=kw["seed"])
    except DistsimError as exc:
        if plan is None:
            raise
        raise type(exc)(f"{kw['plan_path']}: {exc}") from None
    _write_outputs(result, kw)
    provenance = costs.db.provenance if isinstance(costs, ProfileCosts) else None
    if kw["as_json"]:
        data = result.to_dict()
        if provenance is not None:
            data["profile"] = {"path": kw["profile_path"], "provenance": provenance}
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(_summary(result))
    if provenance is not None:
        what = ", ".join(f"{k} {provenance[k]}" for k in ("device", "backend", "torch", "date") if k in provenance)
        click.echo(f"profile: {kw['profile_path']} ({what or 'no provenance recorded'})")
    if kw["show_schedule"]:
        from distsim.schedules import format_grid

        click.echo("\nschedule (unit time, F and B one step each):\n" + format_grid(result.flow.schedule))


def _load_plan_for(kw: dict[str, Any]) -> Any:
    """Read --plan; the plan's model and cluster fill --model/--cluster/--nodes unless those are given."""
    import os

    from distsim.io import load_plan

    if kw["strategy_text"]:
        raise click.UsageError("give --strategy or --plan, not both")
    plan = load_plan(kw["plan_path"])
    base = os.path.dirname(os.path.abspath(kw["plan_path"]))
    for key, name in (("model_name", plan.model), ("cluster_name", plan.cluster)):
        if not kw[key]:
            beside = os.path.join(base, name)  # a file named relative to the plan
            kw[key] = beside if not os.path.exists(name) and os.path.exists(beside) else name
    if not kw["nodes"] and plan.nodes is not None:
        kw["nodes"] = plan.nodes
    return plan


def _write_outputs(result: Any, kw: dict[str, Any]) -> None:
    from distsim.io import write_chrome_trace, write_csv, write_figure

    if not (kw["trace_path"] or kw["csv_path"] or kw["plot_path"]):
        return
    if kw["all_gpus"] and result.events_total > 1_000_000 and (kw["trace_path"] or kw["csv_path"]):
        click.echo(
            f"writing {result.events_total:,} events for every GPU; this takes a while "
            "(drop --all-gpus for one row set per group of identical GPUs)",
            err=True,
        )
    timeline = result.full_timeline() if kw["all_gpus"] else result.timeline
    title = f"{result.model.name} {result.label} on {result.cluster.name}"
    if kw["trace_path"]:
        write_chrome_trace(kw["trace_path"], timeline.chrome_trace_events(), title)
    if kw["csv_path"]:
        write_csv(kw["csv_path"], timeline.df)
    if kw["plot_path"]:
        from distsim.plots import gantt

        ax = gantt(result.timeline, title=f"{title}: {_fmt_time(result.iteration_time_s)} per iteration")
        write_figure(kw["plot_path"], ax.figure)


def _summary(r: Any) -> str:
    s, m, c = r.strategy, r.model, r.cluster
    if r.plan is not None:
        p = r.plan
        what = (f"plan {p.notation()} ({len(p.stages)} stages on {r.num_gpus} GPUs; {p.micro_batches} micro-batches "
                f"of {p.micro_batch_size} samples split over each stage's replicas; {p.schedule})")  # fmt: skip
    else:
        what = f"strategy {s} ({s.describe()})"
    lines = [
        f"{m.name} on {c.name} ({c.describe()})",
        f"{what}, global batch {r.global_batch_size}",
        "",
        f"  iteration time     {_fmt_time(r.iteration_time_s)}",
    ]
    if r.sampled_iteration_s:
        import numpy as np

        p10, p90 = np.percentile(r.sampled_iteration_s, [10, 90])
        lines[-1] += (f" (median of {len(r.sampled_iteration_s)} stochastic runs; p10 {_fmt_time(p10)}, "
                      f"p90 {_fmt_time(p90)})")  # fmt: skip
    tput = f"{r.throughput_samples_per_s:,.1f} samples/s"
    if r.throughput_tokens_per_s is not None:
        tput += f", {r.throughput_tokens_per_s:,.0f} tokens/s"
    lines.append(f"  throughput         {tput}")
    lines.append(f"  bubble fraction    {100 * r.bubble_fraction:.1f} % (mean idle share of the iteration)")
    lines.append(f"  exposed comm       {_fmt_time(r.exposed_comm_s)} per GPU (mean)")
    worst = max(r.memory, key=lambda x: x.total_bytes)
    verdict = "fits" if r.fits_in_memory else "OUT OF MEMORY"
    states = worst.params_bytes + worst.grads_bytes + worst.optimizer_bytes
    lines.append(
        f"  peak memory        {worst.total_bytes / GB:.2f} GB of {c.gpu.memory_bytes / GB:.0f} GB "
        f"on rank {worst.rank} ({verdict}; states {states / GB:.2f} GB, "
        f"activations {worst.activations_bytes / GB:.2f} GB for {worst.in_flight_microbatches:g} micro-batches)"
    )
    sim = len(r.flow.represents)
    mode = "symmetric" if r.flow.symmetric else "full"
    lines.append(
        f"  events             {r.events_total:,} across {r.num_gpus} GPUs, {r.events_unique} unique "
        f"({len(r.flow):,} tasks simulated on {sim} GPU{'s' if sim > 1 else ''}, {mode})"
    )
    counts = r.source_counts()
    lines.append(
        "  event costs        "
        + ", ".join(f"{n} {src}" for src, n in sorted(counts.items()))
        + ("" if r.cost_source == "profile" else " (no --profile: analytic estimates)")
    )
    if "analytic" in counts and r.cost_source == "profile":
        missing = [k for k, c in zip(r.flow.keys, r.flow.key_costs, strict=True) if c.source == "analytic"]
        lines.append(f"  note               {len(missing)} events were not in the profile and were estimated "
                     "analytically (--strict refuses):")  # fmt: skip
        lines += [f"                       {k}" for k in missing[:6]]
        if len(missing) > 6:
            lines.append(f"                       ... and {len(missing) - 6} more (--json lists all)")
    lines.append("  layers per stage   " + ":".join(str(e - b) for b, e in r.flow.stage_ranges))
    lines.append("")
    lines.append("  per GPU                compute    exposed comm   idle")
    stats = {g.gpu: g for g in r.per_gpu}
    rows: list[tuple[list[int], int, str]] = []  # consecutive simulated GPUs with equal figures share a row
    for rep, targets in sorted(r.timeline.represents.items()):
        g = stats[rep]
        figures = f"{_fmt_time(g.compute_s):>10} {_fmt_time(g.exposed_comm_s):>14} {_fmt_time(g.idle_s):>10}"
        if rows and rows[-1][2] == figures and rows[-1][0][-1] == rep - 1 and len(targets) == 1 == rows[-1][1]:
            rows[-1][0].append(rep)
        else:
            rows.append(([rep], len(targets), figures))
    for gpus, alike, figures in rows:
        who = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {gpus[0]}-{gpus[-1]}"
        if alike > 1:
            who += f" (+{alike - 1} alike)"
        lines.append(f"  {who:<22} {figures}")
    lines.append(f"\nsimulated in {r.wall_time_s:.3f} s")
    return "\n".join(lines)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def models(as_json: bool) -> None:
    """List the built-in workloads with their size and source."""
    from distsim.models import ZOO

    rows = []
    for name, entry in ZOO.items():
        m = entry.build()
        rows.append(
            {
                "name": name,
                "family": entry.family,
                "layers": m.num_layers,
                "params": m.params,
                "description": m.description,
                "source": m.source,
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'name':<14} {'family':<30} {'layers':>6} {'params':>9}  description")
    for r in rows:
        params = _fmt_count(r["params"])
        click.echo(f"{r['name']:<14} {r['family']:<30} {r['layers']:>6} {params:>9}  {r['description']}")
    click.echo("\nSources: `distsim models --json`. Your own model: a YAML/JSON file (see README).")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def clusters(as_json: bool) -> None:
    """List the built-in clusters with their figures and sources."""
    from distsim.cluster import PRESETS

    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "name": n,
                        "nodes": c.nodes,
                        "gpus_per_node": c.gpus_per_node,
                        "gpu": c.gpu.name,
                        "peak_flops_per_s": c.gpu.peak_flops_per_s,
                        "memory_bytes": c.gpu.memory_bytes,
                        "intra_bandwidth_bytes_per_s": c.intra.bandwidth_bytes_per_s,
                        "inter_bandwidth_bytes_per_s": c.inter.bandwidth_bytes_per_s,
                        "nics_per_node": c.nics_per_node,
                        "source": c.source,
                    }
                    for n, c in PRESETS.items()
                ],
                indent=2,
            )
        )
        return
    for name, c in PRESETS.items():
        click.echo(f"{name:<16} {c.describe()}\n{'':<16} source: {c.source}")


@cli.command()
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved"]), default="1f1b", show_default=True)
@click.option("--pp", type=click.IntRange(min=1), required=True, help="Pipeline ranks.")
@click.option("--micro-batches", type=click.IntRange(min=1), required=True)
@click.option("--virtual-stages", type=click.IntRange(min=2), help="Chunks per rank (interleaved).")
@click.option("--policy", type=click.Choice(["A", "B"], case_sensitive=False), default="A", show_default=True)
@click.option("--max-in-flight", type=click.IntRange(min=1))
def schedule(**kw: Any) -> None:
    """Print a pipeline schedule's action lists and its step x rank grid (unit-time F and B)."""
    from distsim.schedules import build_schedule, format_grid
    from distsim.strategy import Strategy

    strategy = Strategy(
        pp=kw["pp"],
        num_micro_batches=kw["micro_batches"],
        schedule=kw["schedule"],
        virtual_stages=kw["virtual_stages"],
        warmup_policy=kw["policy"],
        max_in_flight=kw["max_in_flight"],
    )
    sched = build_schedule(strategy)
    click.echo(str(sched))
    click.echo("")
    click.echo(format_grid(sched))


def _parse_int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DistsimError(f"{option} takes comma-separated integers, e.g. 1,2,4; got {text!r}") from None
    if not values or min(values) < 1:
        raise DistsimError(f"{option} takes positive integers, got {text!r}")
    return values


def _parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]i?b?|b)?\s*", text.lower())
    if not m:
        raise DistsimError(f"--max-comm-bytes takes a size like 16MiB or 4194304, got {text!r}")
    unit = (m.group(2) or "b").rstrip("b") or "b"
    scale = {"b": 1, "k": 1e3, "ki": 2**10, "m": 1e6, "mi": 2**20, "g": 1e9, "gi": 2**30}[unit]
    return int(float(m.group(1)) * scale)


@cli.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "-m", "model_name", metavar="NAME|FILE", help="Zoo model spec or model file.")
@click.option("--cluster", "-c", "cluster_name", metavar="NAME|FILE",
              help="The cluster the strategies are for (decides group sizes and intra/inter scopes).")  # fmt: skip
@click.option("--nodes", type=click.IntRange(min=1), help="Override the cluster's node count.")
@click.option("--strategy", "-s", "strategies", multiple=True, metavar="xMyPzD",
              help="A strategy whose events to profile (repeatable); --micro-batches etc. apply to each.")  # fmt: skip
@click.option("--micro-batches", type=click.IntRange(min=1), help="M for every --strategy.")
@click.option("--micro-batch-size", type=click.IntRange(min=1), help="Micro-batch size for every --strategy.")
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved"]), help="Schedule for every --strategy.")
@click.option(
    "--grid-gpus", type=click.IntRange(min=1), help="Profile every strategy a grid over this many GPUs visits."
)
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
@click.option("--timeout", type=click.FloatRange(min=1), default=1800, show_default=True,
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
    `distsim profile show FILE` summarises a profile; `distsim simulate --profile FILE` uses it.
    """
    if ctx.invoked_subcommand is not None:
        return
    import os

    from distsim.costs import AnalyticCosts
    from distsim.discovery import discover
    from distsim.io import load_cluster, load_model, load_profile
    from distsim.launch import Emulation
    from distsim.profiler.worker import CONFIG_ENV, ProfileConfig
    from distsim.search.space import cluster_for, enumerate_strategies
    from distsim.strategy import Strategy

    if not kw["model_name"] or not kw["cluster_name"]:
        raise click.UsageError("distsim profile needs --model and --cluster (or use `distsim profile show FILE`)")
    model, cluster = load_model(kw["model_name"]), load_cluster(kw["cluster_name"])
    if kw["nodes"]:
        cluster = cluster.with_nodes(kw["nodes"])
    overrides = {
        k: v
        for k, v in (
            ("num_micro_batches", kw["micro_batches"]),
            ("micro_batch_size", kw["micro_batch_size"]),
            ("schedule", kw["schedule"]),
        )
        if v
    }
    strategies = [Strategy.from_str(s, **overrides) for s in kw["strategies"]]
    if kw["grid_gpus"]:
        if not kw["global_batch"]:
            raise DistsimError("--grid-gpus needs --global-batch")
        cluster = cluster_for(cluster, kw["grid_gpus"])
        grid, _ = enumerate_strategies(model, cluster, kw["grid_gpus"], kw["global_batch"],
                                       _parse_int_list(kw["micro_batch_sizes"], "--micro-batch-sizes"),
                                       [x.strip() for x in kw["schedules"].split(",") if x.strip()])  # fmt: skip
        strategies += grid
    if not strategies:
        raise DistsimError("give the strategies to profile: --strategy (repeatable) or --grid-gpus with --global-batch")
    found = discover(model, cluster, strategies, AnalyticCosts(cluster))
    click.echo(found.report(), err=True)
    if kw["dry_run"]:
        return
    out = kw["out"]
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise DistsimError(f"{out}: cannot write there (directory {directory} missing or not writable)")
    existing = load_profile(out) if os.path.exists(out) and not kw["overwrite"] else None
    if existing is not None:
        click.echo(f"extending {out} ({len(existing.compute)} compute events, {len(existing.comm)} comm measurements; "
                   "--overwrite replaces it)", err=True)  # fmt: skip
    try:
        import torch
    except ImportError:
        raise DistsimError("distsim profile needs torch: pip install torch==2.13.0 (CPU) or a CUDA build") from None
    emulation = (
        Emulation(kw["emulate_nodes"], kw["procs_per_node"], kw["link_bandwidth"]) if kw["emulate_nodes"] else None
    )
    if kw["link_bandwidth"] and emulation is None:
        raise DistsimError("--link-bandwidth shapes emulated nodes: add --emulate-nodes 2")
    if existing is not None:
        from distsim.profiler.compute import device_name
        from distsim.profiler.worker import usable_cores

        world = emulation.world if emulation else int(os.environ.get("WORLD_SIZE", 1))
        local = emulation.procs_per_node if emulation else int(os.environ.get("LOCAL_WORLD_SIZE", world))
        cuda = torch.cuda.is_available()
        planned = {
            "device": device_name(torch.device("cuda:0" if cuda else "cpu")),
            "threads_per_rank": None if cuda else (1 if emulation else max(1, usable_cores() // local)),
            "backend": ("nccl" if cuda else "gloo") if world > 1 and not kw["no_comm"] else "none",
        }
        problem = existing.incompatibility(planned)
        if problem:
            raise DistsimError(f"cannot extend {out}: {problem} (use the same launch options, or --overwrite)")

    def portable(name: str) -> str:  # ranks may start elsewhere: files by absolute path
        return os.path.abspath(name) if os.path.exists(name) else name

    cfg = ProfileConfig(
        model=portable(kw["model_name"]),
        cluster=portable(kw["cluster_name"]),
        nodes=cluster.nodes,
        strategies=[st.describe() for st in strategies], out=os.path.abspath(out), warmup=kw["warmup"],
        repeats=kw["repeats"], comm_repeats=kw["comm_repeats"], max_comm_bytes=_parse_bytes(kw["max_comm_bytes"]),
        max_group=kw["max_group"], timeout_s=kw["timeout"], overwrite=kw["overwrite"], compute=not kw["no_compute"],
        comm=not kw["no_comm"], emulation=emulation.to_dict() if emulation else {},
        command="distsim profile " + " ".join(sys.argv[2:] if len(sys.argv) > 2 else []),
    )  # fmt: skip
    from distsim.profiler import worker

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: this process is one rank
        worker.run(cfg)
        return
    if emulation is None:
        worker.run(cfg)  # one process: compute events only
    else:
        from distsim.launch import launch

        launch("distsim.profiler.worker", {CONFIG_ENV: cfg.to_json()}, emulation, kw["timeout"], what="profiling")
    db = load_profile(out)
    click.echo(_profile_cost_report(found, db), err=True)


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
    from distsim.io import load_profile

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
    ops: dict[str, int] = {}
    for key in db.compute:
        op = key.split("[", 1)[0].split("/", 1)[0]
        ops[op] = ops.get(op, 0) + 1
    click.echo(f"compute events: {len(db.compute)} (" + ", ".join(f"{n} {op}" for op, n in sorted(ops.items())) + ")")
    click.echo(f"communication: {len(db.comm)} measurements, {len(db.fits)} alpha-beta fits")
    for f in db.fits:
        click.echo(f"  {f.collective:<15} {f.scope:<6} x{f.group_size:<3} alpha {f.alpha_s * 1e6:9.1f} us   "
                   f"bandwidth {f.bandwidth_bytes_per_s / 1e9:8.3f} GB/s   ({f.points} sizes)")  # fmt: skip
    notes = sorted({m.note for m in db.comm if m.note})
    for note in notes:
        click.echo(f"  note: {note}")
    for f in db.compute_fits:
        click.echo(f"optimizer fit {f.family}: {f.alpha_s * 1e3:.3f} ms + {f.beta_s_per_unit * 1e9:.3f} ns/param")
    for i in db.interference:
        click.echo(f"overlap interference {i.scope}: compute {i.compute_slowdown:+.0%} while a "
                   f"{i.bytes / 2**20:.0f} MiB all-reduce runs, the all-reduce {i.comm_slowdown:+.0%}")  # fmt: skip
    if p.get("not_profiled"):
        click.echo(f"not profiled ({len(p['not_profiled'])}): " + "; ".join(list(p["not_profiled"].values())[:3]))


@cli.command()
@click.option("--model", "-m", "model_name", required=True, metavar="NAME|FILE", help="Zoo model spec or model file.")
@click.option("--cluster", "-c", "cluster_name", required=True, metavar="NAME|FILE",
              help="The cluster the plan is for (cpu-1x2, cpu-2x1 on this machine).")  # fmt: skip
@click.option("--nodes", type=click.IntRange(min=1), help="Override the cluster's node count.")
@click.option("--strategy", "-s", "strategy_text", required=True, metavar="xMyPzD", help="As for `distsim simulate`.")
@click.option("--micro-batches", type=click.IntRange(min=1), help="M. [default: 1]")
@click.option("--micro-batch-size", type=click.IntRange(min=1), help="[default: 1]")
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved"]), help="[default: 1f1b]")
@click.option("--virtual-stages", type=click.IntRange(min=2), help="Chunks per rank (interleaved).")
@click.option("--policy", type=click.Choice(["A", "B"], case_sensitive=False), help="DAPPLE warm-up policy.")
@click.option("--grad-sync", type=click.Choice(["bulk", "wfbp"]), help="bulk or per-layer overlapped. [default: bulk]")
@click.option("--partition", metavar="N:N:...", help="Layers per stage. [default: the simulator's balanced partition]")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Balance the partition with these measured costs (as simulate --profile would).")  # fmt: skip
@click.option("--p2p", "p2p_mode", type=click.Choice(["nonblocking", "blocking"]), default="nonblocking",
              show_default=True, help="isend, or a blocking send on the compute stream.")  # fmt: skip
@click.option("--iterations", type=click.IntRange(min=1), default=5, show_default=True, help="Measured iterations.")
@click.option(
    "--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Iterations run first, unrecorded."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the weights and the synthetic data.")
@click.option("--out", "-o", default="trace.json", show_default=True, type=click.Path(dir_okay=False),
              help="Trace to write (with a Chrome trace of the median iteration, *.chrome.json).")  # fmt: skip
@click.option("--emulate-nodes", type=click.IntRange(min=1), help="Launch all ranks on this machine as N nodes.")
@click.option("--procs-per-node", type=click.IntRange(min=1), default=1, show_default=True, help="Ranks per node.")
@click.option("--link-bandwidth", metavar="RATE", help="As root: shape the link between 2 emulated nodes (1gbit).")
@click.option("--timeout", type=click.FloatRange(min=1), default=900, show_default=True,
              help="Seconds before a hung run is stopped.")  # fmt: skip
@click.option("--check", type=click.Path(dir_okay=False), hidden=True, help="Write iteration 0's loss and gradients.")
def execute(**kw: Any) -> None:
    """Run a plan for real with torch.distributed and record its per-GPU timeline.

    \b
    Two emulated nodes on this machine, pipeline 1F1B with 4 micro-batches:
      distsim execute --model gpt2-cpu --cluster cpu-2x1 --strategy 1M2P1D --schedule 1f1b --micro-batches 4 \\
          --profile profiles/cpu-gloo.json --emulate-nodes 2 --procs-per-node 1 --link-bandwidth 1gbit \\
          --out traces/gpt2.json
    On real nodes run it under torchrun (as `distsim profile`). Then: distsim validate --trace traces/gpt2.json
    """
    import os

    from distsim.costs import AnalyticCosts, ProfileCosts
    from distsim.events import resolve_partition
    from distsim.executor.worker import CONFIG_ENV, ExecuteConfig
    from distsim.io import load_cluster, load_model, load_profile
    from distsim.launch import Emulation
    from distsim.strategy import Strategy, check_strategy

    model, cluster = load_model(kw["model_name"]), load_cluster(kw["cluster_name"])
    if kw["nodes"]:
        cluster = cluster.with_nodes(kw["nodes"])
    overrides: dict[str, Any] = {}
    for opt, field_name in (("micro_batches", "num_micro_batches"), ("micro_batch_size", "micro_batch_size"),
                            ("schedule", "schedule"), ("virtual_stages", "virtual_stages"), ("policy", "warmup_policy"),
                            ("grad_sync", "grad_sync")):  # fmt: skip
        if kw[opt] is not None:
            overrides[field_name] = kw[opt]
    if kw["partition"]:
        overrides["partition"] = tuple(_parse_int_list(kw["partition"].replace(":", ","), "--partition"))
    strategy = Strategy.from_str(kw["strategy_text"], **overrides)
    check_strategy(strategy, model, cluster)
    if strategy.partition is None:
        costs: Any = AnalyticCosts(cluster)
        if kw["profile_path"]:
            costs = ProfileCosts(load_profile(kw["profile_path"]), costs)
        counts = tuple(e - s for s, e in resolve_partition(model, strategy, costs))
        strategy = strategy.with_(partition=counts)
    out = kw["out"]
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise DistsimError(f"{out}: cannot write there (directory {directory} missing or not writable)")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise DistsimError("distsim execute needs torch: pip install torch==2.13.0 (CPU) or a CUDA build") from None
    emulation = (
        Emulation(kw["emulate_nodes"], kw["procs_per_node"], kw["link_bandwidth"]) if kw["emulate_nodes"] else None
    )
    if kw["link_bandwidth"] and emulation is None:
        raise DistsimError("--link-bandwidth shapes emulated nodes: add --emulate-nodes 2")
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    ranks = emulation.world if emulation else (int(os.environ["WORLD_SIZE"]) if torchrun else 1)
    if ranks != strategy.num_gpus:
        raise DistsimError(f"{strategy} needs {strategy.num_gpus} ranks but this launch starts {ranks} "
                           "(--emulate-nodes x --procs-per-node, or torchrun's world size)")  # fmt: skip

    def portable(name: str) -> str:
        return os.path.abspath(name) if os.path.exists(name) else name

    cfg = ExecuteConfig(
        model=portable(kw["model_name"]), cluster=portable(kw["cluster_name"]), nodes=cluster.nodes,
        strategy=strategy.describe(), out=os.path.abspath(out), p2p_blocking=kw["p2p_mode"] == "blocking",
        iterations=kw["iterations"], warmup=kw["warmup"], seed=kw["seed"],
        check=os.path.abspath(kw["check"]) if kw["check"] else None, timeout_s=kw["timeout"],
        profile=os.path.relpath(os.path.abspath(kw["profile_path"]), os.path.dirname(os.path.abspath(out)))
        if kw["profile_path"] else None,  # relative to the trace, so that traces and profiles move together
        emulation=emulation.to_dict() if emulation else {},
        command="distsim execute " + " ".join(sys.argv[2:] if len(sys.argv) > 2 else []),
    )  # fmt: skip
    click.echo(f"executing {model.name} {strategy.describe()} on {cluster.name}", err=True)
    from distsim.executor import worker

    if torchrun or emulation is None:
        worker.run(cfg)
    else:
        from distsim.launch import launch

        launch("distsim.executor.worker", {CONFIG_ENV: cfg.to_json()}, emulation, kw["timeout"], what="execution")


def _validate_one(path: str, profile_path: str | None, samples: int = 64) -> tuple[Any, Any, Any]:
    """Simulate a trace's plan (with the profile's measured costs, strictly) and compare it with the trace."""
    from distsim.costs import AnalyticCosts, ProfileCosts
    from distsim.errors import ProfileError
    from distsim.events import FlowOptions
    from distsim.io import load_cluster, load_model, load_profile, load_trace
    from distsim.simulate import simulate
    from distsim.strategy import Strategy
    from distsim.trace import TraceError
    from distsim.validate import validate_timelines

    trace = load_trace(path)
    plan = trace.plan
    if not profile_path and plan.get("profile"):  # by default the profile the run was planned with
        import os

        profile_path = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), plan["profile"]))
    model = load_model(plan["model"])
    cluster = load_cluster(plan["cluster"]).with_nodes(int(plan["nodes"]))
    strategy = Strategy.from_str(plan["strategy"])
    costs: Any = AnalyticCosts(cluster)
    if profile_path:
        db = load_profile(profile_path)
        measured_on, profiled_on = trace.provenance.get("device"), db.provenance.get("device")
        if measured_on and profiled_on and measured_on != profiled_on:
            raise TraceError(f"{path} was measured on {measured_on!r} but {profile_path} on {profiled_on!r}")
        costs = ProfileCosts(db, costs, strict=True)
    options = FlowOptions(p2p_blocking=bool(plan["p2p_blocking"]))
    try:
        result = simulate(model, cluster, strategy, costs, options, samples=samples)
        mean_durations = simulate(model, cluster, strategy, costs, options) if samples else result
    except ProfileError as exc:
        raise TraceError(f"{profile_path} does not cover the plan of {path} (model {plan['model']}): {exc}") from None
    measured = [trace.timeline(i, cluster.gpus_per_node) for i in range(len(trace.iterations))]
    val = validate_timelines(result.timeline, measured, result.iteration_time_s)
    val.deterministic_s = mean_durations.iteration_time_s
    return trace, result, val


@cli.command()
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="A trace written by `distsim execute`.")  # fmt: skip
@click.option(
    "--profile", "profile_path", type=click.Path(dir_okay=False), metavar="FILE",
    help="Measured costs to predict with (strict: every event must be in it). "
    "[default: the profile the trace was planned with, else analytic]",
)  # fmt: skip
@click.option("--suite", "suite_dir", is_flag=False, flag_value="traces", default=None, metavar="[DIR]",
              help="Validate every trace in DIR (default traces/) and print the table.")  # fmt: skip
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write predicted and measured timelines side by side (one trace).")  # fmt: skip
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), metavar="FILE", help="Write the suite table.")
@click.option("--samples", type=click.IntRange(min=0), default=64, show_default=True,
              help="Stochastic runs of the prediction (0: mean durations only).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def validate(trace_path: str | None, profile_path: str | None, suite_dir: str | None, plot_path: str | None,
             csv_path: str | None, samples: int, as_json: bool) -> None:  # fmt: skip
    """Compare a prediction with a measured run: batch time, per-GPU activity and per-stage errors (DistSim Sec. 5).

    \b
    One trace:   distsim validate --trace traces/gpt2-cpu-2x1-1M2P1D-1f1b-M4.json --profile profiles/cpu-gloo.json
    All traces:  distsim validate --suite traces --profile profiles/cpu-gloo.json
    """
    if (trace_path is None) == (suite_dir is None):
        raise click.UsageError("give --trace FILE or --suite [DIR]")
    if trace_path:
        trace, result, val = _validate_one(trace_path, profile_path, samples)
        if plot_path:
            from distsim.io import write_figure
            from distsim.plots import compare_gantt

            median = trace.timeline(trace.median_index(), result.cluster.gpus_per_node)
            title = f"{result.model.name} {result.strategy.describe()} on {result.cluster.name}"
            write_figure(plot_path, compare_gantt(result.timeline.expand(), median, title))
        if as_json:
            click.echo(json.dumps({"trace": trace_path, **val.to_dict()}, indent=2))
            return
        click.echo(f"{trace_path}: {result.model.name} {result.strategy.describe()} on {result.cluster.name}")
        click.echo(f"  predicted {val.predicted_s * 1e3:.1f} ms, measured {val.measured_s * 1e3:.1f} ms (median of "
                   f"{len(val.iteration_times_s)} iterations, spread {100 * val.measured_spread:.1f} %)")  # fmt: skip
        click.echo(
            f"  batch-time error      {100 * val.batch_error:.2f} %"
            + (
                f" (with mean durations instead of {samples} stochastic runs: "
                f"{100 * abs(val.deterministic_s - val.measured_s) / val.measured_s:.2f} %)"
                if samples
                else ""
            )
        )
        click.echo(
            "  per-GPU activity      " + ", ".join(f"GPU {g} {100 * e:.2f} %" for g, e in val.per_gpu_error.items())
        )
        click.echo(f"  per-stage (median)    {100 * val.stage_error_median:.2f} % over "
                   f"{len(val.per_stage)} (stage, F/B, micro-batch) actions")  # fmt: skip
        return
    _validate_suite(suite_dir or "traces", profile_path, csv_path, as_json, samples)


def _validate_suite(directory: str, profile_path: str | None, csv_path: str | None, as_json: bool,
                    samples: int) -> None:  # fmt: skip
    import glob
    import os
    import statistics

    import pandas as pd

    from distsim.strategy import Strategy

    paths = sorted(p for p in glob.glob(os.path.join(directory, "*.json")) if not p.endswith(".chrome.json"))
    if not paths:
        raise DistsimError(f"no traces (*.json) in {directory}")
    rows = []
    for path in paths:
        trace, result, val = _validate_one(path, profile_path, samples)
        s: Strategy = result.strategy
        emulation = trace.plan.get("emulation") or {}
        layout = f"{result.cluster.nodes}x{result.cluster.gpus_per_node}"
        if emulation.get("link_bandwidth"):
            layout += f" {emulation['link_bandwidth']}"
        rows.append({
            "model": trace.plan["model"], "strategy": str(s), "schedule": s.schedule if s.pp > 1 else "-",
            "M": s.num_micro_batches, "sync": s.grad_sync if s.dp > 1 else "-", "nodes": layout,
            "predicted_ms": round(val.predicted_s * 1e3, 1), "measured_ms": round(val.measured_s * 1e3, 1),
            "batch_err_%": round(100 * val.signed_batch_error, 2),
            "mean_dur_err_%": round(100 * (val.deterministic_s - val.measured_s) / val.measured_s, 2),
            "gpu_err_%": round(100 * val.max_gpu_error, 2),
            "stage_err_%": round(100 * val.stage_error_median, 2), "spread_%": round(100 * val.measured_spread, 1),
        })  # fmt: skip
    table = pd.DataFrame(rows)
    if csv_path:
        from distsim.io import write_csv

        write_csv(csv_path, table)
    batch = [abs(x) for x in table["batch_err_%"]]
    summary = {
        "traces": len(table), "batch_error_median_%": round(statistics.median(batch), 2),
        "batch_error_max_%": round(max(batch), 2),
        "gpu_error_median_%": round(statistics.median(table["gpu_err_%"]), 2),
        "gpu_error_max_%": round(max(table["gpu_err_%"]), 2),
    }  # fmt: skip
    if as_json:
        click.echo(json.dumps({"summary": summary, "rows": rows}, indent=2))
        return
    with pd.option_context("display.max_rows", None, "display.width", 200):
        click.echo(table.to_string(index=False))
    click.echo("\n" + ", ".join(f"{k} {v}" for k, v in summary.items()))


def _register_search() -> None:
    from distsim.cli_search import search

    cli.add_command(search)


_register_search()


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, exit status 2 for bad input."""
    try:
        rc = cli.main(args=argv, prog_name="distsim", standalone_mode=False)
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
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
