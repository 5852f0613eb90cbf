"""``distsim cluster-sim``'s inputs (bad-input sweep harness: ``tests/sweep.py``): every number of a trace and of an
option is checked where it is read, bad bytes are one line saying where, the trace's size is bounded (``--max-jobs``),
the default trace works from any directory, and a long run shows its progress."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import distsim.cli.cluster_sim as cli_cluster_sim
from distsim.elastic.cluster_sim import simulate_cluster
from distsim.elastic.jobs import Job, TraceError, TraceTooLarge, read_csv
from tests.sweep import bounded, check_bad_input, write_files
from tests.util import run_cli

DATA = Path(__file__).parents[1] / "data"
HEADER = "job_id,arrival_s,gpus,max_workers,duration_s,model,cap_V100,cap_T4,gpu_type\n"
OK = "j0,0,1,2,100,resnet50,10,5,\n"
ATTEMPT = {"start_time": "2017-10-03 02:00:00", "end_time": "2017-10-03 03:00:00",
           "detail": [{"ip": "m1", "gpus": ["gpu0"]}]}  # fmt: skip
GOOD_PHILLY = {"jobid": "a", "submitted_time": "2017-10-03 02:00:00", "attempts": [ATTEMPT]}


def row(**fields: str) -> str:
    """A CSV trace of one good job with `fields` changed."""
    values = dict(zip(HEADER.strip().split(","), OK.strip("\n").split(","), strict=True))
    values.update(fields)
    return HEADER + ",".join(values.values()) + "\n"


LATIN1 = HEADER.encode() + "jé,0,1,2,100,resnet50,10,5,\n".encode("latin-1")
FILES: dict[str, str | bytes] = {
    "nan-arrival.csv": row(arrival_s="nan"),
    "inf-arrival.csv": row(arrival_s="inf"),
    "negative-arrival.csv": row(arrival_s="-1"),
    "late-arrival.csv": row(arrival_s="1e12"),
    "word-arrival.csv": row(arrival_s="soon"),
    "inf-duration.csv": row(duration_s="inf"),
    "nan-duration.csv": row(duration_s="nan"),
    "zero-duration.csv": row(duration_s="0"),
    "nan-cap.csv": row(cap_V100="nan"),
    "inf-cap.csv": row(cap_V100="inf"),
    "negative-cap.csv": row(cap_T4="-5"),
    "tiny-cap.csv": row(cap_T4="1e-300"),
    "no-cap.csv": row(cap_V100="0", cap_T4=""),
    "nan-gpus.csv": row(gpus="nan"),
    "fractional-gpus.csv": row(gpus="2.5"),
    "huge-gpus.csv": row(gpus="1e20"),
    "zero-workers.csv": row(max_workers="0"),
    "pinned-without-cap.csv": row(cap_T4="0", gpu_type="T4"),
    "latin1-id.csv": LATIN1,
    "binary.csv": b"\xff\xfe\x00j\x00o\x00b",
    "header-only.csv": HEADER,
    "empty.csv": "",
    "no-duration-column.csv": HEADER.replace("duration_s,", "") + "j0,0,1,2,resnet50,10,5,\n",
    "no-cap-column.csv": "job_id,arrival_s,gpus,max_workers,duration_s,model\nj0,0,1,2,100,resnet50\n",
    "long-row.csv": HEADER + OK.strip("\n") + ",extra\n",
    "short-row.csv": HEADER + "j0,0,1\n",
    "repeated-id.csv": HEADER + OK + OK,
    "two-jobs.csv": HEADER + OK + OK.replace("j0", "j1"),
    "philly-latin1.json": json.dumps([{**GOOD_PHILLY, "jobid": "aé"}], ensure_ascii=False).encode("latin-1"),
    "philly-attempts-dict.json": json.dumps([{**GOOD_PHILLY, "attempts": {"x": 1}}]),
    "philly-gpus-int.json": json.dumps([{**GOOD_PHILLY, "attempts": [{**ATTEMPT, "detail": [{"gpus": 5}]}]}]),
    "philly-repeated.json": json.dumps([GOOD_PHILLY, GOOD_PHILLY]),
    "philly-big.json": json.dumps([GOOD_PHILLY] * 40),
}  # fmt: skip

T = ["cluster-sim", "--gpus", "V100:4,T4:4", "--trace"]
FINITE = "must be a finite number >= 0"
POSITIVE = "must be a finite positive number"
CASES: list[tuple[str, list[str], str]] = [
    # numbers of a trace: finite and in range, one line naming the file, line, job and field
    ("arrival inf", [*T, "{dir}/inf-arrival.csv"], f"inf-arrival.csv:2 job 'j0': arrival_s {FINITE}"),
    ("arrival negative", [*T, "{dir}/negative-arrival.csv"], f"negative-arrival.csv:2 job 'j0': arrival_s {FINITE}"),
    ("arrival past the limit", [*T, "{dir}/late-arrival.csv"], "arrival_s is 1e+12 s, above the limit of 1,000,000"),
    ("arrival a word", [*T, "{dir}/word-arrival.csv"], "word-arrival.csv:2 job 'j0': arrival_s must be a number"),
    ("duration inf", [*T, "{dir}/inf-duration.csv"], f"inf-duration.csv:2 job 'j0': duration_s {POSITIVE}"),
    ("duration nan", [*T, "{dir}/nan-duration.csv"], f"nan-duration.csv:2 job 'j0': duration_s {POSITIVE}"),
    ("duration zero", [*T, "{dir}/zero-duration.csv"], f"duration_s {POSITIVE} (seconds), got 0.0"),
    ("capability nan", [*T, "{dir}/nan-cap.csv"], f"nan-cap.csv:2 job 'j0': cap_V100 {FINITE}"),
    ("capability inf", [*T, "{dir}/inf-cap.csv"], f"inf-cap.csv:2 job 'j0': cap_V100 {FINITE}"),
    ("capability negative", [*T, "{dir}/negative-cap.csv"], f"cap_T4 {FINITE}"),
    ("capability vanishing", [*T, "{dir}/tiny-cap.csv"], "cap_T4 is 1e-300, outside 1e-06 to 1e+06 mini-batches/s"),
    ("no capability", [*T, "{dir}/no-cap.csv"], "no-cap.csv:2 job 'j0': no GPU type with a positive capability"),
    ("gpus nan", [*T, "{dir}/nan-gpus.csv"], "nan-gpus.csv:2 job 'j0': gpus must be a positive integer, got 'nan'"),
    ("gpus fractional", [*T, "{dir}/fractional-gpus.csv"], "gpus must be a positive integer, got '2.5'"),
    ("gpus 1e20", [*T, "{dir}/huge-gpus.csv"], "gpus is 100,000,000,000,000,000,000, above the limit of 1,048,576"),
    ("max_workers zero", [*T, "{dir}/zero-workers.csv"], "zero-workers.csv:2 job 'j0': max_workers must be a positive"),
    ("pinned type it cannot use", [*T, "{dir}/pinned-without-cap.csv"], "requires T4 (gpu_type) but has no capability"),
    # bytes that are not UTF-8: where they are
    ("latin-1 job id", [*T, "{dir}/latin1-id.csv"],
     f"latin1-id.csv: not UTF-8 text: byte 0xe9 at offset {len(HEADER) + 1} (line 2)"),
    ("binary csv", [*T, "{dir}/binary.csv"], "binary.csv: not UTF-8 text: byte 0xff at offset 0 (line 1)"),
    ("latin-1 philly job", [*T, "{dir}/philly-latin1.json"], "philly-latin1.json: not UTF-8 text: byte 0xe9 at offset"),
    # the shape of a trace
    ("header only", [*T, "{dir}/header-only.csv"], "header-only.csv: no jobs: the header has every column but no row"),
    ("empty csv", [*T, "{dir}/empty.csv"], "empty.csv: empty file; expected CSV columns"),
    ("missing column", [*T, "{dir}/no-duration-column.csv"], "no-duration-column.csv: no column duration_s"),
    ("no cap column", [*T, "{dir}/no-cap-column.csv"], "no-cap-column.csv: no cap_<TYPE> column"),
    ("row too long", [*T, "{dir}/long-row.csv"], "long-row.csv:2: 10 fields, the header has 9"),
    ("row too short", [*T, "{dir}/short-row.csv"], "short-row.csv:2: 3 fields, the header has 9"),
    ("repeated job", [*T, "{dir}/repeated-id.csv"], "repeated-id.csv:3: job 'j0' again (first on line 2)"),
    ("philly attempts not a list", [*T, "{dir}/philly-attempts-dict.json"],
     "philly-attempts-dict.json: job #0 ('a'): attempts must be a list of objects"),
    ("philly gpus not a list", [*T, "{dir}/philly-gpus-int.json"], "detail must be a list of objects with a gpus list"),
    ("philly repeated job", [*T, "{dir}/philly-repeated.json"], "job #1 ('a'): jobid again (first at job #0)"),
    # size: refused before it runs, naming the count and the limit
    ("more jobs than --max-jobs", [*T, "{dir}/two-jobs.csv", "--max-jobs", "1"],
     "two-jobs.csv has 2 jobs, above the limit of 1; simulate fewer jobs, or raise the limit with --max-jobs"),
    ("philly file too big for --max-jobs", [*T, "{dir}/philly-big.json", "--max-jobs", "1"],
     "more than a trace of at most 1 jobs takes (2,048 bytes a job); raise the limit with --max-jobs"),
    ("--max-jobs zero", [*T, "{dir}/two-jobs.csv", "--max-jobs", "0"], "Invalid value for '--max-jobs'"),
    # float options: finite and positive
    ("--round-s nan", ["cluster-sim", "--round-s", "nan"], "'--round-s': 'nan' is not a finite number"),
    ("--round-s inf", ["cluster-sim", "--round-s", "inf"], "'--round-s': 'inf' is not a finite number"),
    ("--round-s zero", ["cluster-sim", "--round-s", "0"], "Invalid value for '--round-s'"),
    ("--round-s negative", ["cluster-sim", "--round-s", "-60"], "Invalid value for '--round-s'"),
    ("a mini-batch a GPU takes days over", ["cluster-sim", "--scheduler", "yarn-cs", "--simulate-capabilities",
                                            "1000000000"], "--simulate-capabilities 1000000000: one V100 takes"),
]  # fmt: skip


@pytest.fixture
def case_dir(tmp_path: Path) -> Path:
    return write_files(tmp_path, FILES)


@pytest.mark.parametrize(("what", "args", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_trace_or_option_is_one_line(
    case_dir: Path, capsys: pytest.CaptureFixture[str], what: str, args: list[str], message: str
) -> None:
    check_bad_input(case_dir, capsys, what, args, message)


@pytest.mark.parametrize("scheduler", ["yarn-cs", "easyscale-homo", "easyscale"])
def test_a_nan_arrival_is_one_line_not_a_hang(
    case_dir: Path, capsys: pytest.CaptureFixture[str], scheduler: str
) -> None:
    """It used to loop forever at 100% CPU (nan is never <= the clock, and min() kept the nan): the harness's alarm
    bounds it."""
    check_bad_input(case_dir, capsys, f"nan arrival under {scheduler}",
                    [*T, "{dir}/nan-arrival.csv", "--scheduler", scheduler],
                    f"nan-arrival.csv:2 job 'j0': arrival_s {FINITE} (seconds), got nan")  # fmt: skip


def test_a_philly_trace_over_max_jobs_names_the_count(case_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = [{**GOOD_PHILLY, "jobid": f"j{k}"} for k in range(3)]
    (case_dir / "three.json").write_text(json.dumps(jobs))
    check_bad_input(case_dir, capsys, "philly over --max-jobs", [*T, "{dir}/three.json", "--max-jobs", "2"],
                    "three.json has 3 jobs, above the limit of 2")  # fmt: skip


def test_rows_past_the_limit_are_counted_not_read(tmp_path: Path) -> None:
    """Beyond max_jobs the reader counts lines and keeps nothing: a bad row there is not what it reports."""
    (tmp_path / "t.csv").write_text(HEADER + OK + OK.replace("j0", "j1") + "garbage\n" * 5)
    with pytest.raises(TraceTooLarge, match=r"has 7 jobs, above the limit of 1;"):
        read_csv(str(tmp_path / "t.csv"), max_jobs=1)


def test_raising_max_jobs_lets_the_trace_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "two.csv").write_text(FILES["two-jobs.csv"])  # type: ignore[arg-type]
    code, out, err = run_cli([*T, str(tmp_path / "two.csv"), "--scheduler", "yarn-cs", "--max-jobs", "2"], capsys)
    assert code == 0, err
    assert out.startswith("2 jobs on V100:4,T4:4")


def test_a_utf8_bom_and_an_omitted_optional_field_are_read(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_bytes(b"\xef\xbb\xbf" + HEADER.encode() + b"j0,0,1,2,100,resnet50,10,5\n")
    (job,) = read_csv(str(tmp_path / "t.csv"))
    assert (job.job_id, job.gpu_type, dict(job.capabilities)) == ("j0", None, {"V100": 10.0, "T4": 5.0})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("arrival_s", math.nan, "arrival_s must be a finite number >= 0"),
        ("arrival_s", math.inf, "arrival_s must be a finite number >= 0"),
        ("duration_s", math.inf, "duration_s must be a finite positive number"),
        ("duration_s", -1.0, "duration_s must be a finite positive number"),
        ("gpus", 2.5, "gpus must be an integer from 1 to 1,048,576"),
        ("max_workers", 2**21, "max_workers must be an integer from 1 to 1,048,576"),
        ("capabilities", {"V100": math.nan}, "cap_V100 must be a finite number >= 0"),
    ],
)
def test_a_job_built_in_python_is_checked_too(field: str, value: object, message: str) -> None:
    fields: dict[str, object] = {"job_id": "j", "arrival_s": 0.0, "gpus": 1, "max_workers": 1, "duration_s": 10.0,
                                 "model": "m", "capabilities": {"V100": 1.0}}  # fmt: skip
    fields[field] = value
    with pytest.raises(TraceError, match=f"job 'j': {message}"):
        Job(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("round_s", [math.nan, math.inf, 0.0, -1.0])
def test_simulate_cluster_refuses_a_bad_round(round_s: float) -> None:
    with pytest.raises(Exception, match="round_s"):
        simulate_cluster([Job("j", 0.0, 1, 1, 10.0, "m", {"V100": 1.0})], {"V100": 1}, "easyscale", round_s=round_s)


def test_simulate_cluster_refuses_more_jobs_than_max_jobs() -> None:
    jobs = [Job(f"j{k}", 0.0, 1, 1, 10.0, "m", {"V100": 1.0}) for k in range(3)]
    with pytest.raises(TraceTooLarge, match="the trace has 3 jobs, above the limit of 2"):
        simulate_cluster(jobs, {"V100": 1}, "yarn-cs", max_jobs=2)
    assert len(simulate_cluster(jobs, {"V100": 1}, "yarn-cs", max_jobs=None).finish_s) == 3


@pytest.mark.parametrize("scheduler", ["yarn-cs", "easyscale-homo", "easyscale"])
def test_a_late_trace_finishes(scheduler: str) -> None:
    """Jobs 10^8 s into a trace: a job's last mini-batches used to round to a residue that the float clock could not
    step past (t + residue / rate == t), and the loop spun forever; a job due by the next event now finishes then."""
    caps = {"V100": 10.3, "P100": 6.1, "T4": 5.3}
    jobs = [Job(f"j{k}", 1e8 + 13.7 * k, 1 + k % 3, 4, 60.0 + 97.3 * k, "m", caps) for k in range(40)]
    with bounded(60):
        res = simulate_cluster(jobs, {"V100": 4, "P100": 2, "T4": 2}, scheduler)
    assert set(res.finish_s) == {j.job_id for j in jobs}
    for j in jobs:
        assert res.processed[j.job_id] == pytest.approx(j.work, rel=1e-9)


def test_the_default_trace_works_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["cluster-sim", "--scheduler", "yarn-cs", "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert Path(report["trace"]).is_file() and report["results"][0]["jobs"] == 150


def test_a_long_run_shows_progress_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Progress shows once a run takes PROGRESS_AFTER_S; at 0 every run shows it (stderr is not a terminal here: a
    line every 10 %), and stdout stays the report."""
    monkeypatch.setattr(cli_cluster_sim, "PROGRESS_AFTER_S", 0.0)
    code, out, err = run_cli(["cluster-sim", "--scheduler", "both", "--json"], capsys)
    assert code == 0, err
    lines = err.splitlines()
    assert len(lines) >= 10 and all("jobs finished (3 schedulers in turn)" in ln for ln in lines)
    assert lines[-1].startswith("450/450 jobs finished")
    assert [r["jobs"] for r in json.loads(out)["results"]] == [150, 150, 150]


def test_a_quick_run_says_nothing_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_cluster_sim, "PROGRESS_AFTER_S", math.inf)
    code, _, err = run_cli(["cluster-sim", "--trace", str(DATA / "philly_sample.json"), "--gpus", "V100:8"], capsys)
    assert code == 0 and err == ""


def test_the_generator_names_a_missing_output_directory_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from distsim.elastic.synth import main as synth_main

    with pytest.raises(SystemExit) as exc:
        synth_main(["--jobs", "3", "--out", str(tmp_path / "no" / "t.csv")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("distsim: error: --out") and "does not exist" in err
    assert list(tmp_path.iterdir()) == []
