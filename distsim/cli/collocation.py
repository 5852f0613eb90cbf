"""Collocation on the command line: ``simulate --background MODEL`` options, and the report's text (for any command
that collocates a background job with its foreground, see :mod:`distsim.search.collocate`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from distsim.cli.common import GB, fmt_time
from distsim.cli.options import Options
from distsim.core.errors import DistsimError
from distsim.plans.plan import format_devices, parse_devices
from distsim.search.collocate import DEFAULT_BACKGROUND_BATCH, CollocationReport, collocation_report


def background_options(f: Any) -> Any:
    """``--background MODEL`` and what goes with it."""
    for option in reversed([
        click.option("--background", "background_name", metavar="NAME|FILE",
                     help="Collocate a background job of this model (zoo name or model file) on every GPU with idle "
                     "time, at lower priority: it runs in the foreground's idle gaps and slows the foreground's "
                     "compute there by the collocation slowdown (DeepPool's GPU multiplexing); prints foreground "
                     "alone and collocated, background and total cluster throughput, and static partitions."),
        click.option("--background-batch", type=click.IntRange(min=1), default=DEFAULT_BACKGROUND_BATCH,
                     show_default=True, help="Samples per background iteration (on its one GPU)."),
        click.option("--background-gpus", metavar="LIST",
                     help="GPUs that may host a background job, e.g. 1-7. [default: every GPU with idle time]"),
        click.option("--min-gap-us", type=click.FloatRange(min=0),
                     help="Idle gaps shorter than this stay unused by the background (its kernels cannot be "
                     "preempted). [default: the background's mean layer forward or backward]"),
        click.option("--collocation-slowdown", type=click.FloatRange(min=0), metavar="F",
                     help="Foreground compute takes 1 + F as long on a GPU hosting a background job. [default: the "
                     "--profile's measurement (distsim profile --collocation), else 0.18, DeepPool's reported bound]"),
    ]):  # fmt: skip
        f = option(f)
    return f


@dataclass(frozen=True)
class BackgroundOptions(Options):
    """The options of :func:`background_options`."""

    background_name: str | None = None
    background_batch: int = DEFAULT_BACKGROUND_BATCH
    background_gpus: str | None = None
    min_gap_us: float | None = None
    collocation_slowdown: float | None = None


def check_background(options: BackgroundOptions, samples: int = 0) -> Any:
    """The background model of --background (loaded before anything is simulated), or None; the options that need
    it are refused without it, and --background with stochastic runs (`samples`, simulate's --samples)."""
    from distsim.io.files import load_model

    if not options.background_name:
        needs = {"background_gpus": "--background-gpus", "collocation_slowdown": "--collocation-slowdown"}
        for key, option in needs.items():
            if getattr(options, key) is not None:
                raise DistsimError(f"{option} needs --background MODEL")
        return None
    if samples:
        raise DistsimError("--background collocates with a deterministic simulation; drop --samples")
    return load_model(options.background_name)


def collocate_from_options(opts: BackgroundOptions, background: Any, model: Any, cluster: Any, target: Any,
                           costs: Any, options: Any, alone: Any,
                           max_tasks: int | None = None) -> CollocationReport:  # fmt: skip
    hosts = parse_devices(opts.background_gpus, "--background-gpus") if opts.background_gpus else None
    min_gap_s = None if opts.min_gap_us is None else opts.min_gap_us * 1e-6
    return collocation_report(model, cluster, target, background, costs, background_batch=opts.background_batch,
                              slowdown=opts.collocation_slowdown, min_gap_s=min_gap_s,
                              options=options, alone=alone, hosts=hosts, max_tasks=max_tasks)  # fmt: skip


def _rate(x: float) -> str:
    return f"{x:,.1f}"


def _share_rows(report: CollocationReport) -> list[str]:
    """One row per run of consecutive GPUs with the same figures."""
    rows: list[tuple[list[int], str]] = []
    for s in report.shares:
        used = f"{fmt_time(s.usable_s)} ({s.gaps} gap{'s' if s.gaps != 1 else ''})" if s.hosts else "none"
        text = f"{fmt_time(s.idle_s):>10}   {used:<22} {_rate(s.background_samples_per_s):>12}"
        if rows and rows[-1][1] == text and rows[-1][0][-1] == s.gpu - 1:
            rows[-1][0].append(s.gpu)
        else:
            rows.append(([s.gpu], text))
    out = []
    for gpus, text in rows:
        who = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {gpus[0]}-{gpus[-1]} (each)"
        out.append(f"  {who:<18} {text}")
    return out


def format_report(report: CollocationReport) -> str:
    """The collocation section of a summary: foreground alone and collocated, background and total throughput, per
    GPU idle time filled, and the static partitions."""
    r, f = report, report.slowdown
    bg = r.background
    hosts = r.hosts
    where = f"GPUs {format_devices(tuple(hosts))}" if hosts else "no GPU (none has usable idle time)"
    why = "given" if r.min_gap_given else "the background's mean layer forward or backward: its kernels run to the end"
    detail = f": {f.detail}" if f.detail else ""
    lines = [
        f"collocation: background {bg.model.name} at batch {r.background_batch}, one single-GPU job on {where}, "
        "at lower priority",
        f"  usable idle gaps     at least {fmt_time(r.min_gap_s)} ({why})",
        f"  interference         foreground compute x{1 + f.fraction:.3f} on those GPUs, communication as alone "
        "(DeepPool pauses collocation for it)",
        f"                       ({f.source}{detail})",
        f"  background alone     {fmt_time(r.background_iteration_s)} per iteration on one {bg.cluster.gpu.name} "
        f"({_rate(r.background_batch / r.background_iteration_s)} samples/s)",
        f"  foreground alone     {fmt_time(r.alone_iteration_s):>10}   {_rate(r.alone_samples_per_s):>10} samples/s",
        f"  foreground collocated{fmt_time(r.collocated_iteration_s):>10}   {_rate(r.foreground_samples_per_s):>10} "
        f"samples/s (slowdown {r.foreground_slowdown:.3f}x)",
        f"  background           {'':>10}   {_rate(r.background_samples_per_s):>10} samples/s in the foreground's "
        "idle time",
        f"  total cluster        {'':>10}   {_rate(r.total_samples_per_s):>10} samples/s (foreground + background)",
    ]
    if hosts:
        fg_peak, bg_peak, capacity = r.collocated.peak_memory_bytes, bg.peak_memory_bytes, bg.cluster.gpu.memory_bytes
        verdict = "fits" if r.memory_fits else "OUT OF MEMORY"
        lines.append(f"  memory               foreground {fg_peak / GB:.2f} GB + background {bg_peak / GB:.2f} GB of "
                     f"{capacity / GB:.0f} GB ({verdict})")  # fmt: skip
    lines += ["", f"  per GPU            {'idle':>10}   {'background runs':<22} {'samples/s':>12}", *_share_rows(r)]
    if r.splits:
        lines += ["", "  static partition: foreground data-parallel on k GPUs, a background job alone on each of the "
                  "other G - k", f"  {'k':>4}  {'fg iteration':>12}  {'fg samples/s':>12}  {'bg samples/s':>12}  "
                  f"{'total samples/s':>15}"]  # fmt: skip
        for s in r.splits:
            if s.iteration_s is None:
                lines.append(f"  {s.foreground_gpus:>4}  {s.note}")
                continue
            note = " (plain data parallelism)" if s.background_gpus == 0 else ""
            if not s.fits_in_memory:
                note += " OUT OF MEMORY"
            lines.append(f"  {s.foreground_gpus:>4}  {fmt_time(s.iteration_s):>12}  "
                         f"{_rate(s.foreground_samples_per_s):>12}  {_rate(s.background_samples_per_s):>12}  "
                         f"{_rate(s.total_samples_per_s):>15}{note}")  # fmt: skip
    return "\n".join(lines)
