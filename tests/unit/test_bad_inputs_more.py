"""More of the bad-input sweep (harness: ``tests/sweep.py``): numbers out of range in a burst plan, readable strategy
keys with the wrong kind of value, a ``--torch-model`` that exits, a background job that fits on no GPU, and a
``--trace-best`` directory on a full disk. Each is one line naming the problem, exit status 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sweep import check_bad_input, write_files
from tests.util import run_cli

SIM = ["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-2x1", "--strategy", "1M2P1D", "--micro-batches", "4"]
GRID = ["search", "grid", "--model", "bert-exlarge", "--cluster", "distsim-a10", "--global-batch", "16"]
BURST = "kind: burst\nmodel: vgg16\ncluster: dgx-a100\nnodes: 1\ncounts: 1x3,8x10,1x8\n"
HUGE = "100000000000000000000"  # 1e20: past int64, where numpy overflows

FILES: dict[str, str] = {
    "burst-huge-batch.yaml": f"{BURST}batch: {HUGE}\n",
    "burst-batch-over-limit.yaml": f"{BURST}batch: 1073741825\n",
}
# The user's torch code lives beside the case directory ({dir}/../user), not in it: importing it writes __pycache__.
USER_CODE: dict[str, str] = {
    "exits.py": "import sys\n\nimport torch\n\n\ndef make():\n    sys.exit(3)\n\n\n"
    "class Quits(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    "        self.a = torch.nn.Linear(4, 4)\n\n    def forward(self, x):\n        sys.exit('bye')\n\n\n"
    "def quits_in_forward():\n    return Quits(), torch.zeros(2, 4)\n\n\ndef interrupted():\n"
    "    raise KeyboardInterrupt\n",
    "exits_on_import.py": "import sys\n\nsys.exit(5)\n\n\ndef make():\n    pass\n",
}
EXITS = "{dir}/../user/exits.py"

CASES: list[tuple[str, list[str], str]] = [
    # burst plans: every number read is in range where it is read
    ("burst plan batch of 1e20", ["simulate", "--plan", "{dir}/burst-huge-batch.yaml"],
     f"burst-huge-batch.yaml: batch is {int(HUGE):,} samples, above the limit of 1,073,741,824"),
    ("burst plan batch just over the limit", ["simulate", "--plan", "{dir}/burst-batch-over-limit.yaml"],
     "batch is 1,073,741,825 samples, above the limit of 1,073,741,824"),
    ("deeppool planner batch of 1e20", ["search", "deeppool", "--model", "vgg16", "--cluster", "dgx-a100", "--nodes",
                                        "1", "--global-batch", HUGE], "above the limit of 1,073,741,824"),
    # readable strategy keys: the message says what the key takes
    ("strategy sp=2", [*SIM[:5], "--strategy", "tp=1 pp=2 dp=1 sp=2"],
     "sp must be 1 or 0 (true/false, yes/no, on/off: sequence parallelism on or off)"),
    ("strategy partition of letters", [*SIM[:5], "--strategy", "tp=1 pp=2 dp=1 partition=a:b"],
     "partition must be layer counts per stage like 8:7:7:4"),
    ("strategy cap of letters", [*SIM[:5], "--strategy", "tp=1 pp=2 dp=1 cap=big"], "cap must be a number of MiB"),
    ("micro-batch size of 1e23", [*SIM, "--micro-batch-size", "100000000000000000000000"],
     "micro_batch_size is 100,000,000,000,000,000,000,000 samples, above the limit of 1,073,741,824"),
    ("strategy key given twice", [*SIM[:5], "--strategy", "tp=1 pp=2 dp=1 tp=2"], "tp is given twice"),
    ("strategy D not an integer", [*SIM[:5], "--strategy", "tp=1 pp=2 dp=1 D=1.5"], "D must be an integer"),
    # a --torch-model that exits is reported like one that raises
    ("torch model sys:exit", ["profile", "--torch-model", "sys:exit", "--out", "{dir}/p.json"],
     "--torch-model sys:exit: calling it raised SystemExit"),
    ("torch model calling sys.exit(3)", ["profile", "--torch-model", f"{EXITS}:make", "--out", "{dir}/p.json"],
     f"--torch-model {EXITS}:make: calling it raised SystemExit: 3"),
    ("torch model exiting in its forward", ["profile", "--torch-model", f"{EXITS}:quits_in_forward", "--out",
                                            "{dir}/p.json"],
     f"--torch-model {EXITS}:quits_in_forward: the module's forward on the example batch raised SystemExit: bye"),
    ("torch model with tp > 1", ["profile", "--torch-model", "sys:exit", "--cluster", "cpu-1x2", "--strategy",
                                "2M1P1D", "--out", "{dir}/p.json"],
     "--torch-model profiles your module's blocks whole, for tensor parallelism 1: --strategy 2M1P1D splits them"),
    ("torch model exiting on import", ["profile", "--torch-model", "{dir}/../user/exits_on_import.py:make", "--out",
                                       "{dir}/p.json"],
     "cannot import {dir}/../user/exits_on_import.py (SystemExit: 5)"),
    # a background job runs on one GPU: one that does not fit there is refused, with need and capacity; its flash
    # attention keeps 4as, not the 5as^2 scores, per layer and sample: (5 x 96 x 2048^2 - 4 x 96 x 2048) B x 96 layers
    # x 8 = 1,545.58 GB below the 5,000.90 GB of stored-score attention (gpt3-175b:attention=unfused)
    ("background that fits on no GPU", [*SIM, "--background", "gpt3-175b"],
     "background gpt3-175b at batch 8 needs 3,455.31 GB on one GPU, above the 10.00 GB of one x86 CPU core"),
    ("background batch too large for one GPU", [*SIM, "--background", "gpt2-cpu", "--background-batch", "100000",
                                                "--csv", "{dir}/t.csv"], "choose a smaller background batch or model"),
    ("deeppool background that fits on no GPU", ["search", "deeppool", "--model", "vgg16", "--cluster", "dgx-a100",
                                                 "--nodes", "1", "--global-batch", "32", "--background", "gpt3-175b",
                                                 "--plan-out", "{dir}/d.plan.yaml"], "background gpt3-175b at batch"),
]  # fmt: skip


@pytest.fixture
def case_dir(tmp_path: Path) -> Path:
    write_files(tmp_path / "user", USER_CODE)
    return write_files(tmp_path / "case", FILES)


@pytest.mark.parametrize(("what", "args", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_input_is_one_line_and_exit_2(
    case_dir: Path, capsys: pytest.CaptureFixture[str], what: str, args: list[str], message: str
) -> None:
    if "--torch-model" in args:
        pytest.importorskip("torch")
    check_bad_input(case_dir, capsys, what, args, message)


def test_a_torch_model_interrupted_still_aborts(case_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C in the user's function is not reported as its failure: distsim aborts, status 130, as before."""
    pytest.importorskip("torch")
    code, out, err = run_cli(["profile", "--torch-model", f"{case_dir}/../user/exits.py:interrupted", "--out",
                              str(case_dir / "p.json")], capsys)  # fmt: skip
    assert code == 130 and err.strip() == "distsim: aborted" and out == ""


# --plan-out "": the grid's default plan file would go to the current directory, outside the case's
TRACE_BEST = [*GRID, "--quiet", "--top", "1", "--plan-out", "", "--trace-best"]


def test_trace_best_on_a_full_disk_leaves_nothing(full_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The --trace-best directory this run made is removed again when writing into it fails."""
    check_bad_input(full_dir, capsys, "trace-best on a full disk", [*TRACE_BEST, "{dir}/tb/"],
                    "cannot write (No space left on device)")  # fmt: skip
    assert sorted(p.name for p in full_dir.iterdir()) == [".fill"]


def test_trace_best_on_a_full_disk_keeps_a_directory_that_was_there(
    full_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (full_dir / "tb").mkdir()
    check_bad_input(full_dir, capsys, "trace-best into an existing directory on a full disk",
                    [*TRACE_BEST, "{dir}/tb"], "No space left on device")  # fmt: skip
    assert (full_dir / "tb").is_dir() and not any((full_dir / "tb").iterdir())
