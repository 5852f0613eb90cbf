"""DAPPLE's planner search: the dynamic programme over split positions, replica counts and placements.

A state (j, used) stands for "layers [0, j) planned as a prefix of stages on the GPUs `used`; layers [j, N) on
every free GPU"; out of a state every new stage size, placement and split is scored at once with numpy, and each
target state keeps its best plan (see :class:`_Search`). A beam bounds the states expanded per split position on
clusters with many machines (:func:`beam_width`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import numpy as np

from distsim.core.cluster import Cluster
from distsim.core.models.graph import Model
from distsim.search.dapple_model import DappleSpec, Stage, StageCosts, in_flight, place
from distsim.sim.costs import CostSource


def beam_width(spec: DappleSpec, cluster: Cluster) -> int:
    """States expanded per split position (0: all); see :attr:`DappleSpec.beam`."""
    if spec.beam is not None:
        return spec.beam
    gpn = cluster.gpus_per_node
    used_sets = (gpn + 1) ** (spec.gpus // gpn)
    return 0 if used_sets <= 1024 else 128


@dataclass
class _Rows:
    """Every transition's new stage out of one used set (they do not depend on the split position)."""

    devs: list[tuple[int, ...]]
    rests: list[tuple[int, ...]]
    targets: np.ndarray
    """Id of the used set after each row."""
    m: np.ndarray
    n_new: np.ndarray
    """Index into the search's sample counts of the new stage's samples per replica."""
    n_rest: np.ndarray
    slow_new: np.ndarray
    slow_rest: np.ndarray
    x2f: np.ndarray
    """(rows, N - 1): transfer times new -> remainder at every boundary."""
    x2b: np.ndarray
    ar_rest: np.ndarray
    """(rows, N + 1): the remainder's AR when it starts at each layer."""
    rest_too_wide: np.ndarray
    kinds: list[tuple[int, bool]]
    """(replicas, spans nodes) of each row's new stage: what its AR depends on."""
    prefix_times: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] = ()  # type: ignore[assignment]
    """(rows, N + 1) prefix sums of forward and backward times at the new stage's and the remainder's samples."""
    samples_new: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """(rows, 1): samples per replica of the new stage; ``samples_rest`` the remainder's."""
    samples_rest: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def kinds_key(self) -> tuple[tuple[int, bool], ...]:
        return tuple(self.kinds)


class _Search:
    """The dynamic programme for one micro-batch count, vectorised over every transition out of a state.

    A state (j, used) stands for "layers [0, j) planned as a prefix of stages on the GPUs `used`; layers [j, N) on
    every free GPU". Out of a state the transitions are every new stage size m (at most the micro-batch's samples),
    every distinct placement the policies give it, and every split j' > j: all are scored at once with numpy (one
    row per placement, one column per j'), and each target state (j', used + new) keeps its best. Scores are the
    key (remainder invalid, L): a plan whose remainder stage does not fit (or has more replicas than samples) is
    kept for expansion but is not an answer; a plan whose planned stages do not fit is dropped, since later splits
    only add in-flight micro-batches to them.
    """

    def __init__(
        self, model: Model, cluster: Cluster, spec: DappleSpec, costs: CostSource, M: int, shared: StageCosts | None
    ):
        self.model, self.cluster, self.spec, self.M = model, cluster, spec, M
        self.N, self.G = model.num_layers, spec.gpus
        self.b = spec.global_batch // M
        self.sc = StageCosts(model, cluster, costs, self.b, shared)
        self.cap = cluster.gpu.memory_bytes if spec.memory_filter else math.inf
        self.gpn = cluster.gpus_per_node
        N, sc = self.N, self.sc
        self.ns = sorted({sc.samples(r) for r in range(1, self.G + 1)})
        self.n_index = {n: i for i, n in enumerate(self.ns)}
        self.pf = np.array([sc.prefix(n)[0] for n in self.ns])  # (samples, N + 1)
        self.pb = np.array([sc.prefix(n)[1] for n in self.ns])
        params = np.array([[sc.params(a, e) if e > a else 0.0 for e in range(N + 1)] for a in range(N + 1)])
        self.state = params * sc.state_bytes
        self.act = np.array(sc.act_prefix)
        self.evaluated = 0
        self.pruned = 0
        # boundaries carrying the same bytes per sample cost the same: compute each distinct one once
        sizes = [round(x) for x in model.boundary_bytes[: N - 1]]
        firsts = {size: i for i, size in reversed(list(enumerate(sizes)))}
        self.boundary_first = list(firsts.values())
        self.boundary_kind = np.array([list(firsts).index(size) for size in sizes], dtype=np.int64)
        self._ar: dict[tuple[int, int, bool], np.ndarray] = {}
        self._ar_rows: dict[tuple[int, tuple[tuple[int, bool], ...]], np.ndarray] = {}
        self._x: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[np.ndarray, np.ndarray]] = {}
        self._rows: dict[int, _Rows | None] = {}
        self.tied = sc.tied
        self._tied_rows: dict[tuple[int, tuple[int, ...], int], Any] = {}  # rows live as long as the search
        self._pre: dict[
            tuple[int, int], tuple[list[Stage], list[tuple[float, float, float]], list[tuple[float, float]]]
        ]
        self._pre = {(0, 0): ([], [], [])}
        self._x1: dict[tuple[tuple[int, ...], int], tuple[np.ndarray, np.ndarray]] = {}
        # states: per used set (an id), arrays over j of (remainder invalid, L, link id)
        self.ids: dict[frozenset[int], int] = {}
        self.sets: list[frozenset[int]] = []
        self.bad = np.ones((0, N + 1), dtype=bool)
        self.lat = np.full((0, N + 1), np.inf)
        self.link = np.full((0, N + 1), -1, dtype=np.int64)
        self.links: list[tuple[int, int, tuple[int, ...]]] = []  # (parent j, parent used id, new stage's devices)
        self.best: tuple[float, int, int] | None = None  # (L, link id, j')

    # -------------------------------------------------------------------------------- cached vectors
    def slow(self, devs: tuple[int, ...]) -> float:
        return 1.0 if self.sc.uniform_speed else max(self.sc.speed[g] for g in devs)

    def ar_vector(self, start: int, devs: tuple[int, ...], kind: tuple[int, bool] | None = None) -> np.ndarray:
        """AR (plus optimizer) of a stage on these devices starting at `start` (-1: every start, ending at N) for
        every end (every start) 0..N."""
        m, spans = kind or (len(devs), len({g // self.gpn for g in devs}) > 1)
        key = (start, m, spans)
        out = self._ar.get(key)
        if out is None:
            out = np.zeros(self.N + 1)
            ar = self.sc.allreduce_kind
            if start >= 0:
                for e in range(start + 1, self.N + 1):
                    out[e] = ar(start, e, m, spans)
            else:
                for a in range(self.N):
                    out[a] = ar(a, self.N, m, spans)
            self._ar[key] = out
        return out

    def ar_matrix(self, start: int, rows: _Rows) -> np.ndarray:
        """:meth:`ar_vector` of every row's new stage starting at `start`, one row each (rows of the same kinds
        share it)."""
        key = (start, rows.kinds_key)
        out = self._ar_rows.get(key)
        if out is None:
            out = self._ar_rows[key] = np.array([self.ar_vector(start, d, k) for d, k in zip(rows.devs, rows.kinds,
                                                                                             strict=True)])  # fmt: skip
        return out

    def x_row(self, src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward transfer times between two replica sets at every boundary (after layer i)."""
        gpn = self.gpn
        key = (tuple(g // gpn for g in src), tuple(g // gpn for g in dst))
        out = self._x.get(key)
        if out is None:
            pairs = np.array([self.sc.transfer(i, src, dst) for i in self.boundary_first])
            out = self._x[key] = (pairs[self.boundary_kind, 0], pairs[self.boundary_kind, 1])
        return out

    def set_id(self, used: frozenset[int]) -> int:
        uid = self.ids.get(used)
        if uid is None:
            uid = self.ids[used] = len(self.sets)
            self.sets.append(used)
            if uid >= len(self.lat):  # grow the state tables
                extra = max(16, len(self.lat))
                self.bad = np.vstack([self.bad, np.ones((extra, self.N + 1), dtype=bool)])
                self.lat = np.vstack([self.lat, np.full((extra, self.N + 1), np.inf)])
                self.link = np.vstack([self.link, np.full((extra, self.N + 1), -1, dtype=np.int64)])
        return uid

    def rows(self, uid: int) -> _Rows | None:
        if uid in self._rows:
            return self._rows[uid]
        used, G, b = self.sets[uid], self.G, self.b
        free = [g for g in range(G) if g not in used]
        devs_list, rests = [], []
        for m in range(1, min(len(free) - 1, b) + 1):
            seen: set[tuple[int, ...]] = set()
            for policy in self.spec.policies:
                devs = place(policy, used, m, self.gpn, G)
                if devs is not None and devs not in seen:
                    seen.add(devs)
                    devs_list.append(devs)
                    rests.append(tuple(g for g in free if g not in devs))
        out = None
        if devs_list:
            xs = [self.x_row(d, r) for d, r in zip(devs_list, rests, strict=True)]
            out = _Rows(
                devs=devs_list,
                rests=rests,
                targets=np.array([self.set_id(used | frozenset(d)) for d in devs_list]),
                m=np.array([len(d) for d in devs_list]),
                n_new=np.array([self.n_index[self.sc.samples(len(d))] for d in devs_list]),
                n_rest=np.array([self.n_index[self.sc.samples(min(len(r), b))] for r in rests]),
                slow_new=np.array([self.slow(d) for d in devs_list]),
                slow_rest=np.array([self.slow(r) for r in rests]),
                x2f=np.array([x[0] for x in xs]),
                x2b=np.array([x[1] for x in xs]),
                ar_rest=np.array([self.ar_vector(-1, r) for r in rests]),
                rest_too_wide=np.array([len(r) > b for r in rests]),
                kinds=[(len(d), len({g // self.gpn for g in d}) > 1) for d in devs_list],
            )
            ns = np.array(self.ns)
            out.prefix_times = (self.pf[out.n_new], self.pb[out.n_new], self.pf[out.n_rest], self.pb[out.n_rest])
            out.samples_new, out.samples_rest = ns[out.n_new][:, None], ns[out.n_rest][:, None]
        self._rows[uid] = out
        return out

    def x1(self, last: tuple[int, ...], uid: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, N - 1): transfer times from the prefix's last stage on `last` to each row's new stage."""
        key = (last, uid)
        out = self._x1.get(key)
        if out is None:
            rows = self._rows[uid]
            assert rows is not None
            xs = [self.x_row(last, d) for d in rows.devs]
            out = self._x1[key] = (np.array([x[0] for x in xs]), np.array([x[1] for x in xs]))
        return out

    def prefix_terms(
        self, j: int, uid: int
    ) -> tuple[list[Stage], list[tuple[float, float, float]], list[tuple[float, float]]]:
        """The planned stages of a state, their latency terms (with the transfers between them) and each stage's
        (training state, activations per in-flight micro-batch) bytes; built from the parent state's."""
        out = self._pre.get((j, uid))
        if out is None:
            sc = self.sc
            pj, puid, devs = self.links[int(self.link[uid, j])]
            stages, terms, mem = self.prefix_terms(pj, puid)
            terms = list(terms)
            if stages:
                xf, xb = sc.transfer(pj - 1, stages[-1][2], devs)
                terms.append((xf, xb, 0.0))
            f, bw = sc.compute(pj, j, devs)
            terms.append((f, bw, sc.allreduce(pj, j, devs)))
            act = (sc.act_prefix[j] - sc.act_prefix[pj]) * sc.samples(len(devs))
            out = (
                [*stages, (pj, j, devs)],
                terms,
                [*mem, (sc.params(pj, j) * sc.state_bytes, act)],
            )
            self._pre[(j, uid)] = out
        return out

    def add_tied(
        self, lo: int, hi: int, nbytes: int, j: int, J: np.ndarray, rows: _Rows, prefix: list[Stage],
        ARn: np.ndarray, ARr: np.ndarray, extra: dict[int, np.ndarray],
    ) -> None:  # fmt: skip
        """Add a tied pair's all-reduce to the AR terms of the two stages holding it, for every transition."""
        sc = self.sc
        C, W = ARn.shape
        if hi < j:  # both planned
            sa = next(i for i, (a, e, _) in enumerate(prefix) if a <= lo < e)
            sb = next(i for i, (a, e, _) in enumerate(prefix) if a <= hi < e)
            if sa != sb:
                t = sc.tied_allreduce(prefix[sa][2], prefix[sb][2], nbytes)
                for s in (sa, sb):
                    extra[2 * s] = extra.get(2 * s, 0.0) + np.full((C, W), t)
            return
        if lo < j:  # lo planned, hi in the new stage (j' > hi) or in the remainder
            sa = next(i for i, (a, e, _) in enumerate(prefix) if a <= lo < e)
            a_devs = prefix[sa][2]
            key = (nbytes, a_devs, id(rows))
            cached = self._tied_rows.get(key)
            if cached is None:
                cached = self._tied_rows[key] = (
                    np.array([sc.tied_allreduce(a_devs, d, nbytes) for d in rows.devs])[:, None],
                    np.array([sc.tied_allreduce(a_devs, r, nbytes) for r in rows.rests])[:, None],
                )
            to_new, to_rest = cached
            in_new = (hi < J)[None]
            ARn += np.where(in_new, to_new, 0.0)
            ARr += np.where(in_new, 0.0, to_rest)
            extra[2 * sa] = extra.get(2 * sa, 0.0) + np.where(in_new, to_new, to_rest)
            return
        # both unplanned: apart only when lo lands in the new stage and hi in the remainder
        apart = ((lo < J) & (hi >= J))[None]
        key = (nbytes, (), id(rows))
        t = self._tied_rows.get(key)
        if t is None:
            pairs = zip(rows.devs, rows.rests, strict=True)
            t = self._tied_rows[key] = np.array([sc.tied_allreduce(d, r, nbytes) for d, r in pairs])[:, None]
        ARn += np.where(apart, t, 0.0)
        ARr += np.where(apart, t, 0.0)

    # -------------------------------------------------------------------------------- the search
    def prefix_stages(self, j: int, uid: int) -> list[Stage]:
        stages: list[Stage] = []
        while j:
            pj, puid, devs = self.links[int(self.link[uid, j])]
            stages.append((pj, j, devs))
            j, uid = pj, puid
        return stages[::-1]

    def run(self) -> None:
        root = self.set_id(frozenset())
        self.bad[root, 0], self.lat[root, 0] = False, 0.0
        beam = beam_width(self.spec, self.cluster)
        for j in range(self.N - 1):
            n = len(self.sets)
            live = np.flatnonzero(self.lat[:n, j] < np.inf)
            order = sorted(live, key=lambda u: (bool(self.bad[u, j]), float(self.lat[u, j]), sorted(self.sets[u])))
            if beam and len(order) > beam:
                self.pruned += len(order) - beam
                order = order[:beam]
            for uid in order:
                self.expand(j, int(uid))

    def expand(self, j: int, uid: int) -> None:
        spec, M, N = self.spec, self.M, self.N
        rows = self.rows(uid)
        if rows is None:
            return
        prefix, pre, mem = self.prefix_terms(j, uid)
        Sp = len(prefix)
        S = Sp + 2
        for i, (state, act) in enumerate(mem):
            if state + in_flight(spec, M, i, S) * act > self.cap:
                return  # more stages only add in-flight micro-batches to this one
        J = np.arange(j + 1, N)  # split positions j'
        cols = slice(j + 1, N)  # the same as a slice: basic indexing, no copies
        C, W = len(rows.devs), N - j - 1
        self.evaluated += C * W
        pf_new, pb_new, pf_rest, pb_rest = rows.prefix_times
        Fn = pf_new[:, cols] - pf_new[:, j : j + 1]
        Bn = pb_new[:, cols] - pb_new[:, j : j + 1]
        Fr = pf_rest[:, N : N + 1] - pf_rest[:, cols]
        Br = pb_rest[:, N : N + 1] - pb_rest[:, cols]
        if not self.sc.uniform_speed:  # the slowest replica sets the pace
            sm, sr = rows.slow_new[:, None], rows.slow_rest[:, None]
            Fn, Bn, Fr, Br = Fn * sm, Bn * sm, Fr * sr, Br * sr
        ARn = self.ar_matrix(j, rows)[:, cols]
        ARr = rows.ar_rest[:, cols]
        X2f, X2b = rows.x2f[:, j : N - 1], rows.x2b[:, j : N - 1]
        k_new, k_rest = in_flight(spec, M, Sp, S), in_flight(spec, M, Sp + 1, S)
        act_new = (self.act[cols] - self.act[j])[None] * rows.samples_new
        act_rest = (self.act[N] - self.act[cols])[None] * rows.samples_rest
        dead = self.state[j, cols][None] + k_new * act_new > self.cap
        rest_bad = (self.state[cols, N][None] + k_rest * act_rest > self.cap) | rows.rest_too_wide[:, None]
        tail: list[tuple[Any, Any, Any]] = []
        if Sp:
            x1f, x1b = self.x1(prefix[-1][2], uid)
            tail.append((x1f[:, [j - 1]], x1b[:, [j - 1]], 0.0))
        extra: dict[int, np.ndarray] = {}
        if self.tied:
            ARn, ARr = ARn.copy(), ARr.copy()
            for lo, hi, nbytes in self.tied:
                self.add_tied(lo, hi, nbytes, j, J, rows, prefix, ARn, ARr, extra)
        tail += [(Fn, Bn, ARn), (X2f, X2b, 0.0), (Fr, Br, ARr)]
        L = _latency_terms(pre, tail, M, (C, W), extra)
        L[dead] = np.inf
        ok = np.where(rest_bad, np.inf, L)
        flat = int(np.argmin(ok))
        c, k = divmod(flat, W)
        first_link = len(self.links)
        if ok[c, k] < np.inf and (self.best is None or ok[c, k] < self.best[0]):
            self.best = (float(ok[c, k]), first_link + c, int(J[k]))
        self.links += [(j, uid, d) for d in rows.devs]
        # targets (j', used + new) keep their best: remainder valid first, then the lower L
        T = rows.targets
        tb, tl = self.bad[T, cols], self.lat[T, cols]
        better = (np.inf > L) & ((rest_bad < tb) | ((rest_bad == tb) & (tl > L)))
        if better.any():
            self.bad[T, cols] = np.where(better, rest_bad, tb)
            self.lat[T, cols] = np.where(better, L, tl)
            ids = np.arange(first_link, first_link + C)[:, None]
            self.link[T, cols] = np.where(better, ids, self.link[T, cols])

    def best_stages(self) -> list[Stage] | None:
        if self.best is None:
            return None
        _, link_id, j2 = self.best
        pj, puid, devs = self.links[link_id]
        used = self.sets[puid] | frozenset(devs)
        rest = tuple(g for g in range(self.G) if g not in used)
        return [*self.prefix_stages(pj, puid), (pj, j2, devs), (j2, self.N, rest)]


def _latency_terms(
    pre: Sequence[tuple[float, float, float]],
    tail: Sequence[tuple[Any, Any, Any]],
    M: int,
    shape: tuple[int, int],
    extra: dict[int, np.ndarray] | None = None,
) -> np.ndarray:
    """:func:`pipeline_latency` for many pipelines at once that share their first stages.

    `pre`: (F, B, AR) of the shared first stages (scalars); `tail`: the stages after them, each term an array
    broadcasting to `shape` (or a scalar); `extra`: arrays added to some shared stages' AR (AR does not move
    the pivot). Uses two facts to stay vectorised:

    * the pivot scan runs from the last stage backwards and, once it moves the pivot into the shared stages, its
      course from there on no longer depends on the tail, so the shared stages' outcome is precomputed;
    * both branches of the corrected ending offset are cumB[Q] - cumB[s-1] (cumB[-1] = 0), so
      T_e = cumB[Q] + max_s(AR_s - cumB[s-1]).
    """
    P, m1 = len(pre), M - 1
    # pivot scan over the tail, from the last stage backwards
    f, b, _ = tail[-1]
    Q = np.full(shape, P + len(tail) - 1)
    TQ = m1 * (f + b)
    if np.shape(TQ) != shape:
        TQ = np.broadcast_to(TQ, shape)
    between: Any = 0.0
    for i in range(len(tail) - 2, -1, -1):
        f, b, _ = tail[i]
        T = m1 * (f + b)
        take = TQ + between < T
        Q = np.where(take, P + i, Q)
        TQ = np.where(take, T, TQ)
        between = np.where(take, 0.0, between + f + b)
    if P:
        Tp = [m1 * (f + b) for f, b, _ in pre]
        # where the scan ends if it moves the pivot to shared stage s
        final = list(range(P))
        for s in range(P):
            q, gap = s, 0.0
            for a in range(s - 1, -1, -1):
                if Tp[a] > Tp[q] + gap:
                    q, gap = a, 0.0
                else:
                    gap += pre[a][0] + pre[a][1]
            final[s] = q
        # the first (highest) shared stage s the scan takes: T_s > TQ + between + (F+B of shared stages above s)
        above = np.zeros(P)
        for s in range(P - 2, -1, -1):
            above[s] = above[s + 1] + pre[s + 1][0] + pre[s + 1][1]
        D = np.array(Tp) - above
        hits = D[:, None, None] > (TQ + between)[None]
        found = hits.any(axis=0)
        if found.any():
            first = P - 1 - np.argmax(hits[::-1], axis=0)
            Q = np.where(found, np.array(final)[first], Q)
            TQ = np.where(found, np.array(Tp)[np.array(final)[first]], TQ)
    # warm-up sum F_0..F_Q, cumB[Q] and the ending maximum
    cumF_pre = np.array([0.0, *accumulate(t[0] for t in pre)])  # cumF_pre[k]: F of the first k shared stages
    cumB_pre = np.array([0.0, *accumulate(t[1] for t in pre)])
    extra = extra or {}
    best: Any = max((t[2] - cumB_pre[k] for k, t in enumerate(pre) if k not in extra), default=-np.inf)
    for k, add in extra.items():
        best = np.maximum(best, pre[k][2] + add - cumB_pre[k])
    in_pre = Q < P
    qi = np.minimum(Q, P)
    warmup: Any = cumF_pre[qi + np.where(in_pre, 1, 0)] if P else 0.0
    cum_q: Any = cumB_pre[qi + np.where(in_pre, 1, 0)] if P else 0.0
    cum: Any = cumB_pre[-1]
    for i, (f, b, ar) in enumerate(tail):
        best = np.maximum(best, ar - cum)
        cum = cum + b
        before = P + i <= Q
        warmup = warmup + np.where(before, f, 0.0)
        cum_q = cum_q + np.where(before, b, 0.0)
    return warmup + TQ + cum_q + best
