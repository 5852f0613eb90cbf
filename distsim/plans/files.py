"""A plan's file form (YAML or JSON, read and written by :mod:`distsim.io.files`): the keys every kind shares
(model, cluster, nodes, note, kind), the kind named or recognised by its keys, and the reading helpers the kinds'
own forms use. Errors name the file and the key.
"""

from __future__ import annotations

from typing import Any

from distsim.plans.kinds import PLAN_KINDS, PlanKind
from distsim.plans.plan import Plan, PlanError

COMMON_KEYS = frozenset({"model", "cluster", "nodes", "note", "kind"})


def plan_to_dict(plan: Plan) -> dict[str, object]:
    """The plan as the YAML/JSON mapping that :func:`plan_from_dict` reads back to an equal plan."""
    out: dict[str, object] = {"kind": plan.kind} if plan.kind == "burst" else {}
    out |= {"model": plan.model, "cluster": plan.cluster}
    if plan.nodes is not None:
        out["nodes"] = plan.nodes
    out |= plan_kind_of(plan).to_dict(plan)
    if plan.note:
        out["note"] = dict(plan.note)
    return out


def plan_kind_of(plan: Plan) -> PlanKind:
    return PLAN_KINDS[plan.kind]


def _allowed() -> set[str]:
    return set(COMMON_KEYS).union(*(k.file_keys for k in PLAN_KINDS.values()))


def _kind(data: dict[str, Any], where: str) -> PlanKind:
    """The kind a plan file names, else the one whose keys it has (exactly one)."""
    named = data.get("kind")
    if named is not None and named not in PLAN_KINDS:
        raise PlanError(f"{where}: kind must be one of {', '.join(PLAN_KINDS)}, got {named!r}")
    found = [k for k in PLAN_KINDS.values() if k.marker_keys & set(data)]
    if named is None:
        if len(found) != 1:
            hints = [f"{' or '.join(sorted(k.marker_keys))} ({k.name})" for k in PLAN_KINDS.values()]
            raise PlanError(f"{where}: give either {', '.join(hints[:-1])} or {hints[-1]}")
        return found[0]
    kind = PLAN_KINDS[named]
    for other in found:
        if other is not kind:
            key = sorted(other.marker_keys & set(data))[0]
            raise PlanError(f"{where}: {key} belongs to a {other.name} plan (kind: {other.name}), not a {named} plan")
    return kind


def plan_from_dict(data: object, where: str) -> Plan:
    """Read a plan mapping (see :mod:`distsim.plans.plan`); errors name the file and the key."""
    if not isinstance(data, dict):
        raise PlanError(f"{where}: a plan file is a mapping with model, cluster and strategy, stages or counts")
    unknown = sorted(set(data) - _allowed())
    if unknown:
        raise PlanError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(_allowed()))}")
    for key in ("model", "cluster"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise PlanError(f"{where}: needs {key}: a name or file path")
    note = data.get("note") or {}
    if not isinstance(note, dict):
        raise PlanError(f"{where}: note must be a mapping")
    kind = _kind(data, where)
    other = sorted(set(data) - COMMON_KEYS - kind.file_keys)
    if other:
        raise PlanError(f"{where}: {other[0]} does not apply to a {kind.name} plan "
                        f"(keys: {', '.join(sorted(COMMON_KEYS | kind.file_keys))})")  # fmt: skip
    common = {"model": data["model"], "cluster": data["cluster"], "nodes": positive_int(data, "nodes", where, None),
              "note": note}  # fmt: skip
    return kind.from_dict(data, where, common)


def positive_int(data: dict[str, object], key: str, where: str, default: int | None) -> int | None:
    value = data.get(key, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PlanError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def positive_number(data: dict[str, object], key: str, where: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise PlanError(f"{where}: {key} must be a positive number, got {value!r}")
    return float(value)


def layer_ranges(value: object, where: str) -> tuple[tuple[int, int], ...]:
    """gradient_groups: a list of [start, end) layer ranges."""
    ok = isinstance(value, list) and all(
        isinstance(g, list) and len(g) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in g)
        for g in value
    )
    if not ok:
        raise PlanError(f"{where}: gradient_groups must be a list of [start, end] layer ranges, got {value!r}")
    return tuple((g[0], g[1]) for g in value)  # type: ignore[index, union-attr]
