"""Gradient buckets: the zoo's parameter tensors are the executor's, and DDP's bucket assignment is PyTorch's."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from distsim import Strategy  # noqa: E402
from distsim.core.models import get_model  # noqa: E402
from distsim.core.models.cnn import _Builder  # noqa: E402
from distsim.core.models.graph import FP32, Model  # noqa: E402
from distsim.core.sync import MB, SyncContext, SyncSettings, lower  # noqa: E402
from distsim.profiler.build import build_block  # noqa: E402


def small_cnn() -> Model:
    """Every CNN block kind the zoo builds: a conv with bias and no BN (VGG), convs with BN, max and average pools,
    a branching concat, bottlenecks with and without the projection, the adaptive pool and the classifier."""
    b = _Builder("small-cnn", FP32, 16)
    b.conv("conv_bias", 8, 3, pad=1, bias=True, bn=False)
    b.conv("conv_bn", 16, 3, pad=1)
    b.pool("maxpool", "maxpool", 2, 2)
    left = b.conv("left", 8, 1, src="maxpool")
    right = b.pool("right", "avgpool", 3, 1, 1, src="maxpool")
    b.concat("concat", (left, right))
    b.bottleneck("down", 8, 2)
    b.bottleneck("same", 8, 1)
    b.adaptive_avgpool("avgpool", 1)
    b.linear("fc", 10)
    return b.build("test", "every CNN block kind", FP32)


@pytest.mark.parametrize("spec", ["gpt2-cpu", "bert-cpu", "t5-cpu", "resnet50:image=32,classes=10", "small-cnn"])
def test_block_tensors_are_the_torch_modules_parameters(spec: str) -> None:
    """``Block.tensors`` lists the module's ``parameters()`` in order, and what one tp rank of 2 holds of each."""
    model = small_cnn() if spec == "small-cnn" else get_model(spec)
    checked = 0
    for layer in model.layers:
        for block in layer.blocks:
            assert sum(n for n, _ in block.tensors) == block.params, (layer.name, block.op)
            for tp in (1, 2) if block.tp == "shard" else (1,):
                for rank in range(tp):
                    module = build_block(block, tp, rank, device="meta")  # shapes only
                    got = tuple(float(p.numel()) for p in module.parameters())
                    assert got == block.shard_tensors(tp), (layer.name, block.op, tp, rank)
                    checked += 1
    assert checked >= len(model.layers)


# -------------------------------------------------------------------------------------- DDP's bucket assignment
SMALL_GPT = "gpt2-345m:seq=32,layers=4,hidden=128,heads=4,vocab=1024,precision=fp32"
"""About 3.7 MB of fp32 gradients: embedding 540 kB, per layer 264 kB of attention and 528 kB of MLP."""


def _runtime(spec: str, text: str, rank: int = 0) -> Any:
    """An executor rank of `text` on a cluster of its size, built in this process (no process group: nothing runs)."""
    from distsim.core.cluster import get_cluster
    from distsim.core.partition import ranges
    from distsim.core.placement import Placement
    from distsim.core.schedules import build_schedule
    from distsim.executor.runtime import Runtime
    from distsim.sim.costs import AnalyticCosts
    from distsim.sim.flow.events import resolve_partition
    from distsim.sim.flow.uniform import merge_groups

    model = get_model(spec)
    strategy = Strategy.from_str(text)
    cluster = get_cluster("cpu-1x2").with_nodes(strategy.num_gpus // 2)
    costs = AnalyticCosts(cluster)
    if strategy.grad_sync.startswith("mgwfbp") and not strategy.grad_groups:
        strategy = strategy.with_(grad_groups=merge_groups(model, cluster, strategy, costs))
    if strategy.partition is None:
        strategy = strategy.with_(partition=tuple(e - s for s, e in resolve_partition(model, strategy, costs)))
    return Runtime(model, strategy, Placement(strategy, cluster), build_schedule(strategy), ranges(strategy.partition),
                   rank, {}, torch.float32, torch.device("cpu"))  # fmt: skip


def _param_index(runtime: Any) -> dict[tuple[int, int], int]:
    """(layer, tensor index) -> the parameter's index in registration order (a tied matrix once, at its first
    module), which is the order of ``nn.Module.parameters()`` over the rank's modules and of the gradient buffer."""
    flat = [(li, k) for li in sorted(runtime.layer_params) for k in range(len(runtime.layer_params[li]))]
    return {t: i for i, t in enumerate(flat)}


def _ddp_indices(runtime: Any, settings: SyncSettings) -> list[list[int]]:
    """The ddp mode's buckets for the rank's own gradients, as parameter indices in the order they become ready."""
    index = _param_index(runtime)
    lowered = lower("ddp", SyncContext(runtime.grad_units(), lambda _n: 0.0, None, settings))
    return [[index[t] for t in b.tensors] for b in lowered.buckets]


def _real_ddp_buckets(runtime: Any, cap_mb: float | None) -> list[list[int]]:
    """The buckets a real DistributedDataParallel (1 gloo rank in this process) rebuilds after its first iterations
    over the executor's modules of the same model, as parameter indices in the order their gradients arrived."""
    import torch.distributed as dist
    from torch import nn

    from distsim.executor.model import build_modules
    from distsim.profiler.tp_comm import TPComm

    model = runtime.model
    modules = build_modules(model, list(range(model.num_layers)), 1, 0, TPComm.local(), torch.float32,
                            torch.device("cpu"), 0)  # fmt: skip

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(modules[k] for k in sorted(modules))
            self.data = [m.example_inputs(2) for m in self.blocks]

        def forward(self) -> torch.Tensor:
            x = self.data[0][0]  # token ids: a chain of embedding, transformer blocks, LM head (the loss)
            for m, example in zip(self.blocks, self.data, strict=True):
                op = m.block.op
                x = m(example[0]) if op == "embedding" else m(x, example[1]) if op == "lm_head" else m(x)
            return x

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        chain = Chain()
        ddp = nn.parallel.DistributedDataParallel(chain, **({} if cap_mb is None else {"bucket_cap_mb": cap_mb}))
        for _ in range(3):  # buckets are rebuilt in the order gradients arrived, after the first iteration
            ddp().backward()
        logged = ddp._get_ddp_logging_data()
    finally:
        dist.destroy_process_group()
    assert len(list(chain.parameters())) == len(_param_index(runtime))
    return [[int(x) for x in b.split()] for b in logged["rebuilt_per_bucket_param_indices"].split(",")]


@pytest.mark.parametrize("cap_mb", [0.5, 1.0])
def test_ddp_buckets_are_pytorchs_assignment(cap_mb: float) -> None:
    """The ddp mode's buckets of an executor rank's gradients are ``dist._compute_bucket_assignment_by_size`` of the
    parameters reversed with DDP's limits [first bucket, cap] (the strategy's: the cap for both when one is given),
    several of them, with a layer split over two; the executor's buckets are the mode's and slices of its buffer."""
    import torch.distributed as dist

    runtime = _runtime(SMALL_GPT, f"tp=1 pp=1 dp=2 mb=2 sync=ddp cap={cap_mb}")
    settings = SyncSettings.of(cap_mb)
    ours = _ddp_indices(runtime, settings)
    params = [p for li in sorted(runtime.layer_params) for p in runtime.layer_params[li]]
    n = len(params)
    limits = [int(settings.first_bucket_mb * MB), int(cap_mb * MB)]
    theirs, _limits = dist._compute_bucket_assignment_by_size(params[::-1], limits)
    assert ours == [[n - 1 - i for i in bucket] for bucket in theirs]
    assert len(ours) >= 4
    layers = [set(b.bucket.layers) for b in runtime.buckets]
    assert any(a & b for a, b in itertools.pairwise(layers))  # a layer's tensors in two buckets
    index = _param_index(runtime)
    assert [[index[t] for t in b.bucket.tensors] for b in runtime.buckets] == ours
    for b in runtime.buckets:  # each bucket is the slice of the gradient buffer its tensors' gradients fill
        assert b.part.stop - b.part.start == b.bucket.nbytes // 4
        assert b.part.start == min(runtime.spans[t][0] for t in b.bucket.tensors)


@pytest.mark.parametrize("cap_mb", [None, 0.5, 1.0])
def test_ddp_buckets_are_a_real_distributed_data_parallels(cap_mb: float | None) -> None:
    """Against a real DDP (torch 2.13, one gloo rank) over the same modules: the same buckets (as sets: within a
    LayerNorm autograd hands DDP the weight's gradient before the bias's, not in reverse registration order).

    torch 2.13 makes the first bucket 1 MiB only with its default cap (``_BucketCapacityConfig``: a bucket_cap_mb
    the user gives is the first bucket's limit too); a strategy's settings (``SyncSettings.of``) do the same."""
    runtime = _runtime(SMALL_GPT, "tp=1 pp=1 dp=2 mb=2 sync=ddp")
    real = _real_ddp_buckets(runtime, cap_mb)
    settings = SyncSettings.of(25.0 if cap_mb is None else cap_mb)
    ours = _ddp_indices(runtime, settings)
    assert [sorted(b) for b in ours] == [sorted(b) for b in real]
    assert len(ours) >= (2 if cap_mb is None else 4)


# ------------------------------------------------------------------------------------- the executor's buckets
TINY = "gpt2-345m:seq=16,layers=2,hidden=32,heads=4,vocab=64,precision=fp32"
T5 = "t5-base:layers=1,seq=12,dec_seq=8,hidden=32,heads=4,ffn=64,vocab=64,precision=fp32"


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        (SMALL_GPT, "tp=1 pp=1 dp=2 mb=2"),
        (SMALL_GPT, "tp=1 pp=1 dp=2 mb=2 sync=wfbp"),
        (SMALL_GPT, "tp=1 pp=1 dp=2 mb=2 sync=ddp cap=0.5"),
        (SMALL_GPT, "tp=1 pp=1 dp=2 mb=2 sync=mgwfbp groups=0-2/2-4/4-6"),
        (SMALL_GPT, "tp=1 pp=1 dp=2 mb=2 sync=mgwfbp-optimal"),
        (SMALL_GPT, "tp=1 pp=2 dp=2 mb=2 sync=ddp cap=0.3"),  # the LM head keeps its own copy on the last stage
        (SMALL_GPT, "tp=1 pp=2 dp=2 mb=4 schedule=interleaved sync=ddp cap=0.3"),  # two chunks per rank
        (SMALL_GPT, "tp=2 pp=1 dp=2 mb=2 sync=ddp cap=0.2"),  # tp shards: split and whole tensors
        (T5, "tp=1 pp=1 dp=2 mb=2 sync=ddp cap=0.01"),  # the decoder embedding and the head share the encoder's
        (T5, "tp=1 pp=1 dp=2 mb=2 sync=mgwfbp groups=0-1/1-3/3-5"),  # 2: the tied decoder embedding, no grads
    ],
)
def test_executor_ranks_issue_the_simulators_buckets(spec: str, text: str) -> None:
    """Every rank's gradients, from its own parameters, are the simulator's (``Model.stored_tensors``), and its
    all-reduces have the simulated GPU's names, layers and stages in the same order."""
    from distsim import simulate
    from distsim.core.cluster import get_cluster

    first = _runtime(spec, text)
    strategy = first.strategy
    sim = simulate(first.model, get_cluster("cpu-1x2").with_nodes(strategy.num_gpus // 2), strategy).timeline.df
    for rank in sorted({int(g) for g in first.grid[:, 0, :].flat}):  # one replica's ranks
        runtime = first if rank == 0 else _runtime(spec, strategy.describe(), rank)
        assert runtime.grad_units() == runtime.simulated_units()
        gpu = int(runtime.grid[runtime.pipe_rank, 0, 0])  # the simulated GPU of its pipeline rank
        rows = sim[(sim["gpu"] == gpu) & (sim["kind"] == "dp_allreduce") & ~sim["name"].str.startswith("tied")]
        want = list(rows.sort_values("start_s", kind="stable")[["name", "layer", "stage"]].itertuples(index=False))
        got = [(b.name, -1, runtime.pipe_rank) if b.bucket.ready is None else
               (b.name, b.bucket.ready, _stage_of(runtime, b.bucket.ready)) for b in runtime.buckets]  # fmt: skip
        assert got == [tuple(x) for x in want]


def _stage_of(runtime: Any, layer: int) -> int:
    return next(vs for vs, (lo, hi) in enumerate(runtime.stage_ranges) if lo <= layer < hi)
