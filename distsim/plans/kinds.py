"""The registry of plan kinds: everything that differs between a uniform strategy, a DAPPLE stages plan and a
DeepPool burst plan, behind one protocol, so that :func:`distsim.plans.simulate.simulate`, the plan files and the
checks never branch on a kind's name.

A new kind is three files: its plan module (a :class:`PlanKind` registered with :func:`register_plan_kind`, and
imported by ``distsim/plans/__init__.py``), its flow builder and its executor. Pure: no torch, no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from distsim.core.cluster import Cluster
    from distsim.core.models.graph import Model
    from distsim.sim.costs import CostSource
    from distsim.sim.flow.events import EventFlow, FlowOptions
    from distsim.sim.memory import MemoryEstimate

Plan = Any
"""A :class:`distsim.plans.plan.Plan` (not imported: the plan module dispatches to this registry)."""


class PlanKind(Protocol):
    """How one kind of plan is checked, named, written, simulated and sized."""

    name: str
    file_keys: frozenset[str]
    """Keys of the plan-file form this kind reads besides model, cluster, nodes, note and kind."""
    marker_keys: frozenset[str]
    """Keys that, without ``kind:``, say a plan file is of this kind."""
    memory_per_gpu: bool
    """Whether :meth:`memory` estimates each GPU (its ``rank`` is a GPU id), not each pipeline rank."""
    framework: str | None
    """The framework (:mod:`distsim.core.framework`) that runs plans of this kind when the user names none: the
    runtime the kind exists in (burst plans: DeepPool's); None (or absent): the default framework."""

    def check_fields(self, plan: Plan) -> None:
        """The plan's own consistency, needing neither model nor cluster (PlanError names the first problem)."""
        ...

    def check(self, plan: Plan, num_layers: int, num_gpus: int) -> None:
        """The plan against the model's layers and the cluster's GPUs."""
        ...

    def gpus(self, plan: Plan) -> tuple[int, ...]:
        """The GPU ids the plan uses, sorted."""
        ...

    def notation(self, plan: Plan) -> str:
        """The short name drivers and tables show (``2M4P2D``, ``15:1 split 13:11``, ``burst 1x3,8x10``)."""
        ...

    def detail(self, plan: Plan) -> str:
        """One line: the batch and what runs where."""
        ...

    def summary(self, plan: Plan) -> str:
        """What a report says of the plan besides its notation (its stages or layers, GPUs and batch)."""
        ...

    def layout_line(self, plan: Plan) -> tuple[str, str] | None:
        """A report's line of where the layers run, as (label, text); None: the layers per pipeline stage."""
        ...

    def to_dict(self, plan: Plan) -> dict[str, object]:
        """The kind's keys of the plan-file form (model, cluster, nodes and note are written by the caller)."""
        ...

    def from_dict(self, data: dict[str, Any], where: str, common: dict[str, Any]) -> Plan:
        """The plan read from its file form (`common`: model, cluster, nodes and note, already checked)."""
        ...

    def build_flow(
        self, model: Model, cluster: Cluster, plan: Plan, costs: CostSource, options: FlowOptions
    ) -> EventFlow:
        """The event flow of one iteration."""
        ...

    def estimate_tasks(
        self, model: Model, cluster: Cluster, plan: Plan, costs: CostSource, options: FlowOptions
    ) -> int:
        """Tasks :meth:`build_flow` would emit, counted without building anything."""
        ...

    def memory(self, model: Model, cluster: Cluster, plan: Plan, flow: EventFlow) -> list[MemoryEstimate]:
        """Memory per GPU (or per pipeline rank of a symmetric uniform flow)."""
        ...


PLAN_KINDS: dict[str, PlanKind] = {}
"""Kind name -> its :class:`PlanKind`, in registration order (uniform, stages, burst)."""


def register_plan_kind(kind: PlanKind) -> PlanKind:
    PLAN_KINDS[kind.name] = kind
    return kind


def plan_kind(name: str) -> PlanKind:
    return PLAN_KINDS[name]
