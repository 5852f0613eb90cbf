from __future__ import annotations

from dataclasses import replace

import pytest

from distsim import Strategy, get_cluster, get_model
from distsim.core.errors import StrategyError
from distsim.core.strategy import check_strategy


@pytest.mark.parametrize(
    ("text", "degrees"),
    [("2M4P2D", (2, 4, 2)), ("2m4p1d", (2, 4, 1)), ("1M2P2D", (1, 2, 2)), ("16M1P1D", (16, 1, 1)), ("4D2M", (2, 1, 4))],
)
def test_distsim_notation(text: str, degrees: tuple[int, int, int]) -> None:
    s = Strategy.from_str(text)
    assert (s.tp, s.pp, s.dp) == degrees
    assert Strategy.from_str(str(s)) == s


def test_readable_form_round_trips() -> None:
    s = Strategy(
        tp=2,
        pp=4,
        dp=2,
        micro_batch_size=2,
        num_micro_batches=8,
        schedule="interleaved",
        virtual_stages=3,
        grad_sync="wfbp",
        partition=(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12),
    )
    assert Strategy.from_str(s.describe()) == s
    d = Strategy(pp=3, num_micro_batches=6, warmup_policy="B", max_in_flight=2)
    assert Strategy.from_str(d.describe()) == d
    assert str(s) == "2M4P2D"
    assert s.global_batch_size == 2 * 8 * 2 and s.num_gpus == 16 and s.num_stages == 12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": 0}, "tp must be a positive integer"),
        ({"schedule": "zigzag"}, "unknown schedule 'zigzag'"),
        ({"pp": 4, "num_micro_batches": 6, "schedule": "interleaved"}, "too few micro-batches for the interleaved"),
        ({"pp": 1, "schedule": "interleaved"}, "interleaved schedule needs pp >= 2"),
        ({"pp": 2, "virtual_stages": 2}, "virtual_stages=2 needs schedule=interleaved"),
        ({"pp": 2, "partition": (3,)}, "partition has 1 entries but the strategy has 2 stages"),
        ({"pp": 2, "partition": (3, 0)}, "every stage of the partition needs at least one layer"),
        ({"warmup_policy": "C"}, "warm-up policy must be A or B"),
        ({"grad_sync": "sometimes"}, "unknown grad_sync"),
        ({"max_in_flight": 0}, "max_in_flight (D) must be >= 1"),
    ],
)
def test_invalid_strategies_name_the_problem(kwargs: dict, message: str) -> None:
    with pytest.raises(StrategyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Strategy(**kwargs)


@pytest.mark.parametrize("text", ["2X4P", "tp=two", "hello", "2M2M", "tp=2 foo=3"])
def test_unreadable_strategy_text(text: str) -> None:
    with pytest.raises(StrategyError):
        Strategy.from_str(text)


def test_check_against_model_and_cluster() -> None:
    bert, testbed = get_model("bert-large"), get_cluster("distsim-testbed")
    check_strategy(Strategy.from_str("2M4P2D"), bert, testbed)
    with pytest.raises(
        StrategyError,
        match=r"uses tp\*pp\*dp = 2\*4\*1 = 8 GPUs but cluster distsim-testbed has 16 "
        r"\(use --nodes 2\)",
    ):
        check_strategy(Strategy.from_str("2M4P1D"), bert, testbed)
    with pytest.raises(StrategyError, match="tp=3 does not divide the attention heads"):
        check_strategy(Strategy(tp=3), bert, replace(testbed, nodes=1, gpus_per_node=3))
    with pytest.raises(StrategyError, match="pp=32 exceeds the 26 layers of bert-large"):
        check_strategy(Strategy(pp=32), bert, testbed.with_nodes(8))
    with pytest.raises(StrategyError, match="partition 10:10 covers 20 layers but bert-large has 26"):
        check_strategy(Strategy(pp=2, dp=8, partition=(10, 10)), bert, testbed)
    with pytest.raises(StrategyError, match="has no tensor-parallel split"):
        check_strategy(Strategy(tp=2, dp=8), get_model("vgg16"), testbed)


def test_a_strategy_is_its_three_concerns() -> None:
    """Degrees, pipeline and passes are checked separately and put back together to an equal strategy."""
    from distsim.core.parallel import ParallelDims, Passes, PipelineSpec

    s = Strategy.from_str("tp=2 pp=2 dp=2 mb=4 schedule=interleaved sync=ddp cap=5 recompute=full sp=1 zero=zero1")
    assert s.dims == ParallelDims(2, 2, 2) and str(s.dims) == "2M2P2D"
    assert s.pipeline.virtual_stages == 2 and s.pipeline.num_micro_batches == 4
    assert s.passes == Passes("ddp", 5.0, (), "full", None, True, "zero1")
    assert Strategy.of(s.dims, s.pipeline, s.passes) == s
    assert Strategy.of(ParallelDims(pp=2), PipelineSpec(schedule="dapple")).schedule == "1f1b"
    with pytest.raises(StrategyError, match="needs tp > 1"):
        Strategy.of(ParallelDims(dp=2), passes=Passes(sequence_parallel=True))
