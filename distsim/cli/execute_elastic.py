"""``distsim execute --elastic``: P logical data-parallel workers (ESTs) on however many ranks are launched.

The options are checked here, before any rank starts; the ranks run :mod:`distsim.executor.elastic`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import click

from distsim.cli.common import invoked_command, need_torch, portable
from distsim.core.errors import DistsimError
from distsim.io.output import check_output

if TYPE_CHECKING:
    from distsim.cli.options import ExecuteArgs


def run_elastic(args: ExecuteArgs) -> None:
    """Check an elastic run's options (execute's others are refused by its USED_BY table), then run its ranks."""
    from distsim.executor.elastic import CONFIG_ENV, ElasticConfig, est_range
    from distsim.infra.launch import Emulation
    from distsim.io.files import load_model

    model_name, elastic, launch_options = args.job.model_name, args.elastic, args.launch
    if not model_name:
        raise click.UsageError("give --model (e.g. bert-cpu)")
    if not elastic.max_workers:
        raise click.UsageError("--elastic needs --max-workers P (the number of ESTs)")
    check_output(elastic.checkpoint_out, "--checkpoint-out", stream_ok=False)
    check_output(elastic.params_out, "--params-out", stream_ok=False)
    if elastic.resume and not os.path.isfile(elastic.resume):
        raise DistsimError(f"--resume: no checkpoint file {elastic.resume}")
    model = load_model(model_name)
    if model.precision.name != "fp32":
        raise DistsimError(f"elastic execution trains fp32 models on the CPU; {model.name} is "
                           f"{model.precision.name} (add precision=fp32 to its spec)")  # fmt: skip
    need_torch("execute --elastic")
    emulation = (
        Emulation(launch_options.emulate_nodes, launch_options.procs_per_node) if launch_options.emulate_nodes else None
    )
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = emulation.world if emulation else (int(os.environ["WORLD_SIZE"]) if torchrun else 1)
    est_range(0, world, elastic.max_workers)
    here = emulation.world if emulation else (int(os.environ.get("LOCAL_WORLD_SIZE", world)) if torchrun else 1)
    micro_batch_size = args.strategy.micro_batch_size or 1
    _refuse_out_of_memory(model, elastic.max_workers, micro_batch_size, world, here)
    cfg = ElasticConfig(
        model=portable(model_name), max_workers=elastic.max_workers, steps=elastic.steps,
        micro_batch_size=micro_batch_size, seed=args.run.seed,
        checkpoint_out=os.path.abspath(elastic.checkpoint_out) if elastic.checkpoint_out else None,
        resume=os.path.abspath(elastic.resume) if elastic.resume else None,
        params_out=os.path.abspath(elastic.params_out) if elastic.params_out else None,
        naive=elastic.naive_allreduce, mask_tokens=elastic.mask_tokens or 0.0, timeout_s=launch_options.timeout,
        command=invoked_command(),
    )  # fmt: skip
    if cfg.resume:  # before any rank starts: all but the parameters' shapes (each rank checks those, and again all)
        from distsim.executor.elastic_checkpoint import verify_checkpoint

        verify_checkpoint(cfg.resume, {"model": model.name, "max_workers": cfg.max_workers, "seed": cfg.seed,
                                       "micro_batch_size": cfg.micro_batch_size, "mask_tokens": cfg.mask_tokens,
                                       "lr": cfg.lr})  # fmt: skip
    click.echo(f"executing {model.name} elastically: {cfg.max_workers} ESTs on {world} rank(s), {cfg.steps} step(s)",
               err=True)  # fmt: skip
    from distsim.executor import elastic

    if torchrun or emulation is None:
        elastic.run(cfg)
    else:
        from distsim.infra.launch import launch

        launch("distsim.executor.elastic", {CONFIG_ENV: cfg.to_json()}, emulation, launch_options.timeout,
               what="execution")  # fmt: skip


def available_memory() -> int | None:
    """Bytes of memory this machine can give without swapping (MemAvailable), None where it cannot tell."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _refuse_out_of_memory(model: Any, max_workers: int, micro_batch_size: int, world: int, here: int) -> None:
    """Refuse --max-workers (or --micro-batch-size) whose ESTs' buffers and activations
    (:func:`~distsim.executor.elastic.memory_needed`, per rank, times the `here` ranks on this machine) exceed the
    memory available, before anything is allocated."""
    from distsim.executor.elastic import activation_bytes, memory_needed

    acts = activation_bytes(model, micro_batch_size)
    need, free = memory_needed(model.params, max_workers, world, acts) * here, available_memory()
    if free is None or need <= free:
        return
    slots = -(-max_workers // world)
    gathered = ", all P gathered on every rank each step" if world > 1 else ""
    raise DistsimError(
        f"--max-workers {max_workers}, --micro-batch-size {micro_batch_size}: {max_workers:,} ESTs of {model.name} "
        f"({model.params:,} parameters) on {world} rank(s) need about {need / 1e9:,.1f} GB of memory here ({here} "
        f"rank(s), each with {slots:,} EST gradient buffers of {4 * model.params / 1e6:,.1f} MB{gathered}, the ESTs' "
        f"RNG states and {acts / 1e9:,.1f} GB of one mini-batch's activations), over the {free / 1e9:,.1f} GB available"
    )
