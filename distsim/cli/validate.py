"""``distsim validate``: a prediction against a measured trace (DistSim's batch-time, per-GPU and per-stage errors)."""

from __future__ import annotations

import json
from typing import Any

import click

from distsim.cli.app import cli
from distsim.cli.common import check_outputs, framework_option
from distsim.cli.options import OutputOptions
from distsim.core.errors import DistsimError


def _validate_one(path: str, profile_path: str | None, samples: int = 64,
                  framework: Any = None) -> tuple[Any, Any, Any, list[str]]:  # fmt: skip
    """Simulate a trace's plan (with the profile's measured costs, strictly) and compare it with the trace; also
    the load warnings the profile recorded while it was measured."""
    from distsim.core.errors import ProfileError
    from distsim.core.strategy import Strategy
    from distsim.infra.machine_load import recorded_warnings
    from distsim.io.files import load_cluster, load_model, load_profile, load_trace
    from distsim.io.trace import TraceError
    from distsim.plans.simulate import simulate
    from distsim.sim.costs import AnalyticCosts, ProfileCosts
    from distsim.sim.flow.events import FlowOptions
    from distsim.sim.validate import validate_timelines

    trace = load_trace(path)
    plan = trace.plan
    if not profile_path and plan.get("profile"):  # by default the profile the run was planned with
        profile_path = planned_profile(path, plan["profile"])
    model = load_model(plan["model"])
    if framework is not None:
        model = framework.apply(model)
    cluster = load_cluster(plan["cluster"]).with_nodes(int(plan["nodes"]))
    strategy: Any = Strategy.from_str(plan["strategy"])
    if plan.get("burst"):  # a burst plan ran: simulate it (its strategy is only its one-stage view)
        from distsim.plans import plan_from_dict

        strategy = plan_from_dict(plan["burst"], f"{path}: plan burst")
    costs: Any = AnalyticCosts(cluster) if framework is None else AnalyticCosts(cluster, framework=framework)
    load_warnings: list[str] = []
    if profile_path:
        db = load_profile(profile_path)
        measured_on, profiled_on = trace.provenance.get("device"), db.provenance.get("device")
        if measured_on and profiled_on and measured_on != profiled_on:
            advice = _reprofile_advice(path, plan)
            raise TraceError(f"{path} was measured on {measured_on!r} but {profile_path} on {profiled_on!r}, and a "
                             f"profile predicts only the device it was measured on: {advice}")  # fmt: skip
        costs = ProfileCosts(db, costs, strict=True)
        load_warnings = recorded_warnings(db.provenance)
    options = FlowOptions(p2p_blocking=bool(plan["p2p_blocking"]))
    try:
        result = simulate(model, cluster, strategy, costs, options, samples=samples)
        mean_durations = simulate(model, cluster, strategy, costs, options) if samples else result
    except ProfileError as exc:
        hint = ""
        if framework is not None and framework.attention != "flash":
            hint = (
                f"; --framework {framework.name} runs {framework.attention} attention, which the profile (of the "
                "executor's flash kernels) did not measure: leave --framework out to validate the run as it ran"
            )
        raise TraceError(
            f"{profile_path} does not cover the plan of {path} (model {plan['model']}): {exc}{hint}"
        ) from None
    measured = [trace.timeline(i, cluster.gpus_per_node) for i in range(len(trace.iterations))]
    val = validate_timelines(result.timeline, measured, result.iteration_time_s)
    val.deterministic_s = mean_durations.iteration_time_s
    return trace, result, val, load_warnings


def _described(result: Any) -> str:
    """The strategy that ran, or the plan (a burst plan: its GPUs per layer, batch and gradient sync)."""
    if result.plan is None:
        return str(result.strategy.describe())
    return f"{result.label} (batch {result.plan.strategy.micro_batch_size}, {result.plan.strategy.grad_sync})"


def _reprofile_advice(path: str, plan: dict[str, Any]) -> str:
    """What to run on the machine a trace was measured on: profile the trace's plan there, then validate with it."""
    import shlex

    from distsim.cli.common import profile_command, profile_out_name
    from distsim.core.strategy import Strategy
    from distsim.io.files import load_cluster

    preset = load_cluster(plan["cluster"])
    nodes = int(plan["nodes"])
    strategy = Strategy.from_str(plan["strategy"])  # with the partition it ran: the exact p2p sizes
    out = profile_out_name(plan["model"], plan["cluster"])
    burst = "PLAN.yaml" if plan.get("burst") else None  # the trace's plan.burst, written to a file
    world = strategy.num_gpus
    if burst:
        from distsim.plans import plan_from_dict

        world = plan_from_dict(plan["burst"], f"{path}: plan burst").num_gpus
    command = profile_command(plan["model"], plan["cluster"], strategy, out,
                              nodes=nodes if nodes != preset.nodes else None, emulation=plan.get("emulation"),
                              world=world, run_nodes=nodes, plan_path=burst)  # fmt: skip
    where = " on every node (K = 0, 1, ...)" if command.startswith("torchrun") else ""
    if burst:
        where += f" with {burst} holding the trace's plan.burst"
    return (
        f"profile the machine the trace ran on first, `{command}`{where}, then rerun "
        f"`distsim validate --trace {shlex.quote(path)} --profile {shlex.quote(out)}`"
    )


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
@framework_option
def validate(trace_path: str | None, profile_path: str | None, suite_dir: str | None, plot_path: str | None,
             csv_path: str | None, samples: int, as_json: bool, framework_name: str | None) -> None:  # fmt: skip
    """Compare a prediction with a measured run: batch time, per-GPU activity and per-stage errors (DistSim Sec. 5).

    \b
    One trace:   distsim validate --trace traces/gpt2-cpu-2x1-1M2P1D-1f1b-M4.json --profile profiles/cpu-gloo.json
    All traces:  distsim validate --suite traces --profile profiles/cpu-gloo.json
    """
    if (trace_path is None) == (suite_dir is None):
        raise click.UsageError("give --trace FILE or --suite [DIR]")
    outputs = OutputOptions(plot_path=plot_path, csv_path=csv_path, as_json=as_json)
    report = bool(check_outputs(outputs, {"csv_path": "--csv"}, {"plot_path": "--plot"}))  # True: stdout taken
    if plot_path and not trace_path:
        raise click.UsageError("--plot draws one trace: give --trace FILE")
    if csv_path and not suite_dir:
        raise click.UsageError("--csv writes the suite table: give --suite [DIR]")
    from distsim.io.files import load_framework

    framework = load_framework(framework_name) if framework_name else None
    if trace_path:
        trace, result, val, load_warnings = _validate_one(trace_path, profile_path, samples, framework)
        if plot_path:
            from distsim.io.files import write_figure
            from distsim.io.plots import compare_gantt

            median = trace.timeline(trace.median_index(), result.cluster.gpus_per_node)
            title = f"{result.model.name} {_described(result)} on {result.cluster.name}"
            write_figure(plot_path, compare_gantt(result.timeline.expand(), median, title))
        if as_json:
            click.echo(json.dumps({"trace": trace_path, **val.to_dict(), "profile_load_warnings": load_warnings,
                                   "timing": trace.timing, "host_timed_gpu": trace.host_timed_gpu},
                                  indent=2))  # fmt: skip
            return
        lines = [
            f"{trace_path}: {result.model.name} {_described(result)} on {result.cluster.name}",
            f"  predicted {val.predicted_s * 1e3:.1f} ms, measured {val.measured_s * 1e3:.1f} ms (median of "
            f"{len(val.iteration_times_s)} iterations, spread {100 * val.measured_spread:.1f} %)",
            f"  batch-time error      {100 * val.batch_error:.2f} %"
            + (
                f" (with mean durations instead of {samples} stochastic runs: "
                f"{100 * abs(val.deterministic_s - val.measured_s) / val.measured_s:.2f} %)"
                if samples
                else ""
            ),
            "  per-GPU activity      " + ", ".join(f"GPU {g} {100 * e:.2f} %" for g, e in val.per_gpu_error.items()),
            f"  per-stage (median)    {100 * val.stage_error_median:.2f} % over "
            f"{len(val.per_stage)} (stage, F/B, micro-batch) actions",
        ]
        if val.too_noisy:
            lines.append(f"  too noisy to judge: the measured iterations spread {100 * val.measured_spread:.1f} %, "
                         f"more than the {100 * val.batch_error:.2f} % error; measure more iterations on an idle "
                         "machine (execute --iterations)")  # fmt: skip
        if trace.host_timed_gpu:
            lines += ["  note: a GPU trace timed by the host clock (written before the executor recorded CUDA events):",
                      "        its iteration times are right, its per-event times are kernel-launch spans, so the "
                      "per-GPU and per-stage errors are not the GPU's"]  # fmt: skip
        if load_warnings:
            lines.append("  the profile was measured under load; its warnings (distsim profile show):")
        lines += [f"    {message}" for message in load_warnings]
        click.echo("\n".join(lines), err=report)
        return
    _validate_suite(suite_dir or "traces", profile_path, csv_path, as_json, samples, report, framework)


def planned_profile(trace_path: str, recorded: str) -> str:
    """The profile a trace records it was planned with (a path relative to the trace's directory), as a path from
    the working directory, so that it can be opened and pasted (``distsim profile show``) from there."""
    import os

    return os.path.relpath(os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(trace_path)), recorded)))


def _validate_suite(directory: str, profile_path: str | None, csv_path: str | None, as_json: bool,
                    samples: int, report: bool = False, framework: Any = None) -> None:  # fmt: skip
    import glob
    import os
    import statistics

    import pandas as pd

    from distsim.core.strategy import Strategy

    if not os.path.isdir(directory):
        shipped = " (the shipped traces are the repository's traces/: run from its root or give its path)"
        raise DistsimError(f"{directory}: no such directory{shipped if directory == 'traces' else ''}")
    paths = sorted(p for p in glob.glob(os.path.join(directory, "*.json")) if not p.endswith(".chrome.json"))
    if not paths:
        raise DistsimError(f"no traces (*.json) in {directory}")
    rows = []
    warned: set[str] = set()
    for path in paths:
        trace, result, val, load_warnings = _validate_one(path, profile_path, samples, framework)
        if load_warnings:
            warned.add(profile_path or planned_profile(path, str(trace.plan.get("profile"))))
        s: Strategy = result.strategy
        emulation = trace.plan.get("emulation") or {}
        layout = f"{result.cluster.nodes}x{result.cluster.gpus_per_node}"
        if emulation.get("link_bandwidth"):
            layout += f" {emulation['link_bandwidth']}"
        scale = [x for x in s.describe().split() if x.split("=")[0] in ("recompute", "recompute_layers", "sp", "zero")]
        sync = result.plan.strategy.grad_sync if result.plan is not None else s.grad_sync if s.dp > 1 else "-"
        rows.append({
            "model": trace.plan["model"], "strategy": " ".join([result.label, *scale]),
            "schedule": s.schedule if s.pp > 1 else "-",
            "M": s.num_micro_batches, "sync": sync, "nodes": layout,
            "predicted_ms": round(val.predicted_s * 1e3, 1), "measured_ms": round(val.measured_s * 1e3, 1),
            "batch_err_%": round(100 * val.signed_batch_error, 2),
            "mean_dur_err_%": round(100 * (val.deterministic_s - val.measured_s) / val.measured_s, 2),
            "gpu_err_%": round(100 * val.max_gpu_error, 2),
            "stage_err_%": round(100 * val.stage_error_median, 2), "spread_%": round(100 * val.measured_spread, 1),
            "judged": "too noisy" if val.too_noisy else "yes",
        })  # fmt: skip
    table = pd.DataFrame(rows)
    if csv_path:
        from distsim.io.files import write_csv

        write_csv(csv_path, table)
    batch = [abs(x) for x in table["batch_err_%"]]
    summary = {
        "traces": len(table), "batch_error_median_%": round(statistics.median(batch), 2),
        "batch_error_max_%": round(max(batch), 2),
        "gpu_error_median_%": round(statistics.median(table["gpu_err_%"]), 2),
        "gpu_error_max_%": round(max(table["gpu_err_%"]), 2),
    }  # fmt: skip
    if as_json:
        click.echo(json.dumps({"summary": summary, "rows": rows, "profiles_with_load_warnings": sorted(warned)},
                              indent=2))  # fmt: skip
        return
    with pd.option_context("display.max_rows", None, "display.width", 200):
        click.echo(table.to_string(index=False), err=report)
    click.echo("\n" + ", ".join(f"{k} {v}" for k, v in summary.items()), err=report)
    if warned:
        click.echo("profiles that recorded load warnings (distsim profile show): " + ", ".join(sorted(warned)),
                   err=report)  # fmt: skip
