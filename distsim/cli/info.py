"""``distsim models | clusters | schedule``: what is built in, and a schedule drawn as a grid."""

from __future__ import annotations

import json

import click

from distsim.cli.app import cli
from distsim.cli.common import RegistryChoice, fmt_count
from distsim.core.schedules import SCHEDULES


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def models(as_json: bool) -> None:
    """List the built-in workloads: size, graph layers (what --partition counts), source, and the named specs.

    \b
    A spec resizes a zoo model: gpt2-345m:seq=128,layers=4,precision=fp32 (keys: layers, hidden, heads, seq, ffn,
    vocab, precision; T5 also dec_seq; CNNs image, classes). Your own model: a YAML/JSON file (see README).
    """
    from distsim.core.models import ALIASES, ZOO, get_model

    rows = []
    for name, entry in ZOO.items():
        m = entry.build()
        rows.append({"name": name, "family": entry.family, "layers": m.num_layers, "params": m.params,
                     "description": m.description, "source": m.source, "spec": None})  # fmt: skip
    for name, spec in ALIASES.items():
        m = get_model(name)
        rows.append({"name": name, "family": "CPU-sized spec", "layers": m.num_layers, "params": m.params,
                     "description": m.description, "source": m.source, "spec": spec})  # fmt: skip
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'name':<14} {'family':<30} {'graph layers':>12} {'params':>9}  description")
    for r in rows:
        params = fmt_count(r["params"])
        what = r["description"] if r["spec"] is None else f"= {r['spec']}"
        click.echo(f"{r['name']:<14} {r['family']:<30} {r['layers']:>12} {params:>9}  {what}")
    click.echo("\nsources:")
    for r in rows:
        if r["spec"] is None:
            click.echo(f"  {r['name']:<14} {r['source']}")
    click.echo("\nA spec resizes any of them (gpt2-345m:layers=4,seq=128); `distsim models --help` lists the keys.")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def clusters(as_json: bool) -> None:
    """List the built-in clusters with their figures and sources."""
    from distsim.core.cluster import PRESETS

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
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def frameworks(as_json: bool) -> None:
    """List the framework presets (--framework of simulate, search and validate) with their sources.

    A framework decides which attention kernel runs (and so which activations stay in memory) and how much host time
    each kernel costs before it reaches the GPU; a file {name, base, attention, host_op_s, host_backward_op_s,
    cuda_graphs} describes your own (unset keys come from base)."""
    from dataclasses import asdict

    from distsim.core.framework import DEFAULT_FRAMEWORK, FRAMEWORKS

    if as_json:
        click.echo(json.dumps([asdict(f) for f in FRAMEWORKS.values()], indent=2))
        return
    for name, f in FRAMEWORKS.items():
        default = " (default)" if name == DEFAULT_FRAMEWORK else ""
        click.echo(f"{f.describe()}{default}\n{'':<4}source: {f.source}")


@cli.command()
@click.option("--schedule", type=RegistryChoice(SCHEDULES), default="1f1b", show_default=True)
@click.option("--pp", type=click.IntRange(min=1), required=True, help="Pipeline ranks.")
@click.option("--micro-batches", type=click.IntRange(min=1), required=True)
@click.option("--virtual-stages", type=click.IntRange(min=2), help="Chunks per rank (interleaved).")
@click.option("--policy", type=click.Choice(["A", "B"], case_sensitive=False), default="A", show_default=True)
@click.option("--max-in-flight", type=click.IntRange(min=1))
def schedule(schedule: str, pp: int, micro_batches: int, virtual_stages: int | None, policy: str,
             max_in_flight: int | None) -> None:  # fmt: skip
    """Print a pipeline schedule's action lists and its step x rank grid (unit-time F and B)."""
    from distsim.core.schedules import build_schedule, format_grid
    from distsim.core.strategy import Strategy

    strategy = Strategy(
        pp=pp,
        num_micro_batches=micro_batches,
        schedule=schedule,
        virtual_stages=virtual_stages,
        warmup_policy=policy,
        max_in_flight=max_in_flight,
    )
    sched = build_schedule(strategy)
    click.echo(str(sched))
    click.echo("")
    click.echo(format_grid(sched))
