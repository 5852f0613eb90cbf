"""Mixture-of-experts MLPs (Mixtral): parameters against the publication, the FLOPs of the routed experts only, the
kept activations, and the inputs that state them (spec, Megatron launch line, the CLI)."""

from __future__ import annotations

import pytest

from distsim import get_model
from distsim.core.megatron import parse_megatron_args
from distsim.core.models.ops import GemmOp
from tests.util import run_cli


def _expert_params(model: object) -> int:
    """The routed experts' parameters (not the norm, the router or the shared experts)."""
    total = 0
    for b in (b for layer in model.layers for b in layer.blocks if b.op == "moe"):
        shared = 2 if "shared_ffn" in dict(b.shape) else 0
        total += sum(n for n, split in b.tensors[2 : len(b.tensors) - shared] if split)
    return total


def _active(model: object, k: int, experts: int) -> float:
    """Parameters a token runs through: all but the experts it is not routed to."""
    return model.params - _expert_params(model) * (1 - k / experts)


@pytest.mark.parametrize(("name", "total", "active", "digits", "k", "experts"),
                         [("mixtral-8x7b", 46.7e9, 12.9e9, 1, 2, 8), ("mixtral-8x22b", 141e9, 39e9, 0, 2, 8),
                          ("deepseek-moe-16b", 16.4e9, 2.8e9, 1, 6, 64)])  # fmt: skip
def test_moe_parameters_match_the_publications(name: str, total: float, active: float, digits: int, k: int,
                                               experts: int) -> None:  # fmt: skip
    """Jiang et al. 2024: Mixtral 8x7B has 46.7 B parameters, 12.9 B active per token; 8x22B 141 B and 39 B (Mistral
    AI); Dai et al. 2024: DeepSeekMoE 16B 16.4 B, 2.8 B active (its first layer dense, 2 shared experts). Totals
    within 0.5 %; active counts to the digits published (their rounding)."""
    m = get_model(name)
    assert m.params == pytest.approx(total, rel=0.005)
    assert round(_active(m, k, experts) / 1e9, digits) == active / 1e9


def test_a_token_runs_only_its_experts() -> None:
    """The GEMMs' forward FLOPs are 2 per active weight per token: the attention's, the router's, top_k experts'
    (never all of them) and the LM head's."""
    m = get_model("mixtral-8x7b:layers=2")
    s, h, vocab = m.seq_len, 4096, 32000
    gemm_flops = sum(op.flops for layer in m.layers for b in layer.blocks for op in b.ops if isinstance(op, GemmOp))
    norms = (2 * 2 + 1) * h
    assert gemm_flops == pytest.approx(2 * s * (_active(m, 2, 8) - vocab * h - norms), rel=1e-12)


def test_an_moe_layer_keeps_the_routed_copies() -> None:
    """Beyond a dense layer's attention tensors, an MoE layer keeps the router's input and fp32 probabilities and
    the top_k permuted copies of each token (whole), and each copy's SwiGLU activations (6 ffn, split over tp)."""
    m = get_model("mixtral-8x7b:layers=1,seq=1024")
    dense = get_model("llama3-8b:layers=1,seq=1024,hidden=4096,heads=32,kv_heads=8,ffn=14336")
    s, h, f = 1024, 4096, 14336
    moe, llama = m.layers[1], dense.layers[1]
    assert moe.saved_bytes - llama.saved_bytes == (4 * s * 8 + 2 * s * 2 * h) - 0  # router probs, 2 copies; fc1 input
    assert moe.saved_sharded_bytes - llama.saved_sharded_bytes == 6 * f * s  # one more routed copy's activations


def test_a_mixtral_launch_line_is_the_zoo_model() -> None:
    line = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
            "--group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 32768 "
            "--position-embedding-type rope --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights "
            "--disable-bias-linear --attention-dropout 0 --hidden-dropout 0 --vocab-size 32000 --num-experts 8 "
            "--moe-router-topk 2 --micro-batch-size 1 --global-batch-size 256 --tensor-model-parallel-size 2 "
            "--pipeline-model-parallel-size 4 --sequence-parallel --use-distributed-optimizer --bf16")  # fmt: skip
    job = parse_megatron_args(line)
    model, zoo = get_model(job.spec), get_model("mixtral-8x7b")
    assert model.params == zoo.params
    assert [b.shape for layer in model.layers for b in layer.blocks] == [
        b.shape for layer in zoo.layers for b in layer.blocks
    ]
    assert job.unknown == ()


def test_mixtral_simulates(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "mixtral-8x7b:layers=4", "--cluster", "dgx-h100", "--nodes", "1", "--strategy",
            "2M2P2D", "--micro-batches", "4", "--sequence-parallel"]  # fmt: skip
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert "iteration time" in out and "peak memory" in out
    assert "MoE 8 experts top-2" in get_model("mixtral-8x7b").description


# ----------------------------------------------------------------------------------------------- expert parallelism
def test_an_all_to_all_moves_all_but_its_own_share() -> None:
    """NCCL's all-to-all (grouped sends): each of n members keeps 1/n of its B bytes and sends the rest, one step per
    peer: (n - 1) alpha + (n - 1)/n B / bandwidth, inside a node and, at one NIC's share, across nodes."""
    from distsim.sim.costs import AnalyticCosts, CommEvent
    from tests.util import hand_cluster

    cluster = hand_cluster(2, 4, intra_bw=100e9, inter_bw=10e9, intra_lat=2e-6, inter_lat=5e-6)
    costs = AnalyticCosts(cluster)
    b = 64e6
    assert costs.comm(CommEvent("all_to_all", int(b), 4, "intra", 1)).seconds == pytest.approx(
        3 * 2e-6 + 0.75 * b / 100e9
    )
    inter = cluster.inter_collective_bandwidth(1)
    assert costs.comm(CommEvent("all_to_all", int(b), 8, "inter", 1)).seconds == pytest.approx(
        7 * 5e-6 + 7 / 8 * b / inter
    )


def _mixtral(ep: int, **kw: object) -> tuple[object, object, object]:
    from distsim import Strategy, get_cluster

    model = get_model("mixtral-8x7b:layers=2,seq=512")
    cluster = get_cluster("dgx-h100").with_nodes(1)
    return model, cluster, Strategy(tp=2, dp=4, ep=ep, num_micro_batches=2, sequence_parallel=True, **kw)


def test_expert_parallelism_dispatches_and_combines_around_the_experts() -> None:
    """ep=2: each MoE block's forward is router+permutation, the dispatch all-to-all, the experts, the combine
    all-to-all, the rest; backward the same in reverse. Each all-to-all carries the micro-batch's routed copies
    (seq x top_k x h x 2 bytes) over 2 GPUs of one node."""
    from distsim import simulate
    from distsim.sim.flow.events import K_EP

    model, cluster, strategy = _mixtral(2)
    r = simulate(model, cluster, strategy)
    flow = r.flow
    g = flow.simulated_gpus[0]
    moe_ops = [(flow.kind[i], flow.name[i]) for i in range(len(flow))
               if flow.layer[i] == 1 and flow.microbatch[i] == 0 and any(s[0] == g for s in flow.slots[i])
               and (".dispatch" in flow.name[i] or ".experts" in flow.name[i] or ".combine" in flow.name[i]
                    or flow.kind[i] == K_EP)]  # fmt: skip
    names = [n.split(" ")[-1] if k == K_EP else n.split(".")[-1] for k, n in moe_ops]
    assert names == ["dispatch", "dispatch", "experts", "combine", "combine",  # forward
                     "combine", "combine", "experts", "dispatch", "dispatch"]  # backward  # fmt: skip
    a2a = next(i for i, k in enumerate(flow.kind) if k == K_EP)
    assert flow.keys[flow.key[a2a]] == f"all_to_all/intra/n=2/bytes={512 * 2 * 4096 * 2}"
    assert r.cost_table() is not None


def test_expert_parallelism_shards_the_experts_and_their_memory() -> None:
    """Each of ep ranks keeps experts/ep experts' weights, gradients and optimizer states; the rest stays whole."""
    from distsim import simulate
    from distsim.core.models.moe import shard_experts

    model = get_model("mixtral-8x7b:layers=2,seq=512")
    experts = _expert_params(model)
    for ep in (2, 4):
        sharded = shard_experts(model, ep)
        assert sharded.params == model.params - experts + experts // ep
        assert dict(sharded.layers[1].blocks[1].shape)["ep"] == ep
    peaks = [simulate(*_mixtral(ep)).peak_memory_bytes for ep in (1, 2, 4)]
    assert peaks[0] > peaks[1] > peaks[2]


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("symmetric", [None, False])
def test_the_task_estimate_counts_the_all_to_alls(recompute: str, symmetric: bool | None) -> None:
    from distsim import simulate
    from distsim.plans.simulate import estimate_size
    from distsim.sim.flow.events import FlowOptions

    model, cluster, strategy = _mixtral(2, recompute=recompute)
    options = FlowOptions(symmetric=symmetric)
    tasks, _ = estimate_size(model, cluster, strategy, options=options)
    r = simulate(model, cluster, strategy, options=options)
    assert tasks == len(r.flow)
    if symmetric is False:  # every GPU simulated: the same iteration as one GPU standing for them
        assert r.iteration_time_s == pytest.approx(simulate(model, cluster, strategy).iteration_time_s)


def test_expert_parallelism_is_refused_where_it_cannot_run() -> None:
    from dataclasses import replace

    from distsim import Strategy, get_cluster
    from distsim.core.errors import DistsimError
    from distsim.core.strategy import check_strategy

    cluster = get_cluster("dgx-h100").with_nodes(1)
    with pytest.raises(DistsimError, match="has none"):
        check_strategy(Strategy(dp=8, ep=2), get_model("llama3-8b:layers=2"), cluster)
    with pytest.raises(DistsimError, match="must divide the 8 experts"):
        check_strategy(
            Strategy(dp=6, ep=3),
            get_model("mixtral-8x7b:layers=2"),
            replace(cluster, gpus_per_node=6),
        )
    with pytest.raises(DistsimError, match="ep=3 must divide dp=4"):
        Strategy(tp=2, dp=4, ep=3)


def test_expert_groups_that_straddle_nodes_unevenly_are_refused() -> None:
    """dp=6 over 2 nodes of 3 GPUs, ep=2: the groups (0,1), (2,3), (4,5): one crosses nodes, two do not."""
    from dataclasses import replace

    from distsim import Strategy, simulate
    from distsim.core.errors import DistsimError
    from distsim.core.models.arch import LLAMA
    from distsim.core.models.graph import BF16_MIXED
    from distsim.core.models.transformer import decoder_only
    from tests.util import hand_cluster

    model = decoder_only("moe", 2, 256, 8, 64, 1000, "", f=512, precision=BF16_MIXED,
                         arch=replace(LLAMA, experts=4, top_k=2))  # fmt: skip
    cluster = hand_cluster(2, 3)
    with pytest.raises(DistsimError, match="straddle nodes unevenly"):
        simulate(model, cluster, Strategy(dp=6, ep=2))


def test_a_mixtral_launch_line_with_expert_parallelism() -> None:
    line = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
            "--group-query-attention --num-query-groups 8 --seq-length 4096 --position-embedding-type rope "
            "--normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear "
            "--attention-dropout 0 --hidden-dropout 0 --vocab-size 32000 --num-experts 8 --moe-router-topk 2 "
            "--expert-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 256 "
            "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 --use-distributed-optimizer "
            "--bf16")  # fmt: skip
    job = parse_megatron_args(line)
    assert job.strategy["ep"] == 8 and job.degrees(64) == (1, 4, 16, 16)
    assert get_model(job.spec).params == get_model("mixtral-8x7b").params


def test_a_skewed_router_paces_the_experts_and_the_exchanges() -> None:
    """moe_load 1.5: the most loaded rank's experts receive 1.5 x the mean routed tokens; its experts' compute and
    both all-to-alls (its share of the exchange) take 1.5 x as long as balanced routing's, and the rest not at all;
    a more skewed router is never faster."""
    from distsim import Strategy, get_cluster, simulate
    from distsim.sim.flow.events import K_EP

    cluster = get_cluster("dgx-h100").with_nodes(1)
    strategy = Strategy(dp=8, ep=2, num_micro_batches=2)
    runs = {}
    for load in (1, 1.5, 2):
        model = get_model(f"mixtral-8x7b:layers=2,seq=512,moe_load={load}")
        runs[load] = simulate(model, cluster, strategy)

    def durations(r: object, part: str) -> list[float]:
        f = r.flow
        return [f.duration_s[i] for i in range(len(f)) if f.name[i].endswith(part) and f.microbatch[i] == 0]

    balanced, skewed = runs[1], runs[1.5]
    assert durations(skewed, ".experts") == pytest.approx([1.5 * d for d in durations(balanced, ".experts")])
    assert durations(skewed, ".dispatch") == pytest.approx(durations(balanced, ".dispatch"))
    a2a = [(i, r.flow) for r in (balanced, skewed) for i, k in enumerate(r.flow.kind) if k == K_EP][:1]
    keys = {r.flow.keys[r.flow.key[i]] for r in (balanced, skewed) for i, k in enumerate(r.flow.kind) if k == K_EP}
    assert f"all_to_all/intra/n=2/bytes={512 * 2 * 4096 * 2}" in keys
    assert f"all_to_all/intra/n=2/bytes={int(1.5 * 512 * 2 * 4096 * 2)}" in keys
    assert a2a
    times = [runs[load].iteration_time_s for load in (1, 1.5, 2)]
    assert times == sorted(times) and times[0] < times[-1]


def test_the_grid_tries_expert_parallel_degrees() -> None:
    """--ep 1,2,4: each degree where it divides dp and the 8 experts; an expert-parallel rank's memory holds its
    share of the experts; a dense model keeps its strategies."""
    from distsim import get_cluster
    from distsim.search.grid import GridSpec, grid_search

    cluster = get_cluster("dgx-h100").with_nodes(1)
    spec = GridSpec(gpus=8, global_batch=16, micro_batch_sizes=(1,), tp_degrees=(2,), pp_degrees=(1, 2),
                    ep_degrees=(1, 2, 4))  # fmt: skip
    r = grid_search(get_model("mixtral-8x7b:layers=4,seq=512"), cluster, spec, workers=1)
    seen = {(p.strategy.dp, p.strategy.ep) for p in r.points}
    assert seen == {(4, 1), (4, 2), (4, 4), (2, 1), (2, 2)}
    by_ep = {p.strategy.ep: p.peak_memory_bytes for p in r.points if p.strategy.dp == 4}
    assert by_ep[1] > by_ep[2] > by_ep[4]
    assert "ep" in r.table().columns
    dense = grid_search(get_model("llama3-8b:layers=4,seq=512"), cluster, spec, workers=1)
    assert {p.strategy.ep for p in dense.points} == {1}


def test_the_shipped_mixtral_example_is_the_zoo_model_with_expert_parallelism() -> None:
    from pathlib import Path

    line = (Path(__file__).parents[2] / "examples" / "megatron" / "mixtral-8x7b.sh").read_text()
    job = parse_megatron_args(line)
    assert job.unknown == ()
    assert get_model(job.spec).params == get_model("mixtral-8x7b").params
    assert job.strategy["ep"] == 8 and job.degrees(64) == (2, 4, 8, 32)
