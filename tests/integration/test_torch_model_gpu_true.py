"""`distsim profile --torch-model` on the zoo's timing path, on CPU: the same timing loop (compute.time_steps), FLOPs
of every layer's forward and backward, the in-situ self-check of the module's own blocks, and full recomputation of
a profiled module.

The CUDA side of the same functions (FedTimer's sleep and L2 sweep, launch times, CUDA events inside a Split call
and between a chain's blocks) needs a GPU and is not exercised here; what a launch time becomes in the profile is
(test_a_launch_time_lands_in_the_measurement_where_the_timer_measured_one).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from distsim.cli import main  # noqa: E402
from distsim.core.errors import ModelFileError  # noqa: E402
from distsim.core.models import model_from_dict  # noqa: E402
from distsim.io.files import load_profile  # noqa: E402
from distsim.profiler.compute import PhaseTimes, Split, Step, point, time_phase, time_steps  # noqa: E402
from distsim.profiler.insitu import CHAIN_LAYERS, CHAIN_ROUNDS  # noqa: E402
from distsim.profiler.torch_model import trace  # noqa: E402
from distsim.profiler.torch_timing import _measurement, chain_layers, event, time_chain  # noqa: E402
from distsim.sim.profile_db import ProfileDB  # noqa: E402
from tests.util import run_cli  # noqa: E402

HELPER = "tests.torch_helper"
FAST = ["--repeats", "2", "--warmup", "1"]
BATCH, WIDTH = 8, 64
"""make_mlp's example batch and block width: Linear(16, 64), 3 x (Linear(64, 64), ReLU), Linear(64, 4)."""


def _profile(path: Path) -> ProfileDB:
    try:
        main(["profile", "--torch-model", f"{HELPER}:make_mlp", "--out", str(path), *FAST])
    except SystemExit as exc:
        assert not exc.code, f"distsim profile exited {exc.code}"
    return load_profile(path)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ProfileDB]:
    """make_mlp profiled once on CPU (its path and profile)."""
    path = tmp_path_factory.mktemp("mlp") / "mlp.json"
    return path, _profile(path)


def _torch_events(db: ProfileDB) -> dict[str, Any]:
    return {k: m for k, m in db.compute.items() if k.startswith("torch:")}


def _kind(key: str) -> str:
    return "pre" if ".pre[" in key else "post" if ".post[" in key else "block"


# ------------------------------------------------------------------------------------------------------- the profile
def test_a_cpu_profile_records_a_self_check_of_the_modules_blocks(
    mlp: tuple[Path, ProfileDB], capsys: pytest.CaptureFixture[str]
) -> None:
    path, db = mlp
    check = db.provenance["self_check"]
    (chain,) = check["chains"]
    assert chain["label"] == "Sequential blocks 1..3" and chain["layers"] == [1, 2, 3] and chain["blocks"] == 3
    assert chain["ratio"] > 0 and chain["insitu_s"] > 0 and check["stage_ratio"] > 0
    assert "consecutive blocks of the module" in check["method"] and check["events"] == 2  # the block's F and B
    assert db.provenance["runs"][0]["self_check"] == check
    for key, m in _torch_events(db).items():  # the chain holds the blocks only: pre and post are not checked
        assert (m.insitu_ratio is not None and m.insitu_ratio > 0) == (_kind(key) == "block"), key
    code, out, _ = run_cli(["profile", "show", str(path)], capsys)
    assert code == 0 and "self-check, isolated / in-situ time" in out and "Sequential blocks 1..3" in out
    assert "none recorded" not in out


def test_a_cpu_profile_records_no_launch_time_as_the_zoo_records_none(mlp: tuple[Path, ProfileDB]) -> None:
    """On CPU the host runs the work: a launch time would make the simulator model a host stream pacing it (see
    torch_timing._measurement); the zoo's CPU events have none either."""
    _, db = mlp
    events = _torch_events(db)
    assert len(events) == 6 and all(m.launch_s is None for m in events.values())
    assert all(len(m.samples_s) == 2 and m.repeats == 2 for m in events.values())


def test_every_layers_forward_and_backward_carries_its_counted_flops(mlp: tuple[Path, ProfileDB]) -> None:
    """Matmul FLOPs, 2 x batch x in x out per product, as torch's counter counts them."""
    _, db = mlp
    flops = {(_kind(k), k.split("/")[1]): m.flops for k, m in _torch_events(db).items()}
    block = 2 * BATCH * WIDTH * WIDTH
    assert flops == {
        ("pre", "F"): 2 * BATCH * 16 * WIDTH,
        ("pre", "B"): 2 * BATCH * 16 * WIDTH,  # the weight's gradient only: the batch needs none
        ("block", "F"): block,
        ("block", "B"): 2 * block,  # the input's and the weight's gradients
        ("post", "F"): 2 * BATCH * WIDTH * 4,
        ("post", "B"): 2 * 2 * BATCH * WIDTH * 4,
    }
    layers = db.model["layers"]  # the layer graph's forward FLOPs per sample
    assert layers[0]["blocks"][0]["flops"] == 2 * 16 * WIDTH and layers[1]["blocks"][0]["flops"] == block / BATCH


# -------------------------------------------------------------------------------------------------- the self-check
def test_the_chain_is_up_to_four_consecutive_blocks_from_the_second() -> None:
    deep = trace(f"{HELPER}:make_deep_mlp", "cpu")  # pre, 6 blocks, post
    assert [i for i, _ in chain_layers(deep)] == [2, 3, 4, 5] == list(range(2, 2 + CHAIN_LAYERS))
    timing = time_chain(deep, warmup=0, rounds=CHAIN_ROUNDS)
    block = {event(deep, deep.layers[2], p).key for p in "FB"}
    assert len(timing["keys"]) == 2 * CHAIN_LAYERS and set(timing["keys"]) == block  # forwards, then backwards
    assert timing["keys"][0].split("/")[1] == "F" and timing["keys"][-1].split("/")[1] == "B"
    assert [len(s) for s in timing["samples_s"]] == [CHAIN_ROUNDS] * 2 * CHAIN_LAYERS
    assert all(t > 0 for s in timing["samples_s"] for t in s)


def test_a_module_that_is_one_layer_has_no_chain(tmp_path: Path) -> None:
    user = tmp_path / "one.py"
    user.write_text("import torch\n\ndef make():\n    return torch.nn.Linear(4, 2), torch.randn(3, 4)\n")
    traced = trace(f"{user}:make", "cpu")
    assert traced.whole and chain_layers(traced) == []
    assert [i for i, _ in chain_layers(trace(f"{HELPER}:make_mlp", "cpu"))] == [1, 2, 3]  # all 3 blocks


# ------------------------------------------------------------------------------------------------ the timing loop
def test_time_steps_records_named_calls_and_a_split_calls_parts() -> None:
    """One loop for the zoo and a torch module: a Split call's parts are recorded under their names, not the call's;
    CPU records no launch time."""
    cpu = torch.device("cpu")
    w = torch.randn(32, 32, requires_grad=True)

    def forward() -> Step:
        x = torch.randn(4, 32)

        def run() -> Split:
            a = point(cpu)
            y = x @ w
            b = point(cpu)
            z = (y @ w).sum()
            return Split(z, {"first/F": (a, b), "second/F": (b, point(cpu))})

        return "F", run

    def backward(z: Any) -> list[Step]:
        return [("B", z.backward)]

    times = time_steps(forward, backward, None, cpu, warmup=1, repeats=5)
    assert set(times) == {"first/F", "second/F", "B"}
    for t in times.values():
        assert len(t.times_s) == 5 and t.launch_s is None and t.starved == 0 and t.warmup_rounds == 1
        assert all(s > 0 for s in t.times_s)
    only = time_steps(forward, backward, {"B"}, cpu, warmup=0, repeats=2)
    assert set(only) == {"B"}  # the other calls run, unrecorded


def test_the_zoo_phase_timer_is_the_same_loop() -> None:
    lin = torch.nn.Linear(16, 16)
    grad = torch.ones(4, 16)
    fresh: Callable[[], tuple[Any, ...]] = lambda: (torch.randn(4, 16),)  # noqa: E731
    for phase in "FB":
        t = time_phase(lin, fresh, grad, phase, torch.device("cpu"), warmup=2, repeats=6)
        assert len(t.times_s) == 6 and t.launch_s is None and t.warmup_rounds == 2


def test_a_launch_time_lands_in_the_measurement_where_the_timer_measured_one() -> None:
    """What the CUDA timer hands back (launch seconds per call) becomes the event's mean launch_s, as the zoo's;
    CPU's None stays None."""
    cuda_like = _measurement(PhaseTimes([1e-3, 3e-3], [1e-4, 3e-4]), 5.0)
    assert cuda_like.launch_s == pytest.approx(2e-4) and cuda_like.seconds == pytest.approx(2e-3)
    assert cuda_like.flops == 5.0 and cuda_like.samples_s == (1e-3, 3e-3)
    assert _measurement(PhaseTimes([1e-3, 3e-3], None), None).launch_s is None


# ---------------------------------------------------------------------------------------------------- recomputation
def _rows(out: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(out)))


def test_full_recomputation_reruns_each_blocks_measured_forward_only(
    mlp: tuple[Path, ProfileDB], capsys: pytest.CaptureFixture[str]
) -> None:
    """The simulator's recompute of a profiled module: each block's forward event again (its measured time), never
    pre or post, as a training loop that checkpoints its blocks (torch.utils.checkpoint) reruns them only."""
    path, db = mlp
    args = ["--cluster", "cpu-2x1", "--nodes", "1", "--strategy", "1M1P1D", "--micro-batches", "2"]
    code, out, err = run_cli(["simulate", "--model", str(path), *args, "--recompute", "full", "--csv", "-"], capsys)
    assert code == 0, err
    rows = _rows(out)
    again = [r for r in rows if r["kind"] == "recompute"]
    assert sorted({r["name"] for r in again}) == ["1", "2", "3"] and len(again) == 3 * 2  # 3 blocks x 2 micro-batches
    block = next(m for k, m in _torch_events(db).items() if _kind(k) == "block" and "/F/" in k)
    for r in again:
        assert float(r["end_s"]) - float(r["start_s"]) == pytest.approx(block.seconds, rel=1e-9)
    assert [layer["recomputable"] for layer in db.model["layers"] if "recomputable" in layer] == [False, False]

    traced = trace(f"{HELPER}:make_mlp", "cpu")  # a real step with each block checkpointed
    assert _rerun_in_backward(traced.module, traced.units, traced.batch) == {r["name"] for r in again}


def _rerun_in_backward(module: Any, blocks: list[str], batch: Any) -> set[str]:
    """Names of the top-level children whose forward runs again in the backward of a step that wraps each of
    `blocks` in torch.utils.checkpoint."""
    from torch.utils.checkpoint import checkpoint

    rerun: set[str] = set()
    backward = [False]
    for name, child in module.named_children():
        # a pre-hook: non-reentrant checkpointing stops recomputing once it has the saved tensors it needs
        child.register_forward_pre_hook(lambda *_a, name=name: rerun.add(name) if backward[0] else None)
    x = batch
    for name, child in module.named_children():
        x = checkpoint(child, x, use_reentrant=False) if name in blocks else child(x)
    backward[0] = True
    x.sum().backward()
    return rerun


def test_the_model_file_reads_recomputable() -> None:
    layer = {"name": "head", "params": 10, "flops": 1.0}
    model = model_from_dict({"layers": [{"name": "a", "params": 10, "flops": 1.0}, {**layer, "recomputable": False}]})
    assert [x.recomputable for x in model.layers] == [True, False]
    with pytest.raises(ModelFileError, match="recomputable must be true or false"):
        model_from_dict({"layers": [{**layer, "recomputable": "no"}]})
