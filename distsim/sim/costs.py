"""Event keys and event-cost sources.

An event is keyed by what determines its duration (DistSim Sec. 3.1, 4.1): for compute, the block's operator and
shape, the micro-batch size, the tensor-parallel degree, forward or backward and the dtype; for communication, the
collective, its bytes, group size, scope (intra/inter node) and how many flows share the node's NICs. Identical
layers, micro-batches, replicas and tensor-parallel ranks share one key, so they are costed (and profiled) once.

Two sources implement :class:`CostSource`:

* :class:`AnalyticCosts`: per-kernel estimates for a block that lists its ops (:mod:`distsim.sim.kernels`: GEMMs with
  tile and wave quantisation, memory-bound kernels at achieved bandwidth, flash attention, a latency per kernel, and
  ``launch_s`` = kernels x the GPU's launch time), else a roofline of the block (FLOPs over achieved FLOP/s, or bytes
  over memory bandwidth); communication by ring or tree algorithms with a latency per step, the faster one as NCCL
  picks (or the inter-node all-reduce algorithm named: :data:`distsim.core.collectives.ANALYTIC_ALGORITHMS`),
  inter-node collectives striped over all of a node's NICs (:mod:`distsim.core.collectives`). It lets every preset
  work before anything is profiled.
* :class:`ProfileCosts`: measured durations from a profile database; collectives without an exact measurement use
  linear interpolation between the two nearest measured sizes, else the alpha-beta fit of their (collective, scope,
  group size), and groups larger than any profiled one scale the
  largest profiled group by ring volume, T(N) = T(n) [2(N-1)/N] / [2(n-1)/n] (DistSim Sec. 4.2). Events the profile
  lacks fall back to the analytic estimate (flagged) or, when strict, raise. A measured compute event's host launch
  time (``Cost.launch_s``) is the profile's where it has one (CUDA profiles), else the fallback's estimate.

Every cost says where it came from: ``given`` (in the model file), ``measured``, ``interpolated``, ``fitted``,
``scaled``, ``analytic`` or ``share`` (:func:`share_cost`: an event derived from a measured or given block, such as
its sequence-parallel form or its attention core, as the analytic model's share of the block's cost).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

from distsim.core.cluster import GPU, Cluster
from distsim.core.collectives import analytic_algorithm, collective_s
from distsim.core.collectives import ring_steps as ring_steps  # re-exported: the ring figures other modules use
from distsim.core.collectives import ring_volume as ring_volume
from distsim.core.errors import ProfileError
from distsim.core.framework import DEFAULT_FRAMEWORK, Framework, get_framework
from distsim.core.models.graph import Block
from distsim.sim.kernels import block_s
from distsim.sim.profile_db import ProfileDB

ESTIMATED_SOURCES = ("analytic",)


@dataclass(frozen=True)
class ComputeEvent:
    block: Block
    phase: str
    """``F`` or ``B``."""
    micro_batch_size: int
    tp: int
    dtype: str

    @property
    def effective_tp(self) -> int:
        return self.tp if self.block.tp == "shard" else 1

    @property
    def key(self) -> str:
        b = self.block
        key = f"{b.op}[{b.shape_str()}]/{self.phase}/mbs={self.micro_batch_size}/tp={self.effective_tp}/{self.dtype}"
        if b.has_given_time:
            key += f"/given={b.fwd_s},{b.bwd_s}"
        return key

    @property
    def flops(self) -> float:
        f = self.block.fwd_flops * self.micro_batch_size / self.effective_tp
        return f if self.phase == "F" else 2 * f


@dataclass(frozen=True)
class CommEvent:
    collective: str
    """``all_reduce``, ``all_gather``, ``reduce_scatter`` or ``p2p``."""
    nbytes: int
    group_size: int
    scope: str
    """``intra`` or ``inter``."""
    sharers: int = 1
    """Concurrent flows leaving the busiest node through its NICs (inter scope only)."""

    @property
    def key(self) -> str:
        key = f"{self.collective}/{self.scope}/n={self.group_size}/bytes={self.nbytes}"
        return key + (f"/share={self.sharers}" if self.sharers > 1 else "")

    @classmethod
    def of_key(cls, key: str) -> CommEvent | None:
        """The communication event an event key starts with (:attr:`key`; a derived key, such as an overlapped
        collective's ``.../overlapping=<compute key>``, adds segments after it), or None for a key that does not
        start with one (a compute event's). The one reader of the format :attr:`key` writes (timeline columns, trace
        exports)."""
        parts = key.split("/")
        if len(parts) < 4 or parts[1] not in ("intra", "inter"):
            return None
        fields_ = dict(p.split("=", 1) for p in parts[2:5] if "=" in p)
        try:
            return cls(parts[0], int(fields_["bytes"]), int(fields_["n"]), parts[1], int(fields_.get("share", 1)))
        except (KeyError, ValueError):
            return None


@dataclass(frozen=True)
class Cost:
    seconds: float
    source: str
    samples: tuple[float, ...] | None = None
    """Measured durations of this event (repetitions), for stochastic simulation; None: deterministic."""
    launch_s: float = 0.0
    """Host seconds to enqueue the event's kernels on an accelerator (the host stream's share of the event); 0 where
    the host runs the work itself (CPU devices) or launches are not modelled."""


DEEPPOOL_COLLOCATION_SLOWDOWN = 0.18
"""The analytic default of :meth:`CostSource.collocation_slowdown`: a foreground's compute takes 1.18 x as long on
a GPU that also runs a low-priority background job. From DeepPool (Park et al., "Efficient Strong Scaling Through
Burst Parallel Training", MLSys 2022), section 7.1 "Overall performance" (Figure 9, VGG-16 and WideResNet-101-2 on
8 A100s): "'BP + Col' almost doubles the total cluster throughput with less than 18% degradation of foreground
throughput". That is an upper bound the paper reports for its tuned runtime (CUDA graphs, stream priorities,
launch pacing, collocation paused for sensitive operators, small background batches), not a fit. The paper states it
for the whole iteration; taken here as the stretch of the foreground's compute on a collocated GPU (communication is
not stretched, see :mod:`distsim.search.collocate`), it slows an iteration by at most 18 %, a throughput loss of at most
15 %, inside the paper's bound."""


@dataclass(frozen=True)
class CollocationSlowdown:
    """How much a low-priority background job on the same device stretches the foreground's compute: by
    ``1 + fraction``, and where that figure came from (``analytic``: :data:`DEEPPOOL_COLLOCATION_SLOWDOWN`;
    ``measured``: the profile's; ``given``: set by hand)."""

    fraction: float
    source: str
    detail: str = ""


class CostSource(Protocol):
    name: str

    def compute(self, event: ComputeEvent) -> Cost: ...

    def comm(self, event: CommEvent) -> Cost: ...

    def optimizer(self, shard_params: float, state_bytes_per_param: int) -> Cost: ...

    def interference(self, scope: str) -> tuple[float, float]:
        """(compute slowdown, comm slowdown) while communication of `scope` overlaps compute on one GPU."""
        ...

    def collocation_slowdown(self) -> CollocationSlowdown:
        """How much a background job collocated on a GPU (at lower priority) slows the foreground's compute there."""
        ...


def share_cost(costs: CostSource, gpu: GPU, base: ComputeEvent, derived: ComputeEvent) -> Cost:
    """The cost of `derived`, an event derived from a block's event `base` (the block under sequence parallelism,
    or its attention core for selective recomputation), whose blocks both list their kernels (ops).

    Where the cost source estimates the block itself (``analytic``), or measured the derived event (a profile that
    has its key), the source's own cost. Otherwise (the block measured or given, the derived event not) the block's
    cost times the analytic model's ratio of the two on `gpu` (:func:`distsim.sim.kernels.block_s`), source ``share``:
    a profile of Megatron's layer measures no sequence-parallel layer norm and no attention core apart, and the
    share keeps what the profile says about the rest (a strict profile does not refuse it: the block was measured).
    The block's measured repetitions scale with it (stochastic runs); the host launch time with the kernel count.
    """
    cost = costs.compute(base)
    db = getattr(costs, "db", None)
    if cost.source == "analytic" or (db is not None and derived.key in db.compute):
        return costs.compute(derived)
    mbs, tp = base.micro_batch_size, base.effective_tp
    base_s, base_kernels = block_s(gpu, base.block.ops, base.phase, mbs, tp)
    part_s, part_kernels = block_s(gpu, derived.block.ops, derived.phase, derived.micro_batch_size,
                                   derived.effective_tp)  # fmt: skip
    ratio = part_s / base_s if base_s > 0 else 1.0
    launch = cost.launch_s * part_kernels / base_kernels if base_kernels else cost.launch_s
    samples = tuple(x * ratio for x in cost.samples) if cost.samples else None
    return Cost(cost.seconds * ratio, "share", samples, launch)


def optimizer_key(shard_params: float, state_bytes_per_param: int) -> str:
    return f"optimizer/params={round(shard_params)}/state_bytes={state_bytes_per_param}"


def _given(event: ComputeEvent) -> Cost | None:
    b = event.block
    if not b.has_given_time:
        return None
    value = b.fwd_s if event.phase == "F" else b.bwd_s
    if value is None:  # only the other phase given: backward defaults to 2x forward and vice versa
        value = 2 * b.fwd_s if event.phase == "B" else b.bwd_s / 2  # type: ignore[operator]
    return Cost(value / event.effective_tp, "given")


@dataclass
class AnalyticCosts:
    """Estimates from the cluster's figures (DistSim Sec. 2.3 shows why these can be off by 40%): per kernel for a
    block with ops, a roofline for one without; ring or tree collectives (ring only with ``allreduce="ring"``)."""

    cluster: Cluster
    name: str = "analytic"
    allreduce: str = "nccl"
    """The inter-node all-reduce algorithm, a name of :data:`distsim.core.collectives.ANALYTIC_ALGORITHMS`: ``nccl``
    takes NCCL's double binary tree where that is faster (NCCL's choice); ``ring`` the ring only, the algorithm
    MG-WFBP's analysis assumes (its latency term grows as 2(N-1) alpha)."""
    framework: Framework = field(default_factory=lambda: get_framework(DEFAULT_FRAMEWORK))
    """What the framework adds to each kernel: its host time (:meth:`~distsim.core.framework.Framework.host_s`)."""
    _memo: dict[ComputeEvent, Cost] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        analytic_algorithm(self.allreduce)  # an unknown name fails here, in one line

    def compute(self, event: ComputeEvent) -> Cost:
        given = _given(event)
        if given is not None:
            return given
        cost = self._memo.get(event)
        if cost is None:
            cost = self._memo[event] = self._estimate(event)
        return cost

    def _estimate(self, event: ComputeEvent) -> Cost:
        gpu = self.cluster.gpu
        b = event.block
        host = self.framework.host_s
        if b.ops:
            seconds, kernels = block_s(gpu, b.ops, event.phase, event.micro_batch_size, event.effective_tp)
            return Cost(seconds, "analytic", launch_s=host(kernels, event.phase, gpu.kernel_launch_s))
        io = b.io_bytes * event.micro_batch_size / event.effective_tp
        weight_bytes = b.params / event.effective_tp * 2
        moved = io + weight_bytes if event.phase == "F" else 2 * (io + weight_bytes)
        t_flops = event.flops / (gpu.peak_flops_per_s * gpu.compute_efficiency)
        t_mem = moved / gpu.memory_bandwidth_bytes_per_s
        kernels = 1 if event.phase == "F" else 2  # a block without ops: one kernel, two in backward (as a GEMM)
        launch_s = host(kernels, event.phase, gpu.kernel_launch_s)
        return Cost(max(t_flops, t_mem) + gpu.kernel_overhead_s, "analytic", launch_s=launch_s)

    def comm(self, event: CommEvent) -> Cost:
        """Point-to-point: latency + bytes over one flow's bandwidth (one NIC across nodes). Collectives: ring, or
        across nodes an all-reduce by :attr:`allreduce`, striped over all the node's NICs across nodes; one kernel."""
        c, n = event.collective, event.group_size
        launch_s = self.cluster.gpu.kernel_launch_s
        if event.scope == "intra":
            link = self.cluster.intra
            bandwidth = link.bandwidth_bytes_per_s
        else:
            link = self.cluster.inter
            bandwidth = (
                self.cluster.inter_flow_bandwidth(event.sharers)
                if c == "p2p"
                else self.cluster.inter_collective_bandwidth(event.sharers)
            )
        if c == "p2p":
            return Cost(link.latency_s + event.nbytes / bandwidth, "analytic", launch_s=launch_s)
        algorithm = self.allreduce if event.scope == "inter" else "ring"
        seconds, _ = collective_s(c, n, event.nbytes, link.latency_s, bandwidth, algorithm)
        return Cost(seconds, "analytic", launch_s=launch_s)

    def interference(self, scope: str) -> tuple[float, float]:
        """(compute slowdown, 0) from first principles: the SMs the framework's communication kernels hold
        (:meth:`~distsim.core.framework.Framework.interference`; none under ``ideal``); the collective itself, its
        SMs its own and its pace the link's, is not slowed."""
        return (self.framework.interference(self.cluster.gpu.sm_count), 0.0)

    def collocation_slowdown(self) -> CollocationSlowdown:
        """DeepPool's reported bound (see :data:`DEEPPOOL_COLLOCATION_SLOWDOWN`)."""
        quote = "DeepPool section 7.1, 'less than 18% degradation of foreground throughput'"
        return CollocationSlowdown(DEEPPOOL_COLLOCATION_SLOWDOWN, "analytic", quote)

    def optimizer(self, shard_params: float, state_bytes_per_param: int) -> Cost:
        """An Adam step reads and writes the whole training state once: memory bound."""
        gpu = self.cluster.gpu
        return Cost(2 * shard_params * state_bytes_per_param / gpu.memory_bandwidth_bytes_per_s, "analytic")


def framework_of(costs: CostSource) -> Framework:
    """The framework a cost source charges (the default preset for one that names none)."""
    framework = getattr(costs, "framework", None)
    return framework if isinstance(framework, Framework) else get_framework(DEFAULT_FRAMEWORK)


def _paced_by_profile_host(fallback: AnalyticCosts, db: ProfileDB) -> AnalyticCosts:
    """`fallback` with its framework's host time per kernel replaced by the profile's, per phase, where the profile
    recorded one (``db.host.per_kernel_s``: the measured blocks' launch time per kernel, the GPU's launch included,
    so the framework's figure is that less ``kernel_launch_s``): the host that was measured paces the events it did
    not measure. Otherwise `fallback` itself."""
    per_kernel = db.host.per_kernel_s if db.host is not None else {}
    if not per_kernel or not isinstance(fallback, AnalyticCosts):
        return fallback
    launch = fallback.cluster.gpu.kernel_launch_s
    framework = fallback.framework
    host_f = max(0.0, per_kernel["F"] - launch) if "F" in per_kernel else framework.host_op_s
    host_b = max(0.0, per_kernel["B"] - launch) if "B" in per_kernel else framework.host_backward_op_s
    return replace(fallback, framework=replace(framework, host_op_s=host_f, host_backward_op_s=host_b))


@dataclass
class ProfileCosts:
    """Measured costs from a ProfileDB, falling back to `fallback` (flagged) unless strict. Where the profile recorded
    its host's time per kernel (``db.host.per_kernel_s``, CUDA profiles), the fallback's estimated events and their
    launch are paced by it instead of the framework preset's figure (:func:`_paced_by_profile_host`, at
    construction)."""

    db: ProfileDB
    fallback: AnalyticCosts
    strict: bool = False
    name: str = "profile"

    def __post_init__(self) -> None:
        self.fallback = _paced_by_profile_host(self.fallback, self.db)
        # A block's backward launch was timed as a call of its own: its constant (the autograd engine's start and
        # end, HostSpeed.backward_call_s) is paid once per micro-batch's backward call in a training loop, not per
        # block, so it is taken off every measured backward launch.
        host = self.db.host
        self._backward_call_s = (host.backward_call_s or 0.0) if host is not None else 0.0

    def _missing(self, what: str) -> None:
        if self.strict:
            raise ProfileError(f"profile has no measurement for {what} (--strict)")

    def compute(self, event: ComputeEvent) -> Cost:
        given = _given(event)
        if given is not None:
            return given
        m = self.db.compute.get(event.key)
        if m is not None:
            # the host's measured enqueue time; profiles without one (CPU, older profiles) take the fallback's
            launch = m.launch_s if m.launch_s is not None else self.fallback.compute(event).launch_s
            if m.launch_s is not None and event.phase == "B":
                launch = max(0.0, launch - self._backward_call_s)
            return Cost(m.seconds, "measured", m.samples_s, launch)
        self._missing(f"compute event {event.key}")
        return self.fallback.compute(event)

    def _alone(self, event: CommEvent) -> Cost | None:
        """Cost of the collective as one flow (no NIC sharing), from the profile, or None."""
        c, scope, n = event.collective, event.scope, event.group_size
        exact = self.db.comm_exact(c, scope, n, event.nbytes)
        if exact is not None:
            return Cost(exact.seconds, "measured", exact.samples_s)
        between = self.db.interpolate(c, scope, n, event.nbytes)
        if between is not None:
            near = self.db.nearest(c, scope, n, event.nbytes)
            samples = None
            if near is not None and near.samples_s and near.seconds > 0:  # the nearest size's spread, rescaled
                samples = tuple(x * between / near.seconds for x in near.samples_s)
            return Cost(between, "interpolated", samples)
        fit = self.db.fit(c, scope, n)
        if fit is not None:
            return Cost(fit.time_s(event.nbytes), "fitted")
        candidates = [f for f in self.db.fits if f.collective == c and f.scope == scope]
        if not candidates or c == "p2p":
            return None
        base = min(candidates, key=lambda f: (abs(f.group_size - n), -f.group_size))
        scale = ring_volume(c, n) / ring_volume(c, base.group_size)
        at_base = self.db.interpolate(c, scope, base.group_size, event.nbytes)
        return Cost((base.time_s(event.nbytes) if at_base is None else at_base) * scale, "scaled")

    def comm(self, event: CommEvent) -> Cost:
        alone = self._alone(event)
        if alone is None:
            self._missing(f"{event.collective} over {event.group_size} GPUs ({event.scope}-node)")
            return self.fallback.comm(event)
        if event.scope == "inter" and event.sharers > self.fallback.cluster.nics_per_node:
            fit = self.db.fit(event.collective, event.scope, event.group_size)
            alpha = fit.alpha_s if fit is not None else 0.0
            share = event.sharers / self.fallback.cluster.nics_per_node
            shared = alpha + max(alone.seconds - alpha, 0.0) * share
            samples = (
                tuple(x * shared / alone.seconds for x in alone.samples) if alone.samples and alone.seconds else None
            )
            return Cost(shared, alone.source, samples)
        return alone

    def interference(self, scope: str) -> tuple[float, float]:
        """Measured (``distsim profile``), else the fallback's first-principles figure."""
        found = self.db.interference_for(scope)
        return (found.compute_slowdown, found.comm_slowdown) if found else self.fallback.interference(scope)

    @property
    def framework(self) -> Framework:
        return self.fallback.framework

    def collocation_slowdown(self) -> CollocationSlowdown:
        """The profile's measured figure (``distsim profile --collocation``), else the fallback's (unless strict)."""
        found = self.db.collocation
        if found is None:
            self._missing("the slowdown of a collocated background job (distsim profile --collocation)")
            return self.fallback.collocation_slowdown()
        return CollocationSlowdown(found.slowdown, "measured", found.method)

    def optimizer(self, shard_params: float, state_bytes_per_param: int) -> Cost:
        key = optimizer_key(shard_params, state_bytes_per_param)
        m = self.db.compute.get(key)
        if m is not None:
            return Cost(m.seconds, "measured")
        fit = self.db.compute_fit(f"optimizer/state_bytes={state_bytes_per_param}")
        if fit is not None:
            return Cost(fit.time_s(shard_params), "fitted")
        self._missing(f"optimizer step {key}")
        return self.fallback.optimizer(shard_params, state_bytes_per_param)
