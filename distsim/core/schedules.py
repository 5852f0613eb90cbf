"""Pipeline schedules as data: per-rank ordered lists of actions.

An action is written ``"{stage}{F|B}{microbatch}"`` (``"0F1"``: stage 0 forward of micro-batch 1), as in
``torch.distributed.pipelining``. Stages are virtual: with the interleaved schedule rank r holds stages
r, r + pp, r + 2pp, ... (Narayanan et al. 2021, Sec. 2.2.2).

* GPipe (Huang et al. 2019): every forward, then every backward.
* 1F1B, DAPPLE's early backward (Fan et al. 2021, Sec. III-B): stage i injects K_i forwards, then alternates one
  backward with one forward, then drains. Policy A: K_i = min(S - i, D); policy B: K_i = min(2(S - i) - 1, D).
* Interleaved 1F1B (Megatron-LM): (pp - r - 1) * 2 + (v - 1) * pp warm-up forwards on rank r, then one forward and
  one backward per step, then the remaining backwards; chunks are visited in groups of pp micro-batches.

``validate_schedule`` checks completeness and that the schedule cannot deadlock; ``format_grid`` prints the
step x rank grid of a unit-time execution (F and B one step each).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Protocol

from distsim.core.errors import ScheduleError

_ACTION = re.compile(r"^(\d+)([FB])(\d+)$")


@dataclass(frozen=True, order=True)
class Action:
    stage: int
    op: str
    """``F`` (forward) or ``B`` (backward)."""
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.op}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        m = _ACTION.match(text.strip())
        if not m:
            raise ScheduleError(f"cannot read action {text!r}; expected stage, F or B, micro-batch, like '0F1'")
        return cls(int(m.group(1)), m.group(2), int(m.group(3)))


@dataclass(frozen=True)
class Schedule:
    name: str
    num_ranks: int
    num_stages: int
    num_microbatches: int
    ranks: tuple[tuple[Action, ...], ...]
    """ranks[r] is rank r's ordered action list."""

    def stage_rank(self, stage: int) -> int:
        """The pipeline rank that runs a (virtual) stage."""
        return stage % self.num_ranks

    @cached_property
    def steps(self) -> list[list[int]]:
        """:func:`unit_steps` of this schedule, computed once (flow builders walk actions in this order)."""
        return unit_steps(self)

    @cached_property
    def in_unit_time(self) -> tuple[tuple[int, Action], ...]:
        """(rank, action) of every action in unit-time order (:attr:`steps`; at equal steps by rank, then position):
        the order flow builders emit them in, computed once per schedule (schedules are cached and shared)."""
        steps = self.steps
        order = sorted((steps[r][i], r, i) for r, acts in enumerate(self.ranks) for i in range(len(acts)))
        return tuple((r, self.ranks[r][i]) for _, r, i in order)

    def __str__(self) -> str:
        return "\n".join(f"rank {r}: " + " ".join(map(str, acts)) for r, acts in enumerate(self.ranks))

    @classmethod
    def from_lists(cls, name: str, lists: Sequence[Sequence[str]], num_stages: int | None = None) -> Schedule:
        ranks = tuple(tuple(Action.parse(a) for a in acts) for acts in lists)
        stages = num_stages or (1 + max((a.stage for acts in ranks for a in acts), default=0))
        mbs = 1 + max((a.microbatch for acts in ranks for a in acts), default=0)
        sched = cls(name, len(ranks), stages, mbs, ranks)
        validate_schedule(sched)
        return sched


# --------------------------------------------------------------------------------------------------- builders
def gpipe(num_stages: int, num_microbatches: int) -> Schedule:
    ranks = tuple(
        tuple(Action(s, "F", m) for m in range(num_microbatches))
        + tuple(Action(s, "B", m) for m in range(num_microbatches))
        for s in range(num_stages)
    )
    return Schedule("gpipe", num_stages, num_stages, num_microbatches, ranks)


def warmup_count(stage: int, num_stages: int, policy: str = "A", max_in_flight: int | None = None) -> int:
    """DAPPLE's K_i: forwards injected before the first backward on stage i (Sec. III-B, policies A and B)."""
    k = num_stages - stage if policy == "A" else 2 * (num_stages - stage) - 1
    return min(k, max_in_flight) if max_in_flight is not None else k


def one_f_one_b(
    num_stages: int, num_microbatches: int, policy: str = "A", max_in_flight: int | None = None
) -> Schedule:
    ranks = []
    m = num_microbatches
    for s in range(num_stages):
        k = min(warmup_count(s, num_stages, policy, max_in_flight), m)
        acts = [Action(s, "F", i) for i in range(k)]
        for i in range(m - k):
            acts += [Action(s, "B", i), Action(s, "F", k + i)]
        acts += [Action(s, "B", i) for i in range(m - k, m)]
        ranks.append(tuple(acts))
    return Schedule(f"1f1b-{policy}", num_stages, num_stages, m, tuple(ranks))


def interleaved(num_ranks: int, chunks: int, num_microbatches: int) -> Schedule:
    """Megatron-LM's interleaved 1F1B; needs num_microbatches to be a multiple of num_ranks."""
    pp, v, m = num_ranks, chunks, num_microbatches
    if m % pp:
        raise ScheduleError(f"interleaved 1F1B needs micro-batches ({m}) to be a multiple of pp ({pp})")
    total = m * v

    def fwd(rank: int, k: int) -> Action:
        chunk = (k // pp) % v
        return Action(chunk * pp + rank, "F", (k // (pp * v)) * pp + k % pp)

    def bwd(rank: int, k: int) -> Action:
        chunk = v - 1 - (k // pp) % v
        return Action(chunk * pp + rank, "B", (k // (pp * v)) * pp + k % pp)

    ranks = []
    for r in range(pp):
        warm = total if m == pp else min((pp - r - 1) * 2 + (v - 1) * pp, total)
        acts = [fwd(r, k) for k in range(warm)]
        for k in range(total - warm):
            acts += [fwd(r, warm + k), bwd(r, k)]
        acts += [bwd(r, k) for k in range(total - warm, total)]
        ranks.append(tuple(acts))
    return Schedule(f"interleaved-v{v}", pp, pp * v, m, tuple(ranks))


MAX_ACTIONS = 5_000_000
"""Most actions (2 x micro-batches x stages) a schedule may have: its simulation would run at least as many tasks,
more than a simulation is allowed (:data:`distsim.plans.simulate.DEFAULT_MAX_TASKS`)."""


def check_schedule_size(micro_batches: int, stages: int) -> None:
    """Refuse, in one line, a schedule too large to build (a typo such as --micro-batches 1000000000)."""
    actions = 2 * micro_batches * stages
    if actions > MAX_ACTIONS:
        raise ScheduleError(f"{micro_batches:,} micro-batches over {stages} stage(s) make {actions:,} schedule "
                            f"actions, above the limit of {MAX_ACTIONS:,}; use fewer micro-batches")  # fmt: skip


class PipelineShape(Protocol):
    """What a schedule is built from (a :class:`~distsim.core.strategy.Strategy` is one; this module sits below it)."""

    schedule: str
    pp: int
    num_micro_batches: int
    warmup_policy: str
    max_in_flight: int | None

    @property
    def num_stages(self) -> int: ...

    @property
    def chunks(self) -> int: ...


def build_schedule(strategy: PipelineShape) -> Schedule:
    """The strategy's validated schedule. Schedules are immutable values, so equal parameters share one (a grid
    search asks for the same schedule for its memory check and its simulation, and across configurations)."""
    s = strategy
    check_schedule_size(s.num_micro_batches, s.num_stages)
    return _schedule(s.schedule, s.pp, s.num_micro_batches, s.warmup_policy, s.max_in_flight, s.chunks)


@lru_cache(maxsize=64)
def _schedule(kind: str, pp: int, m: int, policy: str, max_in_flight: int | None, chunks: int) -> Schedule:
    sched = SCHEDULES[kind](pp, m, policy, max_in_flight, chunks)
    validate_schedule(sched)
    return sched


ScheduleBuilder = Callable[[int, int, str, int | None, int], Schedule]
"""Builds a schedule from (pipeline ranks, micro-batches, DAPPLE warm-up policy, max in flight, chunks per rank)."""

SCHEDULES: dict[str, ScheduleBuilder] = {
    "gpipe": lambda pp, m, policy, max_in_flight, chunks: gpipe(pp, m),
    "1f1b": lambda pp, m, policy, max_in_flight, chunks: one_f_one_b(pp, m, policy, max_in_flight),
    "interleaved": lambda pp, m, policy, max_in_flight, chunks: interleaved(pp, chunks, m),
}
"""The pipeline schedules by name (as torch.distributed.pipelining's ``get_schedule_class``): strategies, plan files
and the CLI's ``--schedule`` choices read their names from here, so a new schedule is one :func:`register_schedule`
call. ``interleaved`` is the one that runs ``chunks`` > 1 virtual stages per rank (Strategy checks its shapes)."""


def register_schedule(name: str, builder: ScheduleBuilder) -> None:
    """Add (or replace) the schedule `name`; its actions are validated (deadlock-free, every micro-batch once) when
    a strategy first asks for it."""
    SCHEDULES[name] = builder
    _schedule.cache_clear()


# ------------------------------------------------------------------------------------------------- validation
def unit_steps(sched: Schedule) -> list[list[int]]:
    """Start step of every action when each action takes one step and waits for its dependencies.

    Raises ScheduleError if the ranks cannot all finish (a deadlock: every rank waits on another).
    """
    done: dict[tuple[int, str, int], int] = {}  # action -> finish step
    pos = [0] * sched.num_ranks
    steps: list[list[int]] = [[] for _ in range(sched.num_ranks)]
    free = [0] * sched.num_ranks
    remaining = sum(len(a) for a in sched.ranks)
    last = sched.num_stages - 1
    while remaining:
        progressed = False
        for r, acts in enumerate(sched.ranks):
            while pos[r] < len(acts):
                a = acts[pos[r]]
                if a.op == "F":
                    dep = (a.stage - 1, "F", a.microbatch) if a.stage > 0 else None
                else:
                    dep = (a.stage + 1, "B", a.microbatch) if a.stage < last else (a.stage, "F", a.microbatch)
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep] if dep is not None else 0)
                steps[r].append(start)
                done[(a.stage, a.op, a.microbatch)] = start + 1
                free[r] = start + 1
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = ", ".join(
                f"rank {r} at {sched.ranks[r][pos[r]]}" for r in range(sched.num_ranks) if pos[r] < len(sched.ranks[r])
            )
            raise ScheduleError(f"schedule {sched.name} deadlocks: {stuck}")
    return steps


def validate_schedule(sched: Schedule) -> None:
    """Every (stage, F/B, micro-batch) exactly once on the rank that owns the stage, F before B, no deadlock."""
    seen: dict[tuple[int, str, int], int] = {}
    for r, acts in enumerate(sched.ranks):
        for a in acts:
            if a.op not in ("F", "B"):
                raise ScheduleError(f"action {a} has op {a.op!r}; expected F or B")
            if not 0 <= a.stage < sched.num_stages:
                raise ScheduleError(f"action {a} on rank {r} names stage {a.stage}; there are {sched.num_stages}")
            if not 0 <= a.microbatch < sched.num_microbatches:
                raise ScheduleError(f"action {a} names micro-batch {a.microbatch}; there are {sched.num_microbatches}")
            if sched.stage_rank(a.stage) != r:
                raise ScheduleError(
                    f"action {a} is on rank {r} but stage {a.stage} runs on rank {sched.stage_rank(a.stage)}"
                )
            key = (a.stage, a.op, a.microbatch)
            if key in seen:
                raise ScheduleError(f"action {a} appears twice")
            if a.op == "B" and (a.stage, "F", a.microbatch) not in seen:
                raise ScheduleError(f"rank {r} runs {a} before {a.stage}F{a.microbatch}")
            seen[key] = r
    expected = 2 * sched.num_stages * sched.num_microbatches
    if len(seen) != expected:
        missing = [
            f"{s}{op}{m}"
            for s in range(sched.num_stages)
            for op in "FB"
            for m in range(sched.num_microbatches)
            if (s, op, m) not in seen
        ]
        raise ScheduleError(f"schedule {sched.name} is missing {len(missing)} actions, e.g. {', '.join(missing[:4])}")
    sched.steps  # noqa: B018 - computing the steps finds a deadlock (and keeps them for the flow builders)


def peak_in_flight(actions: Sequence[Action], weight: dict[int, float] | None = None) -> float:
    """Largest total weight of micro-batches whose forward ran and whose backward has not, over one rank's actions.

    With no weight this is the count of in-flight micro-batches (DAPPLE's K_i for 1F1B, M for GPipe); with
    per-stage activation bytes it is the rank's peak activation memory.
    """
    live = peak = 0.0  # a comparison rather than max(): a memory check calls this about 40 times
    for a in actions:
        w = 1.0 if weight is None else weight[a.stage]
        live += w if a.op == "F" else -w
        if live > peak:
            peak = live
    return peak


def format_grid(sched: Schedule) -> str:
    """Step x rank table of a unit-time execution; empty cells are bubbles."""
    steps = sched.steps
    n = 1 + max((s for row in steps for s in row), default=-1)
    cells = [["" for _ in range(sched.num_ranks)] for _ in range(n)]
    for r, acts in enumerate(sched.ranks):
        for a, s in zip(acts, steps[r], strict=True):
            cells[s][r] = str(a)
    width = max([len("rank 00"), *(len(c) for row in cells for c in row)])
    head = "step | " + " ".join(f"rank {r}".ljust(width) for r in range(sched.num_ranks))
    lines = [head, "-" * len(head)]
    for i, row in enumerate(cells):
        lines.append(f"{i:4d} | " + " ".join(c.ljust(width) for c in row))
    return "\n".join(lines)
