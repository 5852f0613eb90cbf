"""Hostile input to elastic execution and planning: one line naming the problem, never a traceback, a runaway
allocation, an ignored option or a checkpoint that lies.

* ``distsim execute --elastic``: the worker count is guarded by the memory its ESTs need; every option of ``execute``
  that the mode does not use is refused (both ways, from one table); float options are finite; checkpoints carry a
  verified header (format, model, parameters, step, hyper-parameters, SHA-256) and are loaded as tensors only;
  they are written atomically (no temporary file left on a full disk or a signal).
* ``distsim search elastic``: GPUs that cannot hold one EST host none; the planner's cost does not grow with maxP
  (two exact enumerations, the cheaper one chosen) and is bounded.

The sweep cases run in this process on files written into a fresh directory (tests/sweep.py); the checkpoints they
corrupt are copies of one real checkpoint, written once per module by the trainer in this process.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from distsim.cli.execute import BOTH, ELASTIC, PLAN, USED_BY, execute  # noqa: E402
from distsim.core.errors import DistsimError  # noqa: E402
from distsim.core.models import get_model  # noqa: E402
from distsim.elastic import planner  # noqa: E402
from distsim.elastic.planner import ElasticPlanError, enumerate_plans  # noqa: E402
from distsim.executor import elastic_checkpoint as ckpt  # noqa: E402
from distsim.executor.elastic import (  # noqa: E402
    ElasticTrainer,
    activation_bytes,
    deterministic,
    memory_needed,
    save_checkpoint,
)
from distsim.io.output import OutputError  # noqa: E402
from tests.sweep import bounded, check_bad_input, peak_rss_bytes, write_files  # noqa: E402
from tests.util import run_cli  # noqa: E402

SM = "bert-large:hidden=64,heads=4,layers=2,seq=16,vocab=512,precision=fp32"
GPT = "gpt2-cpu:hidden=64,heads=4,layers=2,seq=16,vocab=512,precision=fp32"
EX = ["execute", "--elastic", "--model", SM, "--max-workers", "4", "--steps", "1"]
PLAN_RUN = ["execute", "--model", "gpt2-cpu", "--cluster", "cpu-1x2", "--strategy", "1M2P1D", "--micro-batches", "2"]
SEARCH = ["search", "elastic", "--model", "resnet50"]


@pytest.fixture
def d1_process() -> Any:
    """This process's torch settings restored after a test whose run changes them (deterministic, 1 thread)."""
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    rng = torch.get_rng_state()
    yield
    torch.use_deterministic_algorithms(det)
    torch.set_num_threads(threads)
    torch.set_rng_state(rng)


def trainer(model: str = SM, steps: int = 1, max_workers: int = 4) -> ElasticTrainer:
    t = ElasticTrainer(get_model(model), max_workers, 0, 1)
    for _ in range(steps):
        t.step()
    return t


def split(data: bytes) -> tuple[dict[str, Any], bytes]:
    """A checkpoint file's header and payload."""
    end = data.index(b"\n", len(ckpt.MAGIC))
    return json.loads(data[len(ckpt.MAGIC) : end])["header"], data[end + 1 :]


def forged(data: bytes, **changes: Any) -> bytes:
    """The checkpoint with header fields changed and its header digest made right again (a forger's file, or one
    of another version of distsim): what only the checks beyond the digests can refuse."""
    header, payload = split(data)
    return ckpt.MAGIC + ckpt._header_line({**header, **changes}) + payload


@pytest.fixture(scope="module")
def real() -> dict[str, bytes]:
    """One real checkpoint of the small BERT after one step (4 ESTs), and one of a small GPT-2, as bytes."""
    threads, det, rng = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(), torch.get_rng_state()
    deterministic(1)
    out: dict[str, bytes] = {}
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name, model in (("bert", SM), ("gpt", GPT)):
            path = os.path.join(tmp, f"{name}.pt")
            save_checkpoint(trainer(model), path)
            out[name] = Path(path).read_bytes()
    torch.use_deterministic_algorithms(det)
    torch.set_num_threads(threads)
    torch.set_rng_state(rng)
    return out


def checkpoint_files(real: dict[str, bytes]) -> dict[str, bytes | str]:
    good = real["bert"]
    middle = len(good) // 2
    step_at = good.index(b'"step":1')
    return {
        "good.pt": good,
        "gpt.pt": real["gpt"],
        "random.pt": random.Random(0).randbytes(5000),
        "text.pt": "hello, I am not a checkpoint\n",
        "empty.pt": b"",
        "magic-only.pt": good[:10],
        "half-header.pt": good[: len(ckpt.MAGIC) + 200],
        "truncated.pt": good[:middle],
        "flipped.pt": good[:middle] + bytes(b ^ 0xFF for b in good[middle : middle + 64]) + good[middle + 64 :],
        "header-flipped.pt": good[:step_at] + b'"step":7' + good[step_at + 8 :],
        "trailing.pt": good + b"\0\0",
        "negative-step.pt": forged(good, step=-5),
        "format-3.pt": forged(good, format=3),
        "huge-header.pt": ckpt.MAGIC + b"{" * 5000,  # with MAX_HEADER_BYTES lowered to 4096 (case_dir)
        "no-params.pt": forged(good, params="none"),
    }


# ------------------------------------------------------------------------------------------------ the sweep
CASES = [
    # 1. the worker count, guarded by the memory its ESTs need
    ("a hundred million ESTs", [*EX, "--max-workers", "100000000"], "GB of memory here"),
    ("mini-batches of 10^8 samples", [*EX, "--micro-batch-size", "100000000"], "GB of one mini-batch's activations"),
    ("a thousand ranks", [*EX[:-3], "1000", "--emulate-nodes", "1", "--procs-per-node", "1000"], "on 1000 rank(s)"),
    # 2. checkpoints that cannot lie
    ("resume random bytes", [*EX, "--resume", "{dir}/random.pt"], "{dir}/random.pt: not a distsim elastic checkpoint"),
    ("resume a text file", [*EX, "--resume", "{dir}/text.pt"], "text.pt: not a distsim elastic checkpoint"),
    ("resume an empty file", [*EX, "--resume", "{dir}/empty.pt"], "empty.pt: the file is empty"),
    ("resume torch.save([1, 2, 3])", [*EX, "--resume", "{dir}/list.pt"], "list.pt: not a distsim elastic checkpoint"),
    ("resume cut in the magic line", [*EX, "--resume", "{dir}/magic-only.pt"], "magic-only.pt: truncated (10 bytes"),
    ("resume cut in the header", [*EX, "--resume", "{dir}/half-header.pt"], "half-header.pt: truncated"),
    ("resume cut in the payload", [*EX, "--resume", "{dir}/truncated.pt"], "truncated.pt: truncated ("),
    ("resume 64 bytes flipped", [*EX, "--resume", "{dir}/flipped.pt"], "checksum mismatch: the file is corrupt"),
    ("resume a flipped header", [*EX, "--resume", "{dir}/header-flipped.pt"],
     "checksum mismatch in the header: the file is corrupt"),
    ("resume trailing bytes", [*EX, "--resume", "{dir}/trailing.pt"], "2 bytes after the end of the checkpoint"),
    ("resume step -5", [*EX, "--resume", "{dir}/negative-step.pt"], "step -5 is not a valid step"),
    ("resume format 3", [*EX, "--resume", "{dir}/format-3.pt"], "checkpoint format 3; this distsim reads format 2"),
    ("resume a header without end", [*EX, "--resume", "{dir}/huge-header.pt"], "no end of line within 4,096 bytes"),
    ("resume a malformed header field", [*EX, "--resume", "{dir}/no-params.pt"], "the header's 'params' is 'none'"),
    ("resume another model", [*EX, "--resume", "{dir}/gpt.pt"], f"made for model {get_model(GPT).name}, not "
                                                                 f"{get_model(SM).name}"),
    ("resume other ESTs", [*EX[:-3], "3", "--resume", "{dir}/good.pt"], "written with max workers 4, this run has 3"),
    ("resume another seed", [*EX, "--seed", "1", "--resume", "{dir}/good.pt"], "written with seed 0, this run has 1"),
    ("resume other masking", [*EX, "--mask-tokens", "0.1", "--resume", "{dir}/good.pt"],
     "written with mask tokens 0.0, this run has 0.1"),
    ("resume a missing file", [*EX, "--resume", "{dir}/none.pt"], "no checkpoint file"),
    # 3. outputs checked before the run
    ("checkpoint directory missing", [*EX, "--checkpoint-out", "{dir}/no/ck.pt"], "does not exist"),
    ("checkpoint to stdout", [*EX, "--checkpoint-out", "-"], "needs a file name"),
    ("params directory missing", [*EX, "--params-out", "{dir}/no/p.pt"], "does not exist"),
    # 4. options the mode does not use (each one: test_every_unused_option_is_refused)
    ("elastic --recompute full", [*EX, "--recompute", "full"], "--recompute does not apply to --elastic"),
    ("elastic --out", [*EX, "--out", "{dir}/zz.json"], "--out does not apply to --elastic"),
    ("elastic --iterations 5, the default", [*EX, "--iterations", "5"], "--iterations does not apply to --elastic"),
    ("plan --steps 1, the default", [*PLAN_RUN, "--steps", "1"], "--steps applies to --elastic runs only"),
    # 5. finite floats in range
    ("mask nan", [*EX, "--mask-tokens", "nan"], "'nan' is not a finite number"),
    ("mask 1", [*EX, "--mask-tokens", "1"], "--mask-tokens"),
    ("mask -inf", [*EX, "--mask-tokens", "-inf"], "--mask-tokens"),
    ("timeout nan", [*EX, "--timeout", "nan"], "'nan' is not a finite number"),
    ("timeout inf", [*EX, "--timeout", "inf"], "--timeout"),
    ("timeout 1e300", [*EX, "--timeout", "1e300"], "--timeout"),
    ("bucket cap nan", [*PLAN_RUN, "--bucket-cap-mb", "nan"], "'nan' is not a finite number"),
    ("bucket cap inf", [*PLAN_RUN, "--bucket-cap-mb", "inf"], "'inf' is not a finite number"),
    # 6. an EST that fits in no GPU; flash attention keeps 4as, not the 5as^2 scores, per layer and sample:
    # (5 x 96 x 2048^2 - 4 x 96 x 2048) B x 96 layers x 32 = 6,182.3 GB below stored-score attention's 11,622.6 GB
    ("no GPU holds an EST", ["search", "elastic", "--model", "gpt3-175b", "--max-workers", "4", "--gpus", "A100:2"],
     "no GPU holds one EST of gpt3-175b at --micro-batch-size 32 (A100: needs 5,440.2 GB of 80 GB)"),
    # 7. the planner's bounds
    ("planner work over the limit", [*SEARCH, "-P", "100000000", "--gpus", "V100:1000,T4:1000", "--capabilities",
                                     "V100:2,T4:1"], "over the planner's limit of 20 s"),
    ("maxP over 10^9", [*SEARCH, "-P", "1000000001", "--gpus", "V100:4"], "over the planner's limit of 1,000,000,000"),
]  # fmt: skip


@pytest.fixture
def case_dir(
    tmp_path: Path, real: dict[str, bytes], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """The case's directory with the files its command line names (only those: the checkpoints are megabytes, and
    the harness reads the directory before and after); a header limit of 4 KiB, so that a header without end is
    cheap to write."""
    callspec = getattr(request.node, "callspec", None)
    args = " ".join(callspec.params.get("args", []) if callspec is not None else [])
    files = checkpoint_files(real)
    write_files(tmp_path, {name: content for name, content in files.items() if "{dir}/" + name in args})
    if "{dir}/list.pt" in args:
        torch.save([1, 2, 3], tmp_path / "list.pt")
    monkeypatch.setattr(ckpt, "MAX_HEADER_BYTES", 4096)
    return tmp_path


@pytest.mark.parametrize(("what", "args", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_elastic_input_is_one_line_and_exit_2(
    case_dir: Path, capsys: pytest.CaptureFixture[str], what: str, args: list[str], message: str
) -> None:
    check_bad_input(case_dir, capsys, what, args, message)


# ------------------------------------------------------------------------------------ 4. the options' table
def _value(param: Any) -> list[str]:
    """A command-line word list giving `param` a value it accepts (its default where it has one)."""
    import click

    flag = next(o for o in param.opts if o.startswith("--"))
    if getattr(param, "is_flag", False):
        return [flag]
    samples = {"cluster_name": "cpu-1x2", "strategy_text": "1M1P1D", "partition": "2", "link_bandwidth": "1gbit",
               "max_workers": "2", "mask_tokens": "0.1", "bucket_cap_mb": "25"}  # fmt: skip
    if param.name in samples:
        return [flag, samples[param.name]]
    if isinstance(param.default, (int, float, str)):  # click 8.3 marks "no default" with a sentinel
        return [flag, str(param.default)]
    if isinstance(param.type, click.Choice):
        return [flag, str(param.type.choices[0])]
    if isinstance(param.type, click.Path):
        return [flag, "{dir}/" + param.name + ".x"]
    if isinstance(param.type, click.IntRange):
        return [flag, str(param.type.min or 1)]
    raise AssertionError(f"no sample value for {flag}")


def test_every_option_of_execute_is_classified() -> None:
    assert {p.name for p in execute.params if p.expose_value} == set(USED_BY)
    assert set(USED_BY.values()) == {PLAN, ELASTIC, BOTH}


@pytest.mark.parametrize(
    "name", [n for n, used in USED_BY.items() if used != BOTH], ids=[n for n, u in USED_BY.items() if u != BOTH]
)
def test_every_unused_option_is_refused(case_dir: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """Each option that one kind of run does not use, given (with its default value where it has one) to that kind:
    one line naming it, nothing run, nothing written."""
    param = next(p for p in execute.params if p.name == name)
    words = _value(param)
    if USED_BY[name] == PLAN:
        check_bad_input(case_dir, capsys, name, [*EX, *words], f"{words[0]} does not apply to --elastic")
    else:
        check_bad_input(case_dir, capsys, name, [*PLAN_RUN, *words], f"{words[0]} applies to --elastic runs only")


def test_options_a_run_uses_may_be_given_with_their_defaults(
    capsys: pytest.CaptureFixture[str], d1_process: Any
) -> None:
    code, _out, err = run_cli([*EX[:-1], "0", "--seed", "0", "--timeout", "900", "--procs-per-node", "1",
                               "--micro-batch-size", "1"], capsys)  # fmt: skip
    assert code == 0, err


# ------------------------------------------------------------------------------------ 1. the worker count
def test_memory_needed_is_what_the_trainer_allocates_per_est() -> None:
    """The guard's model of a rank's memory: each EST slot's gradient buffer is the model's fp32 parameters (what
    ElasticTrainer allocates), gathered P-fold on every rank of several, plus its context."""
    t = ElasticTrainer(get_model(SM), 6, 0, 1)
    params = get_model(SM).params
    assert t.est_grads.numel() * 4 == 6 * 4 * params
    one, more = memory_needed(params, 6, 1), memory_needed(params, 7, 1)
    assert more - one == 4 * params + 2 * 5_600
    assert memory_needed(params, 8, 2) == 4 * params * (4 + 8 + 5) + 2 * 8 * 5_600
    # Per layer and sample the attention core keeps (fp32, a = 4, s = 16, as^2 = 1,024): with stored scores
    # (2e + 1) as^2 = 9,216 B (softmax, 1-byte dropout mask, dropout output), which the memory model once counted as
    # 5as^2 x 2 = 10,240 B (the docstring's 197,632 B a sample; 196,900 measured); with flash attention 4as = 256 B.
    # The guard counts stored scores whatever the model says (the measurement is that close to it), two layers:
    assert activation_bytes(get_model(SM), 3) == 3 * (197_632 - 2 * (10_240 - 9_216))  # 195,584 B a sample
    assert activation_bytes(get_model(SM + ",attention=flash"), 3) == activation_bytes(get_model(SM), 3)


# ------------------------------------------------------------------------------------ 2. checkpoints
def test_a_checkpoint_round_trips_bit_for_bit(tmp_path: Path, d1_process: Any) -> None:
    deterministic(1)
    t = trainer()
    save_checkpoint(t, str(tmp_path / "ck.pt"))
    state = ckpt.read_checkpoint(str(tmp_path / "ck.pt"), t.identity())
    mine = t.state()
    assert state["step"] == 1 and state["model"] == get_model(SM).name
    assert all(torch.equal(mine["params"][k], state["params"][k]) for k in mine["params"])
    assert all(torch.equal(a["rng"], b["rng"]) for a, b in zip(mine["ests"], state["ests"], strict=True))
    resumed = ElasticTrainer(get_model(SM), 4, 0, 1)
    resumed.load(state)
    t.step()
    resumed.step()
    ours, theirs = t.named_params(), resumed.named_params()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    header, _start = ckpt.read_header(str(tmp_path / "ck.pt"))
    assert header["params"] == ckpt.params_spec(t.named_params())
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_payload_is_loaded_as_tensors_only(tmp_path: Path, real: dict[str, bytes]) -> None:
    """A payload that is a pickle of arbitrary objects, checksummed as a forger would: weights_only refuses it, so
    nothing of it runs."""
    import hashlib
    import io

    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    buf = io.BytesIO()
    torch.save({"x": Evil()}, buf)
    payload = buf.getvalue()
    header, _ = split(real["bert"])
    header = {**header, "payload_bytes": f"{len(payload):020d}", "payload_sha256": hashlib.sha256(payload).hexdigest()}
    path = tmp_path / "evil.pt"
    path.write_bytes(ckpt.MAGIC + ckpt._header_line(header) + payload)
    identity = {k: header[k] for k in ckpt.IDENTITY}
    with pytest.raises(ckpt.CheckpointError, match="its payload cannot be loaded as tensors"):
        ckpt.read_checkpoint(str(path), identity)
    assert not (tmp_path / "pwned").exists()


def test_a_payload_that_contradicts_its_header_is_refused(tmp_path: Path, real: dict[str, bytes]) -> None:
    path = tmp_path / "contra.pt"
    path.write_bytes(forged(real["bert"], step=3))
    header, _ = ckpt.read_header(str(path))
    with pytest.raises(ckpt.CheckpointError, match=r"payload's step \(1\) contradicts its header's \(3\)"):
        ckpt.read_checkpoint(str(path), {k: header[k] for k in ckpt.IDENTITY})


def test_parameters_of_other_shapes_are_refused_before_loading(
    tmp_path: Path, real: dict[str, bytes], capsys: pytest.CaptureFixture[str], d1_process: Any
) -> None:
    """A header naming this model but other parameter shapes (a zoo model changed between versions): refused by
    the rank (which has built the model) before the payload is loaded."""
    header, _ = split(real["bert"])
    params = [[n, [s[0] + 1, *s[1:]] if i == 0 else s, d] for i, (n, s, d) in enumerate(header["params"])]
    (tmp_path / "shapes.pt").write_bytes(forged(real["bert"], params=params))
    code, _out, err = run_cli([*EX, "--resume", str(tmp_path / "shapes.pt")], capsys)
    assert code == 2
    name = params[0][0]
    assert f"its parameters are not those of {get_model(SM).name} ({name}: (513, 64) float32 in the file, " in err
    assert "Traceback" not in err


def test_the_trainer_refuses_malformed_states(d1_process: Any) -> None:
    t = trainer(steps=0)
    good = trainer().state()
    wrong = {"step": torch.tensor(1.0), "exp_avg": torch.zeros(1), "exp_avg_sq": torch.zeros(1)}  # not (512, 64)
    bad = [
        ({**good, "step": -1}, "step -1 is not a valid step"),
        ({**good, "step": True}, "step True is not a valid step"),
        ({**good, "model": "x"}, "made for model x"),
        ({**good, "ests": good["ests"][:3]}, "are not 4 RNG states"),
        ({**good, "ests": [{"rng": torch.zeros(3, dtype=torch.uint8), "step": 1}] * 4}, "are not 4 RNG states"),
        ({**good, "params": {k: v[..., :1] for k, v in good["params"].items()}}, "is not a"),
        ({**good, "optimizer": {"state": {}, "param_groups": []}}, "not Adam's over this model's parameters"),
        ({**good, "optimizer": {**good["optimizer"], "state": {0: wrong}}}, "not Adam's"),
        ([1, 2, 3], "not an elastic checkpoint"),
    ]
    for state, message in bad:
        with pytest.raises(DistsimError, match=message):
            t.load(state)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ 3. writing atomically
class Signal:
    """Pickled inside a checkpoint's state: sends this process a real signal while torch.save serialises."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __reduce__(self) -> Any:
        os.kill(os.getpid(), self.signum)
        return (int, (0,))


@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, SystemExit)])
def test_a_signal_while_serialising_leaves_no_file(tmp_path: Path, real: dict[str, bytes], signum: int,
                                                   raised: type[BaseException], d1_process: Any) -> None:  # fmt: skip
    state = {**trainer(steps=0).state(), "interrupt": Signal(signum)}
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(raised):
        ckpt.write_checkpoint(state, str(tmp_path / "ck.pt"))
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is before  # the writer's handlers are gone


@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, SystemExit)])
def test_a_signal_while_writing_leaves_the_old_checkpoint(tmp_path: Path, real: dict[str, bytes], signum: int,
                                                          raised: type[BaseException], d1_process: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A real signal sent from inside the file writer once part of the payload is on disk: the temporary file is
    removed, the checkpoint already at the path is untouched."""
    path = tmp_path / "ck.pt"
    path.write_bytes(real["bert"])
    write = ckpt._HashingWriter.write

    def interrupted(self: Any, data: Any) -> int:
        if self.count > 4096:
            os.kill(os.getpid(), signum)
        return write(self, data)

    monkeypatch.setattr(ckpt._HashingWriter, "write", interrupted)
    with pytest.raises(raised):
        save_checkpoint(trainer(steps=2), str(path))
    assert [p.name for p in tmp_path.iterdir()] == ["ck.pt"] and path.read_bytes() == real["bert"]


def test_a_full_disk_is_one_line_and_leaves_nothing(full_dir: Path, d1_process: Any) -> None:
    state = trainer(steps=0).state()
    with pytest.raises(OutputError, match=r"ck.pt: cannot write \(No space left on device\)"):
        ckpt.write_checkpoint(state, str(full_dir / "ck.pt"))
    with pytest.raises(OutputError, match="No space left on device"):
        ckpt.save_atomically(state["params"], str(full_dir / "p.pt"))
    assert [p.name for p in full_dir.iterdir()] == [".fill"]


def test_a_full_disk_under_the_cli(full_dir: Path, capsys: pytest.CaptureFixture[str], d1_process: Any) -> None:
    code, _out, err = run_cli([*EX, "--checkpoint-out", str(full_dir / "ck.pt")], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and lines[-1] == f"distsim: error: {full_dir / 'ck.pt'}: cannot write (No space left on device)"
    assert "Traceback" not in err and [p.name for p in full_dir.iterdir()] == [".fill"]


# ------------------------------------------------------------------------------------ 6, 7. the planner
def test_gpus_that_cannot_hold_an_est_host_none(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["search", "elastic", "--model", "bert-large", "-P", "4", "--gpus", "A100:2,T4:2",
                              "-b", "64", "--json"], capsys)  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["unfit"] == ["T4"] and not data["capabilities"]["T4"]["fits"]
    assert data["plans"] and all(set(p["counts"]) == {"A100"} for p in data["plans"])
    code, out, err = run_cli(["search", "elastic", "--model", "bert-large", "-P", "4", "--gpus", "A100:2,T4:2",
                              "-b", "64", "--capabilities", "T4:100"], capsys)  # fmt: skip
    assert code == 0 and "over the GPU's 16 GB: not planned" in out  # a given capability keeps the memory check


def test_the_planner_cost_does_not_grow_with_max_workers(capsys: pytest.CaptureFixture[str]) -> None:
    """10^9 ESTs on four V100: four plans, found by bisection over the GPU sets rather than a sweep of 10^9 step
    times (which took 57 s and 17 GB at 10^7, and never ended at 10^9)."""
    rss = peak_rss_bytes()
    with bounded(60):
        plans = enumerate_plans(10**9, {"V100": 28.0}, {"V100": 4})
        code, out, err = run_cli([*SEARCH, "--max-workers", "1000000000", "--gpus", "V100:4"], capsys)
    assert [(p.counts["V100"], p.ests["V100"]) for p in plans] == [(4, 250_000_000), (3, 333_333_334),
                                                                    (2, 500_000_000), (1, 1_000_000_000)]  # fmt: skip
    assert code == 0 and "4 plans" in out, err
    assert peak_rss_bytes() - rss < 200 << 20


def test_both_enumerations_find_the_same_plans() -> None:
    """The sweep over step times and the bisection over GPU sets, on random small cases (the existing brute-force
    test checks enumerate_plans, which picks one of them)."""
    rng = random.Random(7)
    types = ["V100", "P100", "T4"]
    for _ in range(300):
        k = rng.randint(1, 3)
        caps = [rng.choice([0.5, 1.0, 1.5, 1.9, 2.0, 3.0, 3.7, 4.0, 10.5, 1 / 3]) for _ in range(k)]
        limits = [rng.randint(1, 5) for _ in range(k)]
        p = rng.randint(1, 30)
        space = planner._Space(p, caps, [min(n, p) for n in limits])
        assert sorted(space.by_sweep()) == sorted(space.by_set()), (p, caps, limits, types[:k])


def test_too_many_plans_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner, "MAX_PLANS", 5)
    with pytest.raises(ElasticPlanError, match="have more than 5 plans") as exc:
        enumerate_plans(64, {"V100": 10.5, "T4": 3.2}, {"V100": 32, "T4": 32})
    assert "\n" not in str(exc.value)
