"""``distsim execute --elastic``: P logical data-parallel workers (ESTs) on however many ranks are launched.

The options are checked here, before any rank starts; the ranks run :mod:`distsim.executor.elastic`.
"""

from __future__ import annotations

import os
from typing import Any

import click

from distsim.cli.common import invoked_command, need_torch, portable
from distsim.errors import DistsimError
from distsim.output import check_output

IGNORED = ("cluster_name", "strategy_text", "plan_path", "micro_batches", "schedule", "virtual_stages", "policy",
           "partition", "profile_path", "check")  # fmt: skip
"""execute's options that have no meaning for an elastic run (it has no plan: P ESTs, whole model per rank)."""


def run_elastic(kw: dict[str, Any]) -> None:
    from distsim.executor.elastic import CONFIG_ENV, ElasticConfig, est_range
    from distsim.io import load_model
    from distsim.launch import Emulation

    given = [name for name in IGNORED if kw.get(name)]
    if given:
        flag = "--" + given[0].replace("_name", "").replace("_text", "").replace("_path", "").replace("_", "-")
        raise DistsimError(f"{flag} does not apply to --elastic (P ESTs data-parallel, the whole model on each rank)")
    if not kw["model_name"]:
        raise click.UsageError("give --model (e.g. bert-cpu)")
    if not kw["max_workers"]:
        raise click.UsageError("--elastic needs --max-workers P (the number of ESTs)")
    if kw["checkpoint_out"]:
        check_output(kw["checkpoint_out"], "--checkpoint-out", stream_ok=False)
    if kw["resume"] and not os.path.isfile(kw["resume"]):
        raise DistsimError(f"--resume: no checkpoint file {kw['resume']}")
    model = load_model(kw["model_name"])
    if model.precision.name != "fp32":
        raise DistsimError(f"elastic execution trains fp32 models on the CPU; {model.name} is "
                           f"{model.precision.name} (add precision=fp32 to its spec)")  # fmt: skip
    need_torch("execute --elastic")
    emulation = Emulation(kw["emulate_nodes"], kw["procs_per_node"]) if kw["emulate_nodes"] else None
    if kw["link_bandwidth"]:
        raise DistsimError("--link-bandwidth does not apply to --elastic")
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = emulation.world if emulation else (int(os.environ["WORLD_SIZE"]) if torchrun else 1)
    est_range(0, world, kw["max_workers"])
    cfg = ElasticConfig(
        model=portable(kw["model_name"]), max_workers=kw["max_workers"], steps=kw["steps"],
        micro_batch_size=kw["micro_batch_size"] or 1, seed=kw["seed"],
        checkpoint_out=os.path.abspath(kw["checkpoint_out"]) if kw["checkpoint_out"] else None,
        resume=os.path.abspath(kw["resume"]) if kw["resume"] else None,
        params_out=os.path.abspath(kw["params_out"]) if kw["params_out"] else None,
        naive=kw["naive_allreduce"], mask_tokens=kw["mask_tokens"] or 0.0, timeout_s=kw["timeout"],
        command=invoked_command(),
    )  # fmt: skip
    click.echo(f"executing {model.name} elastically: {cfg.max_workers} ESTs on {world} rank(s), {cfg.steps} step(s)",
               err=True)  # fmt: skip
    from distsim.executor import elastic

    if torchrun or emulation is None:
        elastic.run(cfg)
    else:
        from distsim.launch import launch

        launch("distsim.executor.elastic", {CONFIG_ENV: cfg.to_json()}, emulation, kw["timeout"], what="execution")
