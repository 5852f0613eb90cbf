"""Simulated against measured: DistSim's three accuracy metrics (Sec. 5.2-5.4).

* **Batch-time error**: |predicted - measured| / measured iteration time (the median of the measured iterations).
* **Per-GPU activity error**: for every compute event of a GPU (a block's forward, recomputed forward or backward on
  one micro-batch, including the tensor-parallel all-reduce inside it, so that simulated and measured events cover
  the same work), the mean of |start error| and |end error|, averaged over the GPU's events, relative to the measured
  iteration time.
* **Per-stage error**: for every (stage, forward/backward, micro-batch) action, the error of its start and of its end,
  relative to the iteration time (a backward action's recomputed forwards are an action of their own).

Errors against several measured iterations are computed per iteration and summarised by their median. Iteration
times, and the per-GPU busy time, bubble fraction and exposed communication kept beside the errors, are
:mod:`distsim.sim.metrics`' functions, the same for the measured and the predicted timeline.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from distsim.sim import metrics
from distsim.sim.metrics import Metrics
from distsim.sim.timeline import Timeline

COMPUTE = ("forward", "recompute", "backward")
KEY = ["gpu", "kind", "name", "layer", "stage", "microbatch"]


def block_spans(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (gpu, forward/recompute/backward, block, micro-batch): from its first compute to the end of its tp
    collective.

    A block's rows are its compute row(s) and the tensor-parallel all-reduce rows of the same block and micro-batch
    that follow them on that GPU, until another block starts.
    """
    rows = df[df["kind"].isin([*COMPUTE, "tp_allreduce"])].sort_values(["gpu", "start_s", "end_s"], kind="stable")
    out = []
    current: list | None = None
    for gpu, kind, name, layer, stage, mb, start, end in rows[[*KEY, "start_s", "end_s"]].itertuples(index=False):
        kind = str(kind)
        same = current is not None and current[0] == gpu and current[2:6] == [str(name), layer, stage, mb]
        if kind in COMPUTE and not (same and current[1] == kind):
            if current is not None:
                out.append(current)
            current = [gpu, kind, str(name), layer, stage, mb, start, end]
        elif same:
            current[7] = max(current[7], end)
    if current is not None:
        out.append(current)
    return pd.DataFrame(out, columns=[*KEY, "start_s", "end_s"])


ACTION = ["gpu", "stage", "kind", "microbatch"]


@dataclass
class Comparison:
    """Errors of one prediction against one measured iteration."""

    predicted_s: float
    measured_s: float
    per_gpu: dict[int, float]
    matches: pd.DataFrame
    """The matched block spans: :data:`KEY`, then predicted and measured start and end (``start_s_p``,
    ``start_s_m``, ``end_s_p``, ``end_s_m``)."""
    matched: int
    unmatched: int

    @property
    def batch_error(self) -> float:
        return abs(self.predicted_s - self.measured_s) / self.measured_s

    @cached_property
    def per_stage(self) -> pd.DataFrame:
        """gpu, stage, kind, microbatch, start_error, end_error (relative to the measured iteration)."""
        return action_errors(action_spans(self.matches), self.measured_s)[[*ACTION, "start_error", "end_error"]]


def action_spans(matches: pd.DataFrame, by: list[str] = ACTION) -> pd.DataFrame:
    """Each action's (`by`) first start and last end, predicted and measured (`start_p`, `start_m`, `end_p`,
    `end_m`), one row each, `by` as columns."""
    return matches.groupby(by, as_index=False).agg(
        start_p=("start_s_p", "min"), start_m=("start_s_m", "min"), end_p=("end_s_p", "max"), end_m=("end_s_m", "max")
    )


def action_errors(actions: pd.DataFrame, measured_s: float | np.ndarray) -> pd.DataFrame:
    """`actions` (:func:`action_spans`) with the errors of their start and end relative to `measured_s` (one
    iteration's time, or each row's)."""
    actions["start_error"] = (actions["start_p"] - actions["start_m"]).abs() / measured_s
    actions["end_error"] = (actions["end_p"] - actions["end_m"]).abs() / measured_s
    return actions


def compare(predicted: Timeline, measured: Timeline, predicted_spans: pd.DataFrame | None = None) -> Comparison:
    """The errors of `predicted` against one measured iteration; `predicted_spans`: the predicted timeline's
    :func:`block_spans` where the caller has them (one prediction compared with several iterations)."""
    pred = block_spans(predicted.expand().df) if predicted_spans is None else predicted_spans
    meas = block_spans(measured.df)
    t = metrics.iteration_time(measured)
    both = pred.merge(meas, on=KEY, suffixes=("_p", "_m"))
    both["start_err"] = (both["start_s_p"] - both["start_s_m"]).abs() / t
    both["end_err"] = (both["end_s_p"] - both["end_s_m"]).abs() / t
    both["err"] = (both["start_err"] + both["end_err"]) / 2
    per_gpu = {int(g): float(v) for g, v in both.groupby("gpu")["err"].mean().items()}
    unmatched = len(pred) + len(meas) - 2 * len(both)
    matches = both[[*KEY, "start_s_p", "start_s_m", "end_s_p", "end_s_m"]]
    return Comparison(metrics.iteration_time(predicted), t, per_gpu, matches, len(both), unmatched)


@dataclass
class Validation:
    """A prediction against every measured iteration of a trace."""

    comparisons: list[Comparison]
    predicted_s: float
    measured_s: float
    """Median measured iteration time."""
    iteration_times_s: list[float] = field(default_factory=list)
    deterministic_s: float | None = None
    """The prediction with mean durations (when the main prediction is stochastic)."""
    predicted_metrics: Metrics | None = None
    """The predicted timeline's iteration time and per-GPU stats (:func:`distsim.sim.metrics.of_timeline`)."""
    measured_metrics: list[Metrics] = field(default_factory=list)
    """The same of every measured iteration (their iteration times are `iteration_times_s`)."""

    @property
    def batch_error(self) -> float:
        return abs(self.predicted_s - self.measured_s) / self.measured_s

    @property
    def signed_batch_error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def per_gpu_error(self) -> dict[int, float]:
        gpus = sorted({g for c in self.comparisons for g in c.per_gpu})
        return {g: statistics.median(c.per_gpu[g] for c in self.comparisons if g in c.per_gpu) for g in gpus}

    @property
    def max_gpu_error(self) -> float:
        return max(self.per_gpu_error.values(), default=0.0)

    @cached_property
    def per_stage(self) -> pd.DataFrame:
        """Median over iterations of each action's start and end errors (the actions of every iteration grouped at
        once: the same errors as each :attr:`Comparison.per_stage`)."""
        if not self.comparisons:
            return pd.DataFrame(columns=[*ACTION, "start_error", "end_error"])
        matches = pd.concat([c.matches.assign(iteration=i) for i, c in enumerate(self.comparisons)])
        actions = action_spans(matches, ["iteration", *ACTION])
        measured = np.array([c.measured_s for c in self.comparisons])
        actions = action_errors(actions, measured[actions["iteration"].to_numpy()])
        return actions.groupby(ACTION, as_index=False)[["start_error", "end_error"]].median()

    @property
    def stage_error_median(self) -> float:
        s = self.per_stage
        return float(np.median(np.maximum(s["start_error"], s["end_error"]))) if len(s) else 0.0

    @property
    def measured_spread(self) -> float:
        """(max - min) / median of the measured iteration times: the run's own noise."""
        return iteration_spread(self.iteration_times_s)

    @property
    def too_noisy(self) -> bool:
        """Whether the measurement is too noisy to judge the prediction: its iterations spread more than the error
        the comparison reports (an error inside the run's own noise says nothing about the model)."""
        return self.measured_spread > self.batch_error

    def to_dict(self) -> dict[str, object]:
        return {
            "predicted_s": self.predicted_s, "measured_s": self.measured_s, "batch_error": self.batch_error,
            "predicted_with_mean_durations_s": self.deterministic_s,
            "signed_batch_error": self.signed_batch_error, "per_gpu_error": self.per_gpu_error,
            "max_gpu_error": self.max_gpu_error, "stage_error_median": self.stage_error_median,
            "measured_iteration_s": self.iteration_times_s, "measured_spread": self.measured_spread,
            "too_noisy": self.too_noisy,
            "matched_events": self.comparisons[0].matched if self.comparisons else 0,
        }  # fmt: skip


def iteration_spread(times_s: Sequence[float]) -> float:
    """(max - min) / median of iteration times: a run's own noise (0 for no times)."""
    return (max(times_s) - min(times_s)) / statistics.median(times_s) if times_s else 0.0


def validate_timelines(predicted: Timeline, measured: list[Timeline], predicted_s: float | None = None) -> Validation:
    """Compare a predicted timeline with every measured iteration; `predicted_s` overrides the predicted iteration
    time (a stochastic simulation's median)."""
    spans = block_spans(predicted.expand().df)  # once, not once per measured iteration
    comparisons = [compare(predicted, m, spans) for m in measured]
    predicted_metrics, measured_metrics = metrics.of_timeline(predicted), [metrics.of_timeline(m) for m in measured]
    times = [m.iteration_time_s for m in measured_metrics]
    predicted_s = predicted_metrics.iteration_time_s if predicted_s is None else predicted_s
    return Validation(comparisons, predicted_s, statistics.median(times), times,
                      predicted_metrics=predicted_metrics, measured_metrics=measured_metrics)  # fmt: skip
