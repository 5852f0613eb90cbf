"""A profile's self-check: its isolated compute timings against the same blocks timed in situ (pure, no torch).

The profiler times every compute event alone (``distsim.profiler.compute``). How far that is from what the blocks
take inside training depends on the device and on the timing method (on an H100, timing with a synchronisation before
each call measured transformer blocks 1.14-1.35x their time in a 24-layer chain). So that every profile states its
own bias, the profiler also runs a short chain of each distinct stage's blocks in situ (``distsim.profiler.insitu``)
and records, per event, isolated / in-situ (``Measurement.insitu_ratio``), and a summary in the provenance
(``self_check``): per chain, the sum of its blocks' isolated times against the chain's in-situ time.

This module turns the chains' raw timings into that record, and the record into lines for ``distsim profile show``
and a warning for ``distsim simulate --profile``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

BIAS_LIMIT = 0.15
"""A stage chain whose isolated sum is off its in-situ time by more than this is reported as a bias."""
SHOW_LIMIT = 0.10
"""``profile show`` lists the events whose ratio is off 1 by more than this."""
METHOD = (
    "per distinct pipeline stage of the profiled strategies, a chain of a few of its layers' blocks (every distinct "
    "block, at least 4 layers) run forward then backward in reverse with no host synchronisation between blocks; "
    "CUDA events between blocks on GPUs (the GPU asleep while the host enqueues the first block, L2 swept before "
    "each round), perf_counter on CPUs; ratio = isolated mean / in-situ mean"
)


def summarise(
    chains: list[dict[str, Any]], isolated: Mapping[str, float], measured: Collection[str], seconds: float = 0.0
) -> tuple[dict[str, float], dict[str, Any]]:
    """Per-event ratios (isolated / in situ, for the events in `measured` that a chain ran) and the provenance
    summary, from chain timings ``{"label", "layers", "keys": [event key per position in run order],
    "samples_s": [[seconds per round] per position]}`` and the isolated seconds per event key."""
    insitu: dict[str, list[float]] = {}
    rows = []
    for chain in chains:
        means = [statistics.fmean(s) for s in chain["samples_s"]]
        for key, samples in zip(chain["keys"], chain["samples_s"], strict=True):
            insitu.setdefault(key, []).extend(samples)
        total = sum(means)
        row: dict[str, Any] = {"label": chain["label"], "layers": list(chain["layers"]), "blocks": len(means) // 2,
                               "insitu_s": round(total, 7)}  # fmt: skip
        if all(k in isolated for k in chain["keys"]) and total > 0:
            predicted = sum(isolated[k] for k in chain["keys"])
            row["isolated_s"] = round(predicted, 7)
            row["ratio"] = round(predicted / total, 4)
        rows.append(row)
    ratios = {}
    for key, samples in sorted(insitu.items()):
        mean = statistics.fmean(samples)
        if key in measured and key in isolated and mean > 0:
            ratios[key] = round(isolated[key] / mean, 4)
    summary: dict[str, Any] = {"method": METHOD, "chains": rows, "events": len(ratios), "seconds": round(seconds, 1)}
    if ratios:
        values = list(ratios.values())
        summary.update(ratio_median=round(statistics.median(values), 4), ratio_min=min(values),
                       ratio_max=max(values))  # fmt: skip
    compared = [r for r in rows if "ratio" in r]
    if compared:
        summary["stage_ratio"] = round(sum(r["isolated_s"] for r in compared) / sum(r["insitu_s"] for r in compared), 4)
    return ratios, summary


def record(chains: list[dict[str, Any]], results: dict[str, Any], isolated: Mapping[str, float],
           measured: Collection[str], seconds: float, log: Callable[[str], None],
           method: str = METHOD, what: str = "stage chain(s)") -> dict[str, Any]:  # fmt: skip
    """:func:`summarise` the chains, set each measured event's ``insitu_ratio`` in `results` (measurements by event
    key), log the summary (`what` names the chains) and any bias, and return the provenance summary with its
    `method`: what the zoo's stage chains and a user's torch module's chain of blocks share once timed."""
    ratios, summary = summarise(chains, isolated, measured, seconds)
    summary["method"] = method
    for key, ratio in ratios.items():
        results[key] = replace(results[key], insitu_ratio=ratio)
    if "stage_ratio" in summary:
        log(f"self-check: isolated / in-situ {summary['stage_ratio']:.3f} over {len(chains)} {what}, per "
            f"event {summary['ratio_min']:.3f}-{summary['ratio_max']:.3f} ({summary['events']} events)")  # fmt: skip
    warning = bias_warning({"self_check": summary})
    if warning:
        log(f"warning: {warning}")
    return summary


def bias_warning(provenance: Mapping[str, Any], limit: float = BIAS_LIMIT) -> str | None:
    """A line when the profile's self-check found its isolated timings off their in-situ time by more than
    `limit` (None when within it, or when the profile has no self-check)."""
    check = provenance.get("self_check") or {}
    ratio = check.get("stage_ratio")
    if ratio is None or abs(ratio - 1) <= limit:
        return None
    side = "slower" if ratio > 1 else "faster"
    return (f"the profile's self-check timed its blocks {ratio:.2f}x in isolation what they take in situ "
            f"({abs(ratio - 1):.0%} {side}, more than {limit:.0%}): its compute costs carry that bias "
            "(distsim profile show)")  # fmt: skip


ACCELERATOR_WORDS = ("nvidia", "geforce", "tesla", "radeon", "instinct", "cuda")
"""Words of a device name that mark an accelerator (a profile measured on a GPU), not a CPU."""


def device_mismatch(provenance: Mapping[str, Any], gpu_name: str, accelerator: bool) -> str | None:
    """A line when a profile was measured on another device than the cluster's GPU (its event times are that
    device's): a CPU profile for a GPU cluster, a GPU profile for a CPU one, or another GPU model (the first word
    of the cluster GPU's name with a digit, e.g. ``h100`` of ``H100-SXM5-80GB``, not in the profiled device's
    name). None when they match or the profile names no device."""
    profiled = str(provenance.get("device") or "")
    if not profiled:
        return None
    on_accelerator = any(w in profiled.lower() for w in ACCELERATOR_WORDS)
    if on_accelerator == accelerator:
        words = [w for w in _words(gpu_name) if any(ch.isdigit() for ch in w)]
        if not accelerator or not words or words[0] in profiled.lower():
            return None
    return (f"the profile was measured on {profiled}, not on the cluster's {gpu_name}: its event times are that "
            "device's; profile on the cluster's GPU, or leave --profile out for analytic estimates")  # fmt: skip


def _words(name: str) -> list[str]:
    return [w for w in "".join(ch if ch.isalnum() else " " for ch in name.lower()).split() if w]


def describe(provenance: Mapping[str, Any], ratios: Mapping[str, float]) -> list[str]:
    """Lines for ``distsim profile show``: the latest self-check's chains and the events furthest from 1."""
    check = provenance.get("self_check")
    if not check:
        return ["self-check: none recorded (profiled before distsim timed blocks in situ)"]
    head = "self-check, isolated / in-situ time"
    if check.get("stage_ratio") is not None:
        head += f": stage chains {check['stage_ratio']:.3f}"
    if check.get("ratio_median") is not None:
        head += (f"; per event median {check['ratio_median']:.3f} ({check['ratio_min']:.3f}-{check['ratio_max']:.3f})"
                 f" over {check['events']} events")  # fmt: skip
    lines = [head + f" ({len(check.get('chains', []))} chains, {check.get('seconds', 0)} s)"]
    for row in check.get("chains", []):
        layers = ",".join(str(i) for i in row.get("layers", []))
        text = f"  {row['label']} (layers {layers}, {row['blocks']} blocks): in situ {row['insitu_s'] * 1e3:.3f} ms"
        if "ratio" in row:
            text += f", isolated sum {row['isolated_s'] * 1e3:.3f} ms: {row['ratio']:.3f}"
        lines.append(text)
    off = sorted(((abs(r - 1), k, r) for k, r in ratios.items() if abs(r - 1) > SHOW_LIMIT), reverse=True)
    if ratios and not off:
        lines.append(f"  every checked event within {SHOW_LIMIT:.0%} of its in-situ time")
    for _, key, ratio in off[:8]:
        lines.append(f"  off by more than {SHOW_LIMIT:.0%}: {key} {ratio:.3f}")
    if len(off) > 8:
        lines.append(f"  ... and {len(off) - 8} more events (distsim profile show --json)")
    warning = bias_warning(provenance)
    if warning:
        lines.append(f"  warning: {warning}")
    return lines
