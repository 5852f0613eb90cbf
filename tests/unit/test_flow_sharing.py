"""What a flow and a search share instead of computing again (issue 24): each task's slots tuple by number, the cost
of equal blocks of different layers, and a rank's gradient-bucket bound within a search. Results do not change
(tests/unit/test_result_sweep.py pins them); these tests check that the sharing is what it says."""

from __future__ import annotations

from collections import Counter

import pytest

from distsim import AnalyticCosts, FlowOptions, Strategy, get_cluster, get_model
from distsim.sim.costs import ComputeEvent, Cost
from distsim.sim.flow.estimate import bucket_bound
from distsim.sim.flow.events import resolve_partition, shared_partitions
from distsim.sim.flow.uniform import build_flow


@pytest.mark.parametrize("symmetric", [None, False])
def test_each_tasks_slot_code_names_its_slots_tuple(symmetric: bool | None) -> None:
    model, cluster = get_model("gpt2-345m"), get_cluster("distsim-testbed")
    strategy = Strategy.from_str("2M2P4D", num_micro_batches=4)
    flow = build_flow(model, cluster, strategy, AnalyticCosts(cluster), FlowOptions(symmetric=symmetric))
    assert flow.symmetric is (symmetric is None)
    assert len(flow.slot_code) == len(flow)
    assert all(flow.slot_sets[c] is s for c, s in zip(flow.slot_code, flow.slots, strict=True))
    assert len(flow.slot_sets) == len({id(s) for s in flow.slots})  # one number per tuple, by identity


class CountingCosts(AnalyticCosts):
    """Analytic costs that count how often each compute event is costed."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.asked: Counter[str] = Counter()

    def compute(self, ev: ComputeEvent) -> Cost:
        self.asked[ev.key] += 1
        return super().compute(ev)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_equal_blocks_of_different_layers_are_costed_once_per_flow(recompute: str) -> None:
    """GPT-3 1.3B's 24 transformer layers hold equal blocks: the balanced partition and the stage templates of 4
    stages each cost a compute event once, not once per layer and stage."""
    model, cluster = get_model("gpt3-1.3b"), get_cluster("dgx-a100").with_nodes(1)
    costs = CountingCosts(cluster)
    strategy = Strategy.from_str("2M4P1D", num_micro_batches=4, recompute=recompute)
    with shared_partitions():
        resolve_partition(model, strategy, costs)
        assert costs.asked and max(costs.asked.values()) == 1  # the partition's layer weights
        costs.asked.clear()
        flow = build_flow(model, cluster, strategy, costs)  # its partition is the one resolved above
    assert costs.asked and max(costs.asked.values()) <= 2  # once, and once more per derived event (its share)
    assert sum(n > 1 for n in costs.asked.values()) <= 1  # selective: the attention core's share of attention
    blocks = sum(len(layer.blocks) for layer in model.layers)
    assert sum(costs.asked.values()) < blocks  # far fewer than one per block of the model
    assert set(costs.asked) <= set(flow.keys)


def test_a_ranks_bucket_bound_is_answered_once_per_question_inside_a_search() -> None:
    model = get_model("gpt2-345m")
    strategy = Strategy.from_str("1M2P4D", num_micro_batches=4, grad_sync="ddp", bucket_cap_mb=1.0)
    larger = strategy.with_(bucket_cap_mb=100.0)
    held = set(range(0, 10))
    plain, plain_larger = bucket_bound(model, strategy, held), bucket_bound(model, larger, held)
    assert plain != plain_larger  # the bucket size is part of the question
    memo: dict = {}
    with shared_partitions(memo):
        first = bucket_bound(model, strategy, held)
        again = bucket_bound(model, strategy, set(held))
        other = bucket_bound(model, larger, held)
    assert first == plain and again is first and other == plain_larger
    assert len(memo["buckets"]) == 2
    assert bucket_bound(model, strategy, held) is not first  # outside the block: computed again


@pytest.mark.parametrize(
    ("strategy", "options"),
    [
        ("2M4P2D", {}),
        ("1M4P4D", {"p2p_blocking": True}),
        ("2M2P4D", {"link_sharing": "serialize"}),
        ("2M2P4D", {"host": False}),
        ("2M2P4D", {"exact_host": True}),
    ],
)
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_an_action_block_adds_the_tasks_its_host_chain_and_transfer_add_one_by_one(
    monkeypatch: pytest.MonkeyPatch, strategy: str, options: dict, schedule: str
) -> None:
    """EventFlow.add_action against the host task, chain and transfer it stands for, added one by one: the same
    tasks, columns, dependencies, releases and members (gradient buckets issued inside a backward: ddp)."""
    from distsim.sim.flow import uniform

    model, cluster = get_model("gpt2-345m"), get_cluster("distsim-testbed")
    s = Strategy.from_str(strategy, num_micro_batches=4, schedule=schedule, grad_sync="ddp", bucket_cap_mb=5.0,
                          **({"virtual_stages": 2} if schedule == "interleaved" else {}))  # fmt: skip
    costs = AnalyticCosts(cluster)
    blocks = build_flow(model, cluster, s, costs, FlowOptions(**options))
    plan = uniform._Builder._one_gpu_plan
    monkeypatch.setattr(uniform._Builder, "_one_gpu_plan", lambda self, *a: (*plan(self, *a)[:4], None))
    one_by_one = build_flow(model, cluster, s, costs, FlowOptions(**options))
    assert blocks.symmetric and len(blocks) == len(one_by_one) and blocks._keep  # blocks were used
    for column in ("duration_s", "slots", "kind", "name", "layer", "stage", "microbatch", "key", "slot_code"):
        assert list(getattr(blocks, column)) == list(getattr(one_by_one, column)), column
    assert blocks.deps == one_by_one.deps and blocks.releases == one_by_one.releases
    assert blocks.members == one_by_one.members
