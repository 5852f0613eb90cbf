"""Elastic data parallelism with EasyScale's ESTs: P logical workers time-sliced on however many ranks run.

The user fixes P (``--max-workers``), the number of logical data-parallel workers (EasyScale Training Threads); the
global batch is P mini-batches of ``micro_batch_size`` samples whatever the number n of ranks launched (1 <= n <= P).
Rank r runs the contiguous block of ESTs ``[r * P // n, (r + 1) * P // n)`` (block sizes differ by at most one), one
after the other (time-slicing at mini-batch granularity). Every rank holds the whole model (built as the
executor's single-process reference builds it) and one copy of the optimizer state.

A global step:

1. each of the rank's ESTs, in turn: restore its RNG state into the global generator (dropout, token masking:
   ``--mask-tokens``, any other sampling), run forward and backward on its own mini-batch (samples ``e*b ..
   (e+1)*b-1`` of the step's global batch of :mod:`distsim.executor.data`: a function of (seed, step, EST), not of
   n), save the RNG state back, and swap its gradients out of the shared gradient buffer into its own flat buffer,
   zeroing the shared one (the context switch);
2. every rank all-gathers every EST's flat gradient buffer (an exact copy of the bits), then sums them locally in
   virtual-rank order, ``acc = g_0; acc += g_1; ...; acc += g_{P-1}``, and divides by P;
3. one Adam step on every rank with that gradient: the same inputs, so the same parameters everywhere.

Consistency (EasyScale's D1 on a CPU): the parameters after k steps are bit-identical for any n and across
rescaling, because nothing in the arithmetic depends on n. An EST's forward and backward see the same parameters,
data and RNG state on any rank; the reduction over ESTs is an element-wise left fold in a fixed order (a gloo
all-reduce is not used: its summation order follows the world size and ring layout); the kernels run with
``torch.use_deterministic_algorithms(True)`` and one intra-op thread per rank (a matmul or a sum split over a
different number of threads adds in a different order). A rank's time-slicing order is irrelevant: each EST's
gradient is computed from zeros into its own buffer.

On-demand checkpoint (:func:`save_checkpoint`): the step reached, every EST's context (its RNG state; its data
progress is the step, since its shard is a function of (step, EST)), and one copy of the parameters and the optimizer
state. A run stopped at step k on n ranks resumes on m ranks with the same bits as a run that never stopped. The file
(:mod:`distsim.executor.elastic_checkpoint`) has a verified header (format, model and parameters, step, the
hyper-parameters the ESTs are tied to, the payload's SHA-256) and is loaded as tensors only, after every check.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from distsim.core.errors import DistsimError
from distsim.executor.model import seeded
from distsim.executor.runtime import Runtime
from distsim.infra.launch import WorkerConfig, stop_if_orphaned, worker_main

CONFIG_ENV = "DISTSIM_ELASTIC_CONFIG"
CHECKPOINT_FORMAT = "distsim-elastic-checkpoint/2"
"""The trainer's state (in memory, and the payload of a checkpoint file: :mod:`distsim.executor.elastic_checkpoint`)."""


@dataclass
class ElasticConfig(WorkerConfig):
    model: str
    max_workers: int
    steps: int
    """Global steps to run (from the resumed step when resuming)."""
    micro_batch_size: int = 1
    seed: int = 0
    lr: float = 1e-4
    checkpoint_out: str | None = None
    resume: str | None = None
    params_out: str | None = None
    """Write the final parameters here (rank 0; tests compare them bit for bit)."""
    mask_tokens: float = 0.0
    """BERT-style input masking: this fraction of each EST's input tokens, drawn from the EST's own RNG stream, is
    replaced by token 0 (the zoo's blocks have no dropout: this is what consumes the ESTs' RNG states)."""
    naive: bool = False
    """Sum the gradients with gloo's all-reduce of per-rank sums instead (not D1: for the test that shows it)."""
    timeout_s: float = 900.0
    command: str = ""
    stats: dict[str, Any] = field(default_factory=dict)


def est_range(rank: int, world: int, max_workers: int) -> range:
    """The ESTs rank `rank` of `world` runs: a contiguous block, sizes differing by at most one."""
    if not 1 <= world <= max_workers:
        raise DistsimError(f"elastic execution runs {max_workers} EST(s) on 1 to {max_workers} ranks, not {world}")
    return range(rank * max_workers // world, (rank + 1) * max_workers // world)


EST_CONTEXT_BYTES = 5_600
"""Memory of one EST's context, its RNG state (a 5,056-byte CPU generator state): 5,574 bytes of resident memory each,
measured over 200,000 of them on a 2-core AMD EPYC (and 21.7 us to make each)."""


def memory_needed(params: int, max_workers: int, world: int, activation_bytes: float = 0.0) -> int:
    """Bytes one rank of an elastic run of a model of `params` fp32 parameters allocates: its ESTs' gradient buffers
    (one per EST slot, :attr:`ElasticTrainer.slots`), every rank's buffers gathered each step (world > 1), the
    parameters, the shared gradient buffer, Adam's two moments and the reduction's accumulator, every EST's context
    twice (the live RNG states, and their copy in a checkpoint), and `activation_bytes`, what one EST's mini-batch
    keeps from its forward to its backward (:func:`activation_bytes`; the ESTs run one after the other)."""
    slots = -(-max_workers // world)
    gathered = world * slots if world > 1 else 0
    return 4 * params * (slots + gathered + 5) + 2 * max_workers * EST_CONTEXT_BYTES + int(activation_bytes)


def activation_bytes(model: Any, micro_batch_size: int) -> float:
    """The activations one EST's mini-batch keeps for its backward, by the memory model with the attention scores
    stored (distsim.sim.memory: 195,584 bytes a sample for the small BERT of the tests, hidden 64, 2 layers, sequence
    16; measured on a 2-core AMD EPYC, peak resident memory over mini-batches of 2,000 and 8,000 samples: 196,900
    bytes a sample). The flash-attention count (177,664) is 10 % below that measurement, so this guard, which must
    not let a run out of memory, keeps the stored-score count until the executor's attention memory is measured
    kernel by kernel."""
    from distsim.core.models.transformer import with_attention
    from distsim.sim.memory import layer_activations

    model = with_attention(model, "unfused")
    return micro_batch_size * sum(layer_activations(model, i, 1, False, "none").stored for i in range(model.num_layers))


def initial_rng_state(seed: int, est: int) -> Tensor:
    """EST `est`'s RNG state at step 0 (a CPU generator's state, as torch.get_rng_state returns)."""
    return seeded(seed, 1_000_003, est).get_state()


def deterministic(threads: int = 1) -> None:
    """Deterministic kernels and a fixed intra-op thread count: D0, and the half of D1 that is the kernels'."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)


class _ESTRuntime(Runtime):
    """The executor's single-rank runtime whose one micro-batch is the current EST's mini-batch."""

    est = 0

    def _samples(self, mb: int) -> range:
        b = self.strategy.micro_batch_size
        return range(self.est * b, (self.est + 1) * b)


@dataclass
class Switch:
    """Per EST mini-batch: the seconds of its compute (forward and backward) and of its context switch (RNG state
    restored and saved, gradients swapped out and the shared buffer zeroed)."""

    compute_s: float
    switch_s: float


class ElasticTrainer:
    """One rank's ESTs, the model and Adam; `step` runs one global step."""

    def __init__(self, model: Any, max_workers: int, rank: int, world: int, micro_batch_size: int = 1,
                 seed: int = 0, lr: float = 1e-4, naive: bool = False, mask_tokens: float = 0.0) -> None:  # fmt: skip
        from distsim.core.cluster import get_cluster
        from distsim.core.partition import ranges
        from distsim.core.placement import Placement
        from distsim.core.schedules import build_schedule
        from distsim.core.strategy import Strategy
        from distsim.profiler.blocks import torch_dtype

        if model.precision.name != "fp32":
            raise DistsimError(f"elastic execution trains fp32 models on the CPU; {model.name} is "
                               f"{model.precision.name} (add precision=fp32 to its spec)")  # fmt: skip
        self.model, self.max_workers, self.rank, self.world = model, max_workers, rank, world
        self.seed, self.naive, self.mask_tokens, self.lr = seed, naive, mask_tokens, lr
        self.ests = est_range(rank, world, max_workers)
        self.slots = -(-max_workers // world)  # the most ESTs a rank runs: every rank sends this many buffers
        single = Strategy(micro_batch_size=micro_batch_size, num_micro_batches=1, partition=(model.num_layers,))
        one = get_cluster("cpu-1x2")
        one = one.__class__(**{**one.__dict__, "nodes": 1, "gpus_per_node": 1, "slowdown": ()})
        device = torch.device("cpu")
        self.runtime = _ESTRuntime(model, single, Placement(single, one), build_schedule(single),
                                   ranges(single.partition or ()), 0, {}, torch_dtype("fp32", device), device, seed,
                                   lr=lr)  # fmt: skip
        self.grad = self.runtime.grad_buffer
        self.est_grads = torch.zeros(self.slots, self.grad.numel(), dtype=self.grad.dtype)
        self.rng = {e: initial_rng_state(seed, e) for e in range(max_workers)}
        self.step_index = 0
        self.switches: list[Switch] = []
        self.losses: dict[int, list[float]] = {}

    # ------------------------------------------------------------------------------------------------- a step
    def run_est(self, est: int) -> float:
        """EST `est`'s mini-batch of the current step, its gradients left in its own buffer; returns its loss."""
        rt, slot = self.runtime, est - self.ests.start
        t0 = time.perf_counter()
        torch.set_rng_state(self.rng[est])
        t1 = time.perf_counter()
        rt.est = est
        rt._prefetch(self.step_index)
        if self.mask_tokens > 0:
            self._mask()
        rt.recorder.begin(self.step_index)
        state: dict[Any, Any] = {}
        rt.forward(0, 0, self.step_index, state)
        rt.backward(0, 0, self.step_index, state)
        t2 = time.perf_counter()
        self.rng[est] = torch.get_rng_state()
        self.est_grads[slot].copy_(self.grad)
        self.grad.zero_()
        t3 = time.perf_counter()
        self.switches.append(Switch(t2 - t1, (t1 - t0) + (t3 - t2)))
        loss = float(rt.loss_values.pop().item())
        rt.loss_values.clear()
        return loss

    def _mask(self) -> None:
        """Replace a `mask_tokens` fraction of the token ids an embedding reads by 0, drawn from the global generator
        (which holds the current EST's RNG state)."""
        rt = self.runtime
        for (li, bi, _mb), feeds in rt.data.items():
            if self.model.layers[li].blocks[bi].op == "embedding":
                ids = feeds[0]
                ids[torch.rand(ids.shape) < self.mask_tokens] = 0

    def reduce(self) -> Tensor:
        """The mean gradient over the P ESTs, summed in virtual-rank order 0..P-1 on every rank."""
        if self.naive:  # per-rank sum, then gloo's all-reduce: the addition order depends on the world size
            acc = self.est_grads[0].clone()
            for slot in range(1, len(self.ests)):
                acc += self.est_grads[slot]
            if self.world > 1:
                dist.all_reduce(acc)
            return acc.div_(self.max_workers)
        if self.world > 1:
            gathered = torch.empty(self.world * self.slots, self.grad.numel(), dtype=self.grad.dtype)
            dist.all_gather_single(gathered, self.est_grads)
        else:
            gathered = self.est_grads
        row = {}
        for r in range(self.world):
            for i, e in enumerate(est_range(r, self.world, self.max_workers)):
                row[e] = r * self.slots + i
        acc = gathered[row[0]].clone()
        for e in range(1, self.max_workers):
            acc += gathered[row[e]]
        return acc.div_(self.max_workers)

    def step(self) -> list[float]:
        """One global step: every local EST in turn, the fixed-order reduction, one Adam step. Returns the local
        ESTs' losses."""
        losses = [self.run_est(e) for e in self.ests]
        self.losses[self.step_index] = losses
        self.grad.copy_(self.reduce())
        self.runtime.optimizer.step()
        self.grad.zero_()
        self.step_index += 1
        return losses

    # ------------------------------------------------------------------------------------------- state
    def named_params(self) -> dict[str, Tensor]:
        return {f"L{li}.B{bi}.{name}": p for (li, bi), module in sorted(self.runtime.modules.items())
                for name, p in module.named_parameters(remove_duplicate=False)}  # fmt: skip

    def state(self) -> dict[str, Any]:
        """The on-demand checkpoint: EST contexts, progress, one copy of parameters and optimizer state."""
        return {
            "format": CHECKPOINT_FORMAT, "model": self.model.name, "max_workers": self.max_workers,
            "seed": self.seed, "micro_batch_size": self.runtime.strategy.micro_batch_size, "step": self.step_index,
            "mask_tokens": self.mask_tokens, "lr": self.lr,
            "ests": [{"rng": self.rng[e].clone(), "step": self.step_index} for e in range(self.max_workers)],
            "params": {k: p.detach().clone() for k, p in self.named_params().items()},
            "optimizer": self.runtime.optimizer.opt.state_dict(),  # type: ignore[union-attr]
        }  # fmt: skip

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must have been made for to resume into this trainer (its header's identity fields)."""
        from distsim.executor.elastic_checkpoint import params_spec

        return {"model": self.model.name, "max_workers": self.max_workers, "seed": self.seed,
                "micro_batch_size": self.runtime.strategy.micro_batch_size, "mask_tokens": self.mask_tokens,
                "lr": self.lr, "params": params_spec(self.named_params())}  # fmt: skip

    def load(self, state: dict[str, Any], where: str = "the checkpoint") -> None:
        """Resume from `state` (as :meth:`state` returns it), after checking that it is one and made for this
        trainer; `where` names it in the one-line errors."""
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            got = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise DistsimError(f"{where}: not an elastic checkpoint (format {got!r})")
        if state.get("model") != self.model.name:
            raise DistsimError(f"{where}: made for model {state.get('model')}, not {self.model.name}")
        for key, want in (("max_workers", self.max_workers), ("seed", self.seed),
                          ("micro_batch_size", self.runtime.strategy.micro_batch_size),
                          ("mask_tokens", self.mask_tokens), ("lr", self.lr)):  # fmt: skip
            if state.get(key) != want:
                raise DistsimError(f"{where}: written with {key.replace('_', ' ')} {state.get(key)}, this run has "
                                   f"{want}: the hyper-parameters are tied to the ESTs, not the ranks")  # fmt: skip
        step = state.get("step")
        if type(step) is not int or step < 0:
            raise DistsimError(f"{where}: step {step!r} is not a valid step")
        params = self.named_params()
        saved = state.get("params")
        if not isinstance(saved, dict) or set(params) != set(saved):
            raise DistsimError(f"{where}: holds the parameters of another model than {self.model.name}")
        for k, p in params.items():
            t = saved[k]
            if not isinstance(t, Tensor) or t.shape != p.shape or t.dtype != p.dtype:
                raise DistsimError(f"{where}: parameter {k} is not a {tuple(p.shape)} {p.dtype} tensor")
        ests = state.get("ests")
        if not (isinstance(ests, list) and len(ests) == self.max_workers and all(_context_ok(c, step) for c in ests)):
            raise DistsimError(f"{where}: its EST contexts are not {self.max_workers} RNG states at step {step}")
        self._check_optimizer(state.get("optimizer"), where)
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(saved[k])
        self.runtime.optimizer.opt.load_state_dict(state["optimizer"])  # type: ignore[union-attr]
        self.rng = {e: ctx["rng"].clone() for e, ctx in enumerate(ests)}
        self.step_index = step

    def _check_optimizer(self, saved: Any, where: str) -> None:
        """Adam's state as this trainer's optimizer saves it: the same groups of the same tensors, each tensor's
        moments of its shape (load_state_dict checks the group sizes, not the shapes)."""
        opt = self.runtime.optimizer.opt  # type: ignore[union-attr]
        shapes = [p.shape for group in opt.param_groups for p in group["params"]]
        mine = [g["params"] for g in opt.state_dict()["param_groups"]]
        groups = saved.get("param_groups") if isinstance(saved, dict) else None
        states = saved.get("state") if isinstance(saved, dict) else None
        ok = (isinstance(groups, list) and isinstance(states, dict)
              and [g.get("params") if isinstance(g, dict) else None for g in groups] == mine
              and all(_adam_state_ok(index, st, shapes) for index, st in states.items()))  # fmt: skip
        if not ok:
            raise DistsimError(f"{where}: its optimizer state is not Adam's over this model's parameters")


def _context_ok(context: Any, step: int) -> bool:
    """One EST's saved context: a CPU generator's state (as torch.get_rng_state returns it) at `step`."""
    rng = context.get("rng") if isinstance(context, dict) else None
    return (isinstance(rng, Tensor) and rng.dtype == torch.uint8 and rng.shape == torch.get_rng_state().shape
            and context.get("step") == step)  # fmt: skip


def _adam_state_ok(index: Any, st: Any, shapes: list[torch.Size]) -> bool:
    """One parameter's Adam state: its step, and its two moments of the parameter's shape."""
    if not (type(index) is int and 0 <= index < len(shapes) and isinstance(st, dict)):
        return False
    moments = [st.get(k) for k in ("exp_avg", "exp_avg_sq")]
    return isinstance(st.get("step"), Tensor) and all(
        isinstance(m, Tensor) and m.shape == shapes[index] for m in moments
    )


def save_checkpoint(trainer: ElasticTrainer, path: str) -> None:
    """Rank 0 writes the checkpoint (every rank holds the same parameters and optimizer state; the EST contexts of
    the other ranks are gathered first), atomically: :func:`distsim.executor.elastic_checkpoint.write_checkpoint`."""
    from distsim.executor.elastic_checkpoint import write_checkpoint

    if trainer.world > 1:
        local = {e: trainer.rng[e] for e in trainer.ests}
        parts: list[Any] = [None] * trainer.world
        dist.all_gather_object(parts, local)
        for part in parts:
            trainer.rng.update(part)
    if trainer.rank == 0:
        write_checkpoint(trainer.state(), path)
    if trainer.world > 1:
        dist.barrier()


def overhead(switches: list[Switch]) -> dict[str, float]:
    """Median over EST mini-batches of the context switch's time relative to the EST's compute time."""
    ratios = [s.switch_s / s.compute_s for s in switches if s.compute_s > 0]
    return {
        "switch_ms": statistics.median(s.switch_s for s in switches) * 1e3,
        "compute_ms": statistics.median(s.compute_s for s in switches) * 1e3,
        "overhead_pct": statistics.median(ratios) * 100,
    }


def _log(message: str) -> None:
    print(f"[distsim execute --elastic] {message}", file=sys.stderr, flush=True)


def run(cfg: ElasticConfig) -> None:
    """One rank of an elastic run (alone, under `distsim execute --elastic --emulate-nodes`, or torchrun)."""
    import datetime as dt

    from distsim.io.files import load_model

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    deterministic(1)
    model = load_model(cfg.model)
    est_range(rank, world, cfg.max_workers)  # refuses n > P before any process group
    if world > 1:
        dist.init_process_group("gloo", timeout=dt.timedelta(seconds=cfg.timeout_s))
    trainer = ElasticTrainer(model, cfg.max_workers, rank, world, cfg.micro_batch_size, cfg.seed, cfg.lr, cfg.naive,
                             cfg.mask_tokens)  # fmt: skip
    if cfg.resume:
        from distsim.executor.elastic_checkpoint import read_checkpoint

        trainer.load(read_checkpoint(cfg.resume, trainer.identity()), f"cannot resume {cfg.resume}")
        if rank == 0:
            _log(f"resumed {cfg.resume} at step {trainer.step_index} on {world} rank(s)")
    first = trainer.step_index
    for _ in range(cfg.steps):
        losses = trainer.step()
        if rank == 0:
            _log(f"step {trainer.step_index}/{first + cfg.steps}: ESTs {trainer.ests.start}-{trainer.ests.stop - 1} "
                 f"of {cfg.max_workers} on rank 0, their mean loss {statistics.fmean(losses):.4f}")  # fmt: skip
    if cfg.checkpoint_out:
        stop_if_orphaned()  # a launcher killed mid-run abandoned it: no checkpoint
        save_checkpoint(trainer, cfg.checkpoint_out)
        if rank == 0:
            _log(f"wrote checkpoint {cfg.checkpoint_out} (step {trainer.step_index}, {cfg.max_workers} EST contexts)")
    if cfg.params_out and rank == 0:
        from distsim.executor.elastic_checkpoint import save_atomically

        stop_if_orphaned()
        save_atomically({k: p.detach().clone() for k, p in trainer.named_params().items()}, cfg.params_out)
    if trainer.switches and rank == 0:
        o = overhead(trainer.switches)
        _log(f"context switch per EST: {o['switch_ms']:.2f} ms against {o['compute_ms']:.1f} ms of compute "
             f"(median {o['overhead_pct']:.2f} %; EasyScale reports <= 1.9 % on GPUs)")  # fmt: skip
    if world > 1:
        dist.destroy_process_group()


def main() -> None:
    """Entry point of a launcher-spawned rank: the configuration comes from the environment."""
    worker_main(ElasticConfig, CONFIG_ENV, run, "distsim execute --elastic")


if __name__ == "__main__":
    main()
