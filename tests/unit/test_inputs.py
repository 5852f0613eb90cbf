"""Every bad model, cluster, plan or profile input is one line on stderr and exit status 2, and absurd sizes are
refused before they allocate (the rule of distsim/core/errors.py: never a traceback, never a silent wrong answer)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distsim import Strategy, simulate
from distsim.core.models import Model
from distsim.plans import Plan, StagePlan
from distsim.plans.simulate import SimulationTooLarge, estimate_size
from distsim.sim.flow.events import FlowOptions
from tests.unit.test_invariants import Scenario, scenarios
from tests.util import InterferingCosts, chain_model, hand_cluster, run_cli

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--cluster", "cpu-1x2", "--strategy", "1M1P2D"]


def assert_one_line_error(code: int, err: str, *needles: str) -> str:
    """Exit status 2, exactly one line on stderr (``distsim: error: ...``) containing every needle, no traceback."""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("distsim: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ------------------------------------------------------------------------------------------------- model files
LAYER = "name: m\nlayers:\n  - {name: a, forward_s: 0.01, %s}\n"
STACK = "name: m\ntransformer: {layers: %s, hidden: %s, heads: %s, seq: 16, vocab: 100}\n"


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        pytest.param(LAYER % "shape: {h: abc}", ["m.yaml layer 'a'", "shape h", "'abc'"], id="shape-not-integer"),
        pytest.param(
            LAYER % "params: 1" + "tp_constraints: {heads: abc}\n",
            ["tp_constraints heads", "'abc'"],
            id="tp-constraint-not-integer",
        ),
        pytest.param(LAYER % "params: 1" + "seq_len: abc\n", ["m.yaml: seq_len", "'abc'"], id="seq-len-not-integer"),
        pytest.param(
            "layers:\n  - {name: a, forward_s: .nan}\n", ["layer 'a'", "forward_s", "finite", "nan"], id="forward-nan"
        ),
        pytest.param(
            "layers:\n  - {name: a, forward_s: .inf}\n", ["layer 'a'", "forward_s", "finite", "inf"], id="forward-inf"
        ),
        pytest.param(LAYER % "out_bytes: -.inf", ["out_bytes", "finite"], id="out-bytes-minus-inf"),
        pytest.param(LAYER % "flops: 1e400", ["flops", "finite"], id="flops-overflow"),
        pytest.param(LAYER % "repeat: 2.5", ["repeat must be a positive integer, got 2.5"], id="repeat-fraction"),
        pytest.param(
            STACK % (0, 64, 4),
            ["m.yaml transformer: layers must be a positive integer, got 0"],
            id="transformer-no-layers",
        ),
        pytest.param(
            STACK % (2, 64, 5),
            ["m.yaml transformer: hidden (64) must be divisible by heads (5)"],
            id="heads-do-not-divide-hidden",
        ),
        pytest.param(
            STACK % (2, -64, 4),
            ["m.yaml transformer: hidden must be a positive integer, got -64"],
            id="hidden-negative",
        ),
        pytest.param(
            STACK % (2, 64.5, 4), ["transformer: hidden must be a positive integer, got 64.5"], id="hidden-fraction"
        ),
    ],
)
def test_bad_model_file_is_one_line(
    text: str, needles: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    code, _, err = run_cli(["simulate", "--model", str(path), *SMALL], capsys)
    assert_one_line_error(code, err, *needles)


@pytest.mark.parametrize(
    ("spec", "needles"),
    [
        ("gpt2-345m:layers=0", ["layers must be >= 1, got 0"]),
        ("gpt2-345m:heads=5", ["gpt2-345m", "hidden (1024) must be divisible by heads (5)"]),
        ("gpt2-345m:hidden=100", ["gpt2-345m", "hidden (100) must be divisible by heads (16)"]),
        ("t5-base:heads=7", ["t5-base", "hidden (768) must be divisible by heads (7)"]),
    ],
)
def test_bad_zoo_spec_is_one_line(spec: str, needles: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["simulate", "--model", spec, *SMALL], capsys)
    assert_one_line_error(code, err, *needles)


# ------------------------------------------------------------------------------------------- cluster, plan files
@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("base: cpu-1x2\ninter: {bandwidth_bytes_per_s: .nan}\n",
         ["c.yaml inter: bandwidth_bytes_per_s must be a finite number, got nan"]),
        ("base: cpu-1x2\ngpu: {memory_bytes: .inf}\n", ["c.yaml gpu: memory_bytes must be a finite number, got inf"]),
        ("base: cpu-1x2\ngpu: {peak_flops_per_s: 1e400}\n", ["c.yaml gpu: peak_flops_per_s", "finite"]),
        ("base: cpu-1x2\nintra: {latency_s: -1}\n", ["c.yaml intra: latency_s must be >= 0"]),
        ("base: cpu-1x2\nnodes: 2.5\n", ["c.yaml: nodes must be a positive integer, got 2.5"]),
        ("base: cpu-1x2\nnodes: 1e9\n", ["c.yaml", "2,000,000,000 GPUs, above the limit of 1,048,576"]),
    ],
)  # fmt: skip
def test_bad_cluster_file_is_one_line(
    text: str, needles: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    code, _, err = run_cli(["simulate", "--model", "gpt2-cpu", "--cluster", str(path), "--strategy", "1M1P2D"], capsys)
    assert_one_line_error(code, err, *needles)


def test_straggler_factor_must_be_finite(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["simulate", "--model", "gpt2-cpu", *SMALL, "--straggler", "1=inf"], capsys)
    assert_one_line_error(code, err, "slowdown factor of GPU 1 must be a finite number")


@pytest.mark.parametrize(
    ("body", "needles"),
    [
        ("micro_batches: .inf\nstages:\n  - {layers: [0, 6], devices: [0, 1]}\n",
         ["p.yaml: micro_batches must be a positive integer, got inf"]),
        ("micro_batch_size: .nan\nstages:\n  - {layers: [0, 6], devices: [0, 1]}\n",
         ["p.yaml: micro_batch_size must be a positive integer, got nan"]),
        ("stages:\n  - {layers: [0, 6], devices: '0-1000000000'}\n",
         ["p.yaml stage 0: devices '0-1000000000' name more than 1,048,576 GPUs"]),
    ],
)  # fmt: skip
def test_bad_plan_file_is_one_line(
    body: str, needles: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("model: gpt2-cpu\ncluster: cpu-1x2\n" + body)
    code, _, err = run_cli(["simulate", "--plan", str(path)], capsys)
    assert_one_line_error(code, err, *needles)


# ----------------------------------------------------------------------------------------------- profile files
def _broken_profile(tmp_path: Path, section: str, index: int | str, field: str, value: float) -> Path:
    data = json.loads((ROOT / "profiles" / "cpu-gloo.json").read_text())
    entry = data[section][sorted(data[section])[0] if index == "first" else index]
    entry[field] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))  # Python's json writes NaN and Infinity (and reads them back)
    return path


@pytest.mark.parametrize(
    ("section", "index", "field", "value", "needles"),
    [
        ("compute", "first", "mean_s", float("inf"), ["p.json: compute 'attention[", "mean_s must be a finite"]),
        ("compute", "first", "median_s", float("nan"), ["p.json: compute 'attention[", "median_s must be a finite"]),
        ("comm", 3, "median_s", float("inf"), ["p.json: comm[3]: median_s must be a finite number, got inf"]),
        ("comm", 0, "p90_s", float("-inf"), ["p.json: comm[0]: p90_s must be a finite number"]),
        ("fits", 0, "alpha_s", float("inf"), ["p.json: fits[0]: alpha_s must be a finite number, got inf"]),
        ("comm", 1, "bytes", float("inf"), ["p.json: comm[1]: malformed entry"]),
    ],
)
def test_non_finite_profile_entry_is_named(
    section: str,
    index: int | str,
    field: str,
    value: float,
    needles: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _broken_profile(tmp_path, section, index, field, value)
    args = ["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-2x1", "--strategy", "1M2P1D", "--profile", str(path)]
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, *needles)


# ---------------------------------------------------------------------------------------------- reading files
def _bomb(levels: int = 9) -> str:
    """A 'billion laughs' YAML model: nine aliases nine deep are 9**9 strings once expanded, in under 400 bytes."""
    parts, prev = ['&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'], "a"
    for name in "bcdefghijk"[: levels - 1]:
        parts.append(f"&{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        prev = name
    return "name: bomb\ndescription: [" + ", ".join(parts) + "]\nlayers:\n  - {name: x, forward_s: 0.01}\n"


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        pytest.param(_bomb(7), ["m.yaml: refused: its aliases expand it to more than 4,194,304 characters"],
                     id="alias-expansion"),
        pytest.param("layers: &a [*a]\n", ["m.yaml: refused: alias *a refers to a collection that contains it"],
                     id="recursive-alias"),
        pytest.param("name: x\ndescription: " + "[" * 5000 + "]" * 5000 + "\nlayers: [{name: a}]\n",
                     ["m.yaml: refused: it nests collections more than 100 deep"], id="deep-yaml"),
        pytest.param("name: x\nseq_len: " + "1" * 5000 + "\nlayers: [{name: a}]\n",
                     ["m.yaml: malformed file: Exceeds the limit (4300 digits)"], id="huge-integer-literal"),
    ],
)  # fmt: skip
def test_unreadable_yaml_is_one_line(
    text: str, needles: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Small documents that would be a traceback (Python's recursion or digit limits) or expand to megabytes."""
    path = tmp_path / "m.yaml"
    path.write_text(text)
    code, _, err = run_cli(["simulate", "--model", str(path), *SMALL], capsys)
    assert_one_line_error(code, err, *needles)


def test_deep_json_profile_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"schema": ' + "[" * 100_000 + "]" * 100_000 + "}")
    code, _, err = run_cli(["simulate", "--model", "gpt2-cpu", *SMALL, "--profile", str(path)], capsys)
    assert_one_line_error(code, err, "p.json: nested too deeply to read")


def test_shipped_profiles_and_traces_are_within_the_file_limits() -> None:
    from distsim.io.files import MAX_FILE_BYTES, load_profile, load_trace

    profiles = sorted((ROOT / "profiles").rglob("*.json"))
    traces = sorted(p for p in (ROOT / "traces").glob("*.json") if not p.name.endswith(".chrome.json"))
    assert profiles and traces
    for path in profiles:
        assert path.stat().st_size < MAX_FILE_BYTES["profile"] / 100
        load_profile(path)
    for path in traces:
        assert path.stat().st_size < MAX_FILE_BYTES["trace"] / 100
    load_trace(traces[-1])


# ------------------------------------------------------------------------------- resource guards (subprocess)
GUARD_AS_BYTES = 2 * 2**30
GUARD_TIMEOUT_S = 120


def run_guarded(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """The CLI in a child process with 2 GiB of address space and a generous timeout: a run that is not refused
    early fails the test by a memory error (a traceback, or a kill) or by the timeout, never by a measured time."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (GUARD_AS_BYTES, GUARD_AS_BYTES))

    proc = subprocess.run(
        [sys.executable, "-m", "distsim", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=limit,
        capture_output=True,
        text=True,
        timeout=GUARD_TIMEOUT_S,
    )
    return proc.returncode, proc.stdout, proc.stderr


MB_1E9 = ["--model", "gpt2-345m", "--cluster", "distsim-testbed", "--strategy", "2M4P2D"]


@pytest.mark.parametrize(
    ("files", "args", "needles"),
    [
        pytest.param({}, [*MB_1E9, "--micro-batches", "1000000000"],
                     ["about 219,000,000,013 tasks, above the limit of 5,000,000", "--max-tasks"],
                     id="a-billion-micro-batches"),
        pytest.param({}, ["--model", "gpt2-cpu", "--cluster", "cpu-2x1", "--strategy", "1M2P1D", "--micro-batches", "8",
                          "--profile", str(ROOT / "profiles" / "cpu-gloo.json"), "--samples", "100000"],
                     ["(195 per run x 100,000 samples), above the limit of 5,000,000", "fewer --samples"],
                     id="100k-stochastic-samples"),
        pytest.param({"m.yaml": "layers:\n  - {name: a, forward_s: 0.01, repeat: 1e12}\n"},
                     ["--model", "m.yaml", *SMALL],
                     ["m.yaml layer 'a': repeat is 1,000,000,000,000, above the limit of 10,000"], id="repeat-1e12"),
        pytest.param({"m.yaml": STACK % (1_000_000, 64, 4)}, ["--model", "m.yaml", *SMALL],
                     ["m.yaml transformer: layers is 1,000,000, above the limit of 10,000"], id="a-million-layers"),
        pytest.param({}, ["--model", "gpt2-345m:layers=1000000", *SMALL],
                     ["model gpt2-345m: layers is 1,000,000, above the limit of 10,000"], id="zoo-spec-million-layers"),
        pytest.param({}, ["--model", "t5-base:layers=6000", *SMALL],
                     ["model t5-base: 6,000 + 6,000 layers is above the limit of 10,000"], id="zoo-spec-t5-12k-layers"),
        pytest.param({"m.yaml": _bomb(9)}, ["--model", "m.yaml", *SMALL],
                     ["m.yaml: refused: its aliases expand it to more than 4,194,304 characters"], id="billion-laughs"),
        pytest.param({"m.yaml": None}, ["--model", "m.yaml", *SMALL],
                     ["m.yaml: the file is 52,4", " bytes, above the limit of 4,194,304 bytes for a model file"],
                     id="50-MB-model-file"),
        pytest.param({}, ["--model", "gpt2-cpu", "--cluster", "dgx-a100", "--nodes", "100000000", "--strategy",
                          "1M1P800000000D"], ["100,000,000 nodes x 8 GPUs = 800,000,000 GPUs, above the limit"],
                     id="a-hundred-million-nodes"),
        pytest.param({"p.yaml": "model: gpt2-cpu\ncluster: cpu-1x2\nstages:\n"
                                "  - {layers: [0, 6], devices: '0-999999999'}\n"},
                     ["--plan", "p.yaml"], ["p.yaml stage 0: devices '0-999999999' name more than 1,048,576 GPUs"],
                     id="a-billion-plan-devices"),
    ],
)  # fmt: skip
def test_huge_input_is_refused_early(
    files: dict[str, str | None], args: list[str], needles: list[str], tmp_path: Path
) -> None:
    for name, text in files.items():
        if text is None:  # 50 MB of valid layers, written without holding them in memory
            with (tmp_path / name).open("w") as fh:
                fh.write("layers:\n")
                line = "  - {forward_s: 0.001}\n"
                fh.write(line * (50 * 2**20 // len(line)))
        else:
            (tmp_path / name).write_text(text)
    code, _, err = run_guarded(["simulate", *args], tmp_path)
    assert_one_line_error(code, err, *needles)


# ------------------------------------------------------------------------------------ the size estimate itself
def _slack(model: Model, strategy: Strategy) -> int:
    """Tasks the estimate may count that the builder leaves out: transfers and all-reduces that move nothing (zero
    bytes, so no interference shadow; a layer without parameters, so no all-reduce)."""
    lanes = strategy.tp * strategy.dp
    return lanes * (2 * (strategy.num_stages - 1) * strategy.num_micro_batches + 2 * (model.num_layers + strategy.pp))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_estimate_counts_the_tasks_build_flow_emits(sc: Scenario) -> None:
    costs = InterferingCosts(sc.cluster, slowdowns=sc.interference)
    tasks, runs = estimate_size(sc.model, sc.cluster, sc.strategy, costs, sc.options)
    built = len(simulate(sc.model, sc.cluster, sc.strategy, costs, sc.options).flow)
    assert runs == 1 and built <= tasks <= built + _slack(sc.model, sc.strategy)
    if all(layer.params > 0 and layer.out_bytes > 0 for layer in sc.model.layers) and not any(sc.interference):
        assert tasks == built


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_estimate_counts_the_tasks_of_a_stages_plan(data: st.DataObject) -> None:
    widths = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    layers = data.draw(st.lists(st.integers(1, 3), min_size=len(widths), max_size=len(widths)))
    model = chain_model([(0.1, 0.2, data.draw(st.integers(0, 50)), 100.0) for _ in range(sum(layers))])
    stages, first_gpu, first_layer = [], 0, 0
    for width, n in zip(widths, layers, strict=True):
        stages.append(StagePlan((first_layer, first_layer + n), tuple(range(first_gpu, first_gpu + width))))
        first_gpu, first_layer = first_gpu + width, first_layer + n
    plan = Plan.of_stages("m", "c", stages, num_micro_batches=data.draw(st.integers(1, 4)),
                          micro_batch_size=max(widths) + data.draw(st.integers(0, 2)),
                          grad_sync=data.draw(st.sampled_from(["bulk", "wfbp"])))  # fmt: skip
    cluster = hand_cluster(nodes=2, gpus_per_node=8)
    costs = InterferingCosts(cluster, slowdowns=(data.draw(st.sampled_from([0.0, 0.5])), 0.1, 0.5, 0.1))
    options = FlowOptions(host=data.draw(st.booleans()))  # with the host: a launch per action and optimizer step
    tasks, _ = estimate_size(model, cluster, plan, costs, options)
    built = len(simulate(model, cluster, plan, costs, options).flow)
    # left out when they move nothing: optimizer steps (and their launches) and all-reduces of layers without
    # parameters (with their interference shadows on every replica), shadows of transfers that take no time
    slack = sum(widths) * (3 + 2 * model.num_layers + 2 * plan.strategy.num_micro_batches)
    assert built <= tasks <= built + slack


def test_limit_is_an_argument_of_simulate() -> None:
    model, cluster = chain_model([(0.1, 0.2, 10, 100.0)] * 4), hand_cluster(1, 2)
    strategy = Strategy(pp=2, num_micro_batches=100)
    tasks, _ = estimate_size(model, cluster, strategy)
    assert len(simulate(model, cluster, strategy, max_tasks=tasks).flow) == tasks
    with pytest.raises(SimulationTooLarge, match=f"about {tasks:,} tasks, above the limit of {tasks - 1:,}"):
        simulate(model, cluster, strategy, max_tasks=tasks - 1)
    assert simulate(model, cluster, strategy, max_tasks=None).flow


def test_long_stochastic_run_reports_progress_per_run(capsys: pytest.CaptureFixture[str]) -> None:
    """Above PROGRESS_TASKS the CLI says how big the run is and prints a progress line (at least every 10%)."""
    args = ["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-2x1", "--strategy", "1M2P1D", "--micro-batches",
            "100", "--profile", str(ROOT / "profiles" / "cpu-gloo.json"), "--samples", "130"]  # fmt: skip
    code, out, err = run_cli(args, capsys)
    assert code == 0 and "iteration time" in out
    lines = err.strip().splitlines()
    assert lines[0] == "simulating about 312,390 tasks (2,403 x 130 stochastic runs); this takes a while"
    assert lines[-1].startswith("130/130 stochastic runs") and len(lines) >= 11


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        (lambda d: d["iterations"][0]["columns"]["end_s"].__setitem__(3, float("nan")),
         ["t.json: iteration 0 has a start_s or end_s that is not finite"]),
        (lambda d: d["plan"].__setitem__("nodes", float("nan")), ["t.json: plan nodes must be a positive integer"]),
    ],
)  # fmt: skip
def test_non_finite_trace_is_one_line(
    change: Any, needles: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads((ROOT / "traces" / "gpt2-cpu-2x1-1M2P1D-1f1b-M8.json").read_text())
    change(data)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    code, _, err = run_cli(["validate", "--trace", str(path), "--samples", "0"], capsys)
    assert_one_line_error(code, err, *needles)
