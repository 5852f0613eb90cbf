"""The bad-input sweep: every mistake a user can make on every command is one line naming the problem, exit status
2, nothing written, and bounded memory and time.

Each case runs the command line in this process (fast) under an alarm and checks the peak-RSS increase; the inputs
are written into a fresh directory first, and afterwards that directory holds exactly what was put there. The harness
is ``tests/sweep.py``; ``test_bad_inputs_*.py`` hold the sweep's cases of further commands.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.sweep import check_bad_input, write_files

REPO = Path(__file__).resolve().parents[2]
PROFILE = str(REPO / "profiles" / "cpu-gloo.json")
TRACE = str(REPO / "traces" / "gpt2-cpu-1x2-1M2P1D-1f1b-M4.json")
SIM = ["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-2x1", "--strategy", "1M2P1D", "--micro-batches", "4"]
GRID = ["search", "grid", "--model", "bert-exlarge", "--cluster", "distsim-a10", "--global-batch", "16"]
DAPPLE = ["search", "dapple", "--model", "bert-large", "--cluster", "dapple-a", "--global-batch", "16"]
TINY = "gpt2-345m:seq=32,layers=2,hidden=64,heads=4,vocab=256,precision=fp32"
PROF = ["profile", "--model", TINY, "--cluster", "cpu-1x2", "--strategy", "1M1P2D"]
EXEC = ["execute", "--model", "gpt2-cpu", "--cluster", "cpu-1x2", "--strategy", "1M2P1D", "--micro-batches", "2"]

# Files a case may refer to as {name}; written into the case's directory before it runs.
FILES: dict[str, str] = {
    "bad.json": "{ not json",
    "bad.yaml": "layers: [unclosed\n",
    "empty.yaml": "",
    "list.yaml": "- 1\n- 2\n",
    "unknown-key.yaml": "name: m\nlayers:\n  - {name: a, forward_s: 0.01, paramz: 3}\n",
    "negative.yaml": "name: m\nlayers:\n  - {name: a, forward_s: -0.01}\n",
    "cluster-key.yaml": "base: cpu-1x2\nnodez: 2\n",
    "cluster-nan.yaml": "base: cpu-1x2\ngpu: {peak_flops_per_s: fast}\n",
    "small-gpu.yaml": "base: cpu-1x2\ngpu: {memory_bytes: 1.0e6}\n",
    "plan-overlap.yaml": "model: gpt2-cpu\ncluster: cpu-2x1\nmicro_batches: 2\nstages:\n"
    "- {layers: [0, 3], devices: [0]}\n- {layers: [3, 6], devices: [0]}\n",
    "plan-gap.yaml": "model: gpt2-cpu\ncluster: cpu-2x1\nmicro_batches: 2\nstages:\n"
    "- {layers: [0, 2], devices: [0]}\n- {layers: [3, 6], devices: [1]}\n",
    "plan-nogpu.yaml": "model: gpt2-cpu\ncluster: cpu-2x1\nmicro_batches: 2\nstages:\n"
    "- {layers: [0, 3], devices: [0]}\n- {layers: [3, 6], devices: [7]}\n",
    "profile.yaml": "schema: distsim-profile\n",
    "profile-schema.json": json.dumps({"schema": "something-else", "version": 1}),
    "trace-schema.json": json.dumps({"schema": "distsim-profile", "version": 1}),
    "emptydir/.keep": "",
}

CASES: list[tuple[str, list[str], str]] = [
    # simulate: names, strategies, options
    ("unknown model", ["simulate", "--model", "gpt5", "--cluster", "dgx-a100", "--strategy", "8M"],
     "unknown model 'gpt5'"),
    ("unknown cluster", ["simulate", "--model", "gpt2-cpu", "--cluster", "dgx-z", "--strategy", "8M"],
     "unknown cluster 'dgx-z'"),
    ("unreadable strategy", [*SIM[:5], "--strategy", "8Q"], "cannot read strategy '8Q'"),
    ("strategy does not fit the cluster", [*SIM[:5], "--strategy", "1M4P1D"], "uses tp*pp*dp = 1*4*1 = 4 GPUs"),
    ("partition not numbers", [*SIM, "--partition", "a:b"], "--partition expects layer counts like 23:25"),
    ("partition wrong total", [*SIM, "--partition", "2:2"], "partition"),
    ("interleaved M not a multiple of pp", [*SIM[:-1], "3", "--schedule", "interleaved"], "multiple of pp=2"),
    ("straggler syntax", [*SIM, "--straggler", "fast"], "--straggler expects GPU=FACTOR"),
    ("rank order", [*SIM, "--rank-order", "tp,pp"], "rank"),
    ("strict without profile", [*SIM, "--strict"], "--strict needs --profile"),
    ("missing profile", [*SIM, "--profile", "{dir}/none.json"], "none.json: no such file"),
    ("profile not json", [*SIM, "--profile", "{dir}/profile.yaml"], "a profile database is a .json file"),
    ("malformed profile", [*SIM, "--profile", "{dir}/bad.json"], "malformed JSON at line 1"),
    ("profile of another schema", [*SIM, "--profile", "{dir}/profile-schema.json"], "profile"),
    ("nodes zero", [*SIM, "--nodes", "0"], "--nodes"),
    ("plan and strategy", [*SIM, "--plan", "{dir}/plan-gap.yaml"], "give --strategy or --plan, not both"),
    ("missing plan", ["simulate", "--plan", "{dir}/none.yaml"], "none.yaml: no such file"),
    ("malformed plan", ["simulate", "--plan", "{dir}/bad.yaml"], "malformed YAML"),
    ("plan with overlapping devices", ["simulate", "--plan", "{dir}/plan-overlap.yaml"], "plan-overlap.yaml"),
    ("plan leaving layers out", ["simulate", "--plan", "{dir}/plan-gap.yaml"], "plan-gap.yaml"),
    ("plan on a GPU that does not exist", ["simulate", "--plan", "{dir}/plan-nogpu.yaml"], "plan-nogpu.yaml"),
    ("option that does not apply to a plan", ["simulate", "--plan", "{dir}/plan-gap.yaml", "--micro-batches", "4"],
     "--micro-batches does not apply to --plan"),
    ("model file malformed", ["simulate", "--model", "{dir}/bad.yaml", "--cluster", "cpu-2x1", "--strategy", "1M2P1D"],
     "malformed YAML"),
    ("model file empty", ["simulate", "--model", "{dir}/empty.yaml", "--cluster", "cpu-2x1", "--strategy", "1M2P1D"],
     "expected a mapping"),
    ("model file a list", ["simulate", "--model", "{dir}/list.yaml", "--cluster", "cpu-2x1", "--strategy", "1M2P1D"],
     "expected a mapping"),
    ("model file unknown key", ["simulate", "--model", "{dir}/unknown-key.yaml", "--cluster", "cpu-2x1",
                                "--strategy", "1M2P1D"], "unknown key 'paramz'"),
    ("model file negative time", ["simulate", "--model", "{dir}/negative.yaml", "--cluster", "cpu-2x1",
                                  "--strategy", "1M1P2D"], "forward_s must be >= 0"),
    ("cluster file unknown key", [*SIM[:3], "--cluster", "{dir}/cluster-key.yaml", *SIM[5:]], "unknown key 'nodez'"),
    ("cluster file not a number", [*SIM[:3], "--cluster", "{dir}/cluster-nan.yaml", *SIM[5:]],
     "peak_flops_per_s must be a number"),
    ("figure format", [*SIM, "--trace", "{dir}/t.json", "--plot", "{dir}/t.xyz"], "cannot write a figure as 'xyz'"),
    ("output directory missing", [*SIM, "--csv", "{dir}/no/t.csv"], "does not exist"),
    ("two outputs on stdout", [*SIM, "--csv", "-", "--json"], "would both write to standard output"),
    ("a billion micro-batches", [*SIM[:-1], "1000000000"], "above the limit of 5,000,000"),
    ("a hundred thousand samples", [*SIM, "--samples", "100000"], "above the limit of 5,000,000"),
    ("schedule of a billion micro-batches", ["schedule", "--pp", "4", "--micro-batches", "1000000000"],
     "8,000,000,000 schedule actions, above the limit of 5,000,000"),
    # search
    ("grid batch not divisible", [*GRID, "--micro-batch-sizes", "3"], "not divisible by micro-batch size 3"),
    ("grid degrees not numbers", [*GRID, "--tp", "a"], "--tp takes comma-separated integers"),
    ("grid unknown schedule", [*GRID, "--schedules", "zigzag"], "--schedules takes a comma-separated subset"),
    ("grid no valid configuration", [*GRID, "--tp", "3"], "no valid configuration"),
    ("grid of a billion samples", [*GRID[:-1], "1000000000"], "schedule actions, above the limit"),
    ("grid more GPUs than the cluster", [*GRID, "--gpus", "1024"], "1024"),
    ("grid trace dir is a file", [*GRID, "--trace-best", "{dir}/bad.json"], "is a file"),
    ("dapple M not dividing the batch", [*DAPPLE, "--micro-batches", "5"], "do not divide the global batch 16"),
    ("dapple unknown policy", [*DAPPLE, "--policies", "random"], "--policies takes a comma-separated subset"),
    ("dapple figure format", [*DAPPLE, "--plot", "{dir}/d.xyz"], "cannot write a figure as 'xyz'"),
    # profile
    ("profile unknown model", ["profile", "--model", "gpt9", "--cluster", "cpu-1x2", "--strategy", "1M1P2D"],
     "unknown model 'gpt9'"),
    ("profile no strategies", PROF[:5], "give the strategies to profile"),
    ("profile out directory missing", [*PROF, "--out", "{dir}/no/p.json"], "does not exist"),
    ("profile out malformed", [*PROF, "--out", "{dir}/bad.json"], "malformed JSON"),
    ("profile out a stream", [*PROF, "--out", "-"], "needs a file name"),
    ("profile three shaped nodes", [*PROF, "--emulate-nodes", "3", "--link-bandwidth", "1gbit"],
     "joins exactly two emulated nodes"),
    ("profile shaping without emulation", [*PROF, "--link-bandwidth", "1gbit"], "add --emulate-nodes 2"),
    ("profile bad rate", [*PROF, "--emulate-nodes", "2", "--link-bandwidth", "fast"], "takes a tc rate"),
    ("profile bad size", [*PROF, "--max-comm-bytes", "lots"], "--max-comm-bytes takes a size"),
    ("profile timeout nan", [*PROF, "--timeout", "nan", "--dry-run"], "'nan' is not a finite number"),
    ("profile timeout past a year", [*PROF, "--timeout", "1e300", "--dry-run"], "--timeout"),
    ("profile a billion micro-batches", [*PROF, "--micro-batches", "1000000000", "--dry-run"],
     "schedule actions, above the limit"),
    ("profile grid without batch", ["profile", "--model", TINY, "--cluster", "cpu-1x2", "--grid-gpus", "2"],
     "--grid-gpus needs --global-batch"),
    ("profile show missing", ["profile", "show", "{dir}/none.json"], "none.json: no such file"),
    # execute
    ("execute out of memory", ["execute", "--model", "gpt2-cpu", "--cluster", "{dir}/small-gpu.yaml", *EXEC[5:],
                               "--out", "{dir}/t.json"], "does not fit in memory"),
    ("execute out to stdout", [*EXEC, "--out", "-"], "needs a file name"),
    ("execute out directory missing", [*EXEC, "--out", "{dir}/no/t.json"], "does not exist"),
    ("execute wrong rank count", [*EXEC, "--out", "{dir}/t.json"], "needs 2 ranks but this launch starts 1"),
    ("execute shaping without emulation", [*EXEC, "--link-bandwidth", "1gbit", "--out", "{dir}/t.json"],
     "add --emulate-nodes 2"),
    ("execute selective recomputation", [*EXEC, "--recompute", "selective", "--out", "{dir}/t.json"],
     "execute runs --recompute none or full, not selective"),
    ("execute sequence parallelism", [*EXEC[:6], "2M1P1D", *EXEC[7:], "--sequence-parallel", "--out", "{dir}/t.json"],
     "does not run --sequence-parallel"),
    ("execute zero2", [*EXEC[:6], "1M1P2D", *EXEC[7:], "--optimizer-sharding", "zero2", "--out", "{dir}/t.json"],
     "runs --optimizer-sharding none or zero1, not zero2"),
    ("execute zero1 with split tied embedding", [*EXEC[:4], "cpu-1x2", "--nodes", "2", "--strategy", "1M2P2D",
                                                 *EXEC[7:], "--optimizer-sharding", "zero1", "--out", "{dir}/t.json"],
     "tied embedding on two pipeline ranks"),
    # validate
    ("validate nothing to do", ["validate"], "give --trace FILE or --suite [DIR]"),
    ("validate missing trace", ["validate", "--trace", "{dir}/none.json"], "none.json: no such file"),
    ("validate malformed trace", ["validate", "--trace", "{dir}/bad.json"], "malformed JSON"),
    ("validate trace of another schema", ["validate", "--trace", "{dir}/trace-schema.json"], "trace"),
    ("validate empty suite", ["validate", "--suite", "{dir}/emptydir"], "no traces"),
    ("validate plot of a suite", ["validate", "--suite", "{dir}/emptydir", "--plot", "{dir}/v.png"],
     "--plot draws one trace"),
    ("validate figure format", ["validate", "--trace", TRACE, "--plot", "{dir}/v.xyz"], "cannot write a figure"),
]  # fmt: skip


@pytest.fixture
def case_dir(tmp_path: Path) -> Path:
    return write_files(tmp_path, FILES)


def test_the_sweep_is_broad() -> None:
    commands = {args[0] if args[0] != "search" else f"search {args[1]}" for _, args, _ in CASES}
    assert len(CASES) >= 40 and {"simulate", "search grid", "search dapple", "profile", "execute", "validate"} <= (
        commands
    )


@pytest.mark.parametrize(("what", "args", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_input_is_one_line_and_exit_2(
    case_dir: Path, capsys: pytest.CaptureFixture[str], what: str, args: list[str], message: str
) -> None:
    check_bad_input(case_dir, capsys, what, args, message)
