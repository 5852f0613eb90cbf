"""Every result of a sweep of 310 configurations is the one recorded (``tests/data/result_sweep.json``, written by
``python -m tests.result_sweep digests``): iteration time, memory, per-GPU figures, task count and timeline rows,
bit for bit. It guards the speed-ups that must change no output (issue 24: symmetry decided once per shape, patterns
counted with numpy, per-GPU stats kept per simulated GPU). A change meant to alter results records the digests
again, and says so; ``python -m tests.result_sweep record|compare`` shows which fields changed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.result_sweep import digest, sweep

RECORDED = Path(__file__).parent.parent / "data" / "result_sweep.json"


def test_every_result_of_the_sweep_is_the_recorded_one() -> None:
    recorded = json.loads(RECORDED.read_text())
    got = {k: digest(json.loads(json.dumps(v, sort_keys=True))) for k, v in sweep().items()}
    assert sorted(got) == sorted(recorded), "the sweep's configurations changed: record the digests again"
    differ = [k for k in got if got[k] != recorded[k]]
    assert not differ, f"{len(differ)} of {len(got)} results changed, e.g. {differ[:3]}"
