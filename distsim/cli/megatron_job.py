"""``--megatron-args`` and ``--global-batch``: a Megatron-LM launch line, or a global batch, as the job to simulate.

:func:`distsim.core.megatron.parse_megatron_args` turns the launch line into a ``transformer:`` model spec, the
parallel degrees and batch, strategy fields and the framework's overlap switches; here the CLI reads it (text, or
``@FILE``), resolves data parallelism from the cluster (dp = GPUs / (tp pp), as torchrun's world size would), builds
the framework (megatron-core with the launch line's overlap options, unless ``--framework`` names one) and says on
stderr which flags it used, which have no effect on the iteration, and which it did not understand.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from distsim.cli.options import Options
from distsim.core.errors import DistsimError


@dataclass(frozen=True)
class JobSourceOptions(Options):
    """``--megatron-args``: the model and strategy from a launch line."""

    megatron_args: str | None = None


def global_batch_option(f: Any) -> Any:
    """``--global-batch`` (:class:`~distsim.cli.options.StrategyOptions`' ``global_batch``)."""
    return click.option(
        "--global-batch", type=click.IntRange(min=1), default=None, metavar="N",
        help="Samples per iteration over all replicas: sets the micro-batches, N / (dp / cp x micro-batch size) "
        "(instead of --micro-batches).",
    )(f)  # fmt: skip


def job_source_options(f: Any) -> Any:
    f = global_batch_option(f)
    return click.option(
        "--megatron-args", default=None, metavar="'ARGS'|@FILE",
        help="A Megatron-LM pretrain_gpt.py launch line (or @FILE holding one): the model (layers, hidden, heads, "
        "query groups, ffn, swiglu, normalization, rope, untied embeddings, biases, dropout, seq length, bf16/fp8), "
        "tp, pp, micro and global batch, virtual pipeline, recomputation, sequence parallelism, the distributed "
        "optimizer and the overlap flags; data parallelism is the cluster's GPUs over tp x pp. Flags with no effect "
        "on the iteration and flags not understood are listed on stderr. Replaces --model and --strategy.",
    )(f)  # fmt: skip


def read_megatron(text: str) -> Any:
    """The launch line's job (:class:`~distsim.core.megatron.MegatronJob`); ``@FILE`` reads the file."""
    from distsim.core.megatron import parse_megatron_args

    if text.startswith("@"):
        path = Path(text[1:])
        try:
            text = path.read_text()
        except OSError as exc:
            raise DistsimError(f"--megatron-args {text}: cannot read {path}: {exc.strerror or exc}") from None
    return parse_megatron_args(text)


def megatron_strategy(megatron: Any, gpus: int, overrides: dict[str, Any]) -> Any:
    """The strategy of the launch line on `gpus` GPUs, the command line's strategy options winning."""
    from distsim.core.strategy import Strategy

    tp, pp, dp, micro_batches = megatron.degrees(gpus)
    fields: dict[str, Any] = {"micro_batch_size": megatron.micro_batch_size, "num_micro_batches": micro_batches,
                              **megatron.strategy, **overrides}  # fmt: skip
    return Strategy.from_str(f"{tp}M{pp}P{dp}D", **fields)


def megatron_framework(megatron: Any, base: Any) -> Any:
    """`base` (megatron-core unless --framework named another) with the launch line's overlap switches."""
    if not megatron.framework:
        return base
    return replace(base, name=f"{base.name} + {', '.join(sorted(megatron.framework))}", **megatron.framework)


def with_global_batch(strategy: Any, global_batch: int | None, given: list[str]) -> Any:
    """`strategy` with the micro-batches a global batch makes: N / (dp x micro-batch size)."""
    if global_batch is None:
        return strategy
    if "--micro-batches" in given:
        raise click.UsageError("give --global-batch or --micro-batches, not both")
    per = strategy.dp // strategy.cp * strategy.micro_batch_size  # a context-parallel group shares its samples
    if global_batch % per:
        raise DistsimError(f"--global-batch {global_batch} is not a multiple of dp {strategy.dp} x micro-batch size "
                           f"{strategy.micro_batch_size} = {per}")  # fmt: skip
    return strategy.with_(num_micro_batches=global_batch // per)


def megatron_report(megatron: Any) -> str:
    """What the launch line gave, in lines for stderr."""
    lines = [f"megatron args: {len(megatron.used)} flags used; model {megatron.spec}"]
    if megatron.no_effect:
        lines.append("  no effect on the iteration: " + " ".join(f"--{f}" for f in megatron.no_effect))
    if megatron.unknown:
        lines.append("  not understood (check them): " + " ".join(f"--{f}" for f in megatron.unknown))
    lines += [f"  note: {n}" for n in megatron.notes]
    return "\n".join(lines)
