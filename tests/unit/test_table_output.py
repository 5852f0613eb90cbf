"""``--table FILE``: the timeline as Parquet (dtypes kept) or CSV by the file's name, every GPU's rows with
--all-gpus, and one line for a name or a missing pyarrow it cannot write."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from distsim import Strategy, get_cluster, get_model, simulate
from distsim.io.table import write_table
from distsim.sim.timeline import Timeline
from tests.util import run_cli as run

SIMULATE = ["simulate", "--model", "gpt2-345m", "--cluster", "dgx-a100", "--nodes", "2", "--strategy", "2M4P2D",
            "--micro-batches", "4"]  # fmt: skip


@pytest.fixture(scope="module")
def timeline() -> Timeline:
    """16 GPUs, 4 simulated (each stands for 4): the same iteration SIMULATE runs."""
    cluster = replace(get_cluster("dgx-a100"), nodes=2)
    return simulate(get_model("gpt2-345m"), cluster, Strategy.from_str("2M4P2D", num_micro_batches=4)).timeline


def test_parquet_gives_back_the_same_frame_with_its_dtypes(timeline: Timeline, tmp_path: Path) -> None:
    pytest.importorskip("pyarrow", reason="Parquet is written by pyarrow (pip install pyarrow)")
    for expand, want in ((False, timeline.df), (True, timeline.expand().df)):
        write_table(tmp_path / "t.parquet", timeline, expand=expand)
        back = pd.read_parquet(tmp_path / "t.parquet")
        pd.testing.assert_frame_equal(back, want.reset_index(drop=True))
        assert isinstance(back["stream"].dtype, pd.CategoricalDtype) and isinstance(back["name"].dtype,
                                                                                    pd.CategoricalDtype)  # fmt: skip
    assert len(back) == 4 * len(timeline.df) and back.gpu.nunique() == 16


def test_simulate_table_is_parquet_much_smaller_than_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pyarrow", reason="Parquet is written by pyarrow (pip install pyarrow)")
    files = ["--table", str(tmp_path / "t.parquet"), "--csv", str(tmp_path / "t.csv")]
    code, _, err = run([*SIMULATE, "--all-gpus", *files], capsys)
    assert code == 0, err
    back, csv = pd.read_parquet(tmp_path / "t.parquet"), pd.read_csv(tmp_path / "t.csv", keep_default_na=False)
    assert len(back) == len(csv) == 3464 and list(back.columns) == list(csv.columns)
    pd.testing.assert_frame_equal(back.astype(str), csv.astype(str), check_dtype=False)
    assert (tmp_path / "t.parquet").stat().st_size * 5 < (tmp_path / "t.csv").stat().st_size


def test_a_csv_table_is_what_csv_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run([*SIMULATE, "--table", str(tmp_path / "a.csv"), "--csv", str(tmp_path / "b.csv")], capsys)
    assert code == 0, err
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()


@pytest.mark.parametrize("name", ["t.xlsx", "t.parquet.txt", "t", "-"])
def test_a_table_name_of_no_known_format_is_one_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = name if name == "-" else str(tmp_path / name)
    code, out, err = run([*SIMULATE, "--table", target], capsys)
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and "*.parquet, *.csv, *.csv.gz" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_parquet_without_pyarrow_says_how_to_install_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError
    code, _, err = run([*SIMULATE, "--table", str(tmp_path / "t.parquet")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "pip install pyarrow" in err
    assert not (tmp_path / "t.parquet").exists()
