"""Framework: what the training framework adds to a model's kernels, as a value with presets (like clusters).

Real runs differ from an idealised one by what their framework does: which attention kernel runs (and so which
activations stay in memory), how much host time each operator costs before its kernel reaches the GPU (Python,
PyTorch's dispatcher, autograd), whether CUDA graphs remove that host time, how many SMs its communication kernels
take from the compute they overlap (:meth:`Framework.interference`), and whether tensor-parallel collectives are
pipelined with their GEMMs (Megatron's ``--tp-comm-overlap``). A :class:`Framework` states these;
:meth:`Framework.apply` rewrites a model's attention to the framework's kernel (time and memory follow together), and
the analytic cost model charges every kernel the framework's host time on top of the GPU's launch time
(:class:`distsim.sim.costs.AnalyticCosts`), so that the host stream sets the pace where it should: small layers,
micro-batch 1-2 and tensor parallelism cutting the GEMMs.

Host costs are this project's own measurements: the host time per kernel of eager PyTorch modules shaped as
Megatron's (layer norm, QKV, flash attention, projection, bias-dropout-add; the MLP; embedding; LM head), measured by
``distsim profile`` on one H200 host (``shared/evidence/h200-2026-11-26/profiles``: each block event's ``launch_s``
over its kernel count from the op lists, 24 forward and 24 backward events of gpt2-345m, bert-large and gpt3-1.3b at
micro-batch 1-8): median 63 us per forward kernel (32-98 us) and 84 us per backward kernel (33-133 us), the GPU's
7 us launch included. Those blocks ran under distsim's executor, whose per-block recording adds its own host time, so
these figures are an upper bound for a plain training loop on that host; a slower or faster host CPU scales them
(the same step measured 342 and 275 ms on two H200 machines). On a tiny-tensor CPU chain of ``nn.Module`` calls
(``benchmarks/host_op_cost.py``, this project's 2-vCPU AMD EPYC VM) eager PyTorch costs 10.8-11.1 us per forward and
14.7-14.9 us per backward op: the floor of the framework's dispatch and autograd alone. Pure: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from distsim.core.errors import DistsimError, UnknownNameError
from distsim.core.models.ops import ATTENTION_IMPLS
from distsim.core.models.transformer import with_attention

if TYPE_CHECKING:
    from distsim.core.models.graph import Model
    from distsim.core.strategy import Strategy

MEGATRON_BUCKET_PARAMS = 40_000_000
"""Megatron-Core's gradient bucket, in parameters, at data-parallel sizes up to 40 (``bucket_size = max(40000000,
1000000 * data_parallel_size)``)."""
MIB = 1024 * 1024

EAGER_FORWARD_OP_S = 56e-6
"""Host seconds per forward kernel beyond the GPU's launch time: 63 us measured per forward kernel on the H200 host
(median, see above) less the 7 us launch the GPU preset already charges."""
EAGER_BACKWARD_OP_S = 77e-6
"""Host seconds per backward kernel beyond the launch: 84 us measured (median) less 7 us."""


class FrameworkError(DistsimError, ValueError):
    """A framework file or name that cannot be used."""


@dataclass(frozen=True)
class Framework:
    """What a training framework runs for a model's kernels."""

    name: str
    attention: str = "flash"
    """The attention kernel: ``flash`` (FlashAttention-2/3, cuDNN, Transformer Engine's fused attention: no s x s
    scores stored), ``fused_softmax`` (Megatron's FusedScaleMaskSoftmax: scores stored) or ``unfused``."""
    host_op_s: float = EAGER_FORWARD_OP_S
    """Host seconds per forward kernel beyond the GPU's launch time (Python, dispatcher, autograd recording)."""
    host_backward_op_s: float = EAGER_BACKWARD_OP_S
    """Host seconds per backward kernel beyond the GPU's launch time (the autograd engine)."""
    cuda_graphs: bool = False
    """Kernels replayed from captured CUDA graphs: no per-kernel host time at all (launch included)."""
    comm_sms: int = 0
    """SMs a communication kernel occupies while it runs (NCCL: one thread block per channel, each on an SM), which
    compute overlapped with it loses (:meth:`interference`); 0: overlap taken as free."""
    tp_comm_overlap: bool = False
    """Megatron-Core's ``--tp-comm-overlap`` (Transformer Engine userbuffers): with sequence parallelism, the
    all-gather before a column-parallel GEMM and the reduce-scatter after a row-parallel one run in
    :attr:`tp_comm_overlap_chunks` chunks pipelined with that GEMM, inside a node (Megatron refuses it without
    sequence parallelism; here it then has no effect)."""
    tp_comm_overlap_chunks: int = 4
    """Chunks a pipelined tensor-parallel collective and its GEMM are split into (Transformer Engine's userbuffers
    ``num_splits`` default, 4): the pair then takes max(GEMM, collective) + min(GEMM, collective) / chunks."""
    overlap_param_gather: bool = False
    """Megatron's ``--overlap-param-gather`` (with the distributed optimizer, ``zero1``/``zero2``): each bucket's
    parameter all-gather after the optimizer step runs beside the next iteration's forward, which waits, layer by
    layer, only for its own bucket; in the steady state the flow issues them at the iteration's start, in forward
    order, and the first micro-batch's forward of each layer waits for its bucket. Megatron requires
    ``--overlap-grad-reduce`` with it: with one bucket (``bulk``) the first layer waits for all of it. Strategies
    only (a stages plan gathers after the step)."""
    overlap_grad_reduce: bool = False
    """Megatron's ``--overlap-grad-reduce``: gradients are reduced in buckets of max(40 M, 1 M x dp) parameters, each
    as soon as its last gradient is ready in the last micro-batch (:meth:`synchronised`); without it one reduction
    after the whole backward (``bulk``)."""
    source: str = ""
    """Where the settings come from (the framework's source and flags)."""

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_IMPLS:
            raise FrameworkError(f"framework {self.name!r}: attention must be one of {', '.join(ATTENTION_IMPLS)}, "
                                 f"got {self.attention!r}")  # fmt: skip
        for name in ("host_op_s", "host_backward_op_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
                hint = ""
                if isinstance(value, str) and _is_number(value):
                    hint = f" (text: YAML reads {value} as a string; write it with a decimal point, e.g. 1.0e-5)"
                raise FrameworkError(f"framework {self.name!r}: {name} must be seconds in [0, 1), got {value!r}{hint}")
        for name in ("cuda_graphs", "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather"):
            if not isinstance(getattr(self, name), bool):
                raise FrameworkError(f"framework {self.name!r}: {name} must be true or false")
        for name, low in (("comm_sms", 0), ("tp_comm_overlap_chunks", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise FrameworkError(f"framework {self.name!r}: {name} must be a whole number >= {low}, got {value!r}")

    def host_s(self, kernels: int, phase: str, launch_s: float) -> float:
        """Host seconds to issue `kernels` kernels of a forward (``F``) or backward (``B``) event on a GPU whose
        launch takes `launch_s` per kernel (none on a device that runs its own work: launch_s 0)."""
        if self.cuda_graphs or launch_s <= 0:
            return 0.0
        extra = self.host_op_s if phase == "F" else self.host_backward_op_s
        return kernels * (launch_s + extra)

    def interference(self, sm_count: int) -> float:
        """Compute slowdown c (an overlapped kernel takes 1 + c times as long) while a communication kernel of this
        framework runs beside it on a GPU of `sm_count` SMs: it holds :attr:`comm_sms` of them, so compute keeps
        the share f = 1 - comm_sms / sm_count of the SMs, c = (1 - f) / f. 0 on a device without SMs (a CPU: measure
        it, ``distsim profile``) or without :attr:`comm_sms`. The collective's memory traffic (about three times its
        link rate: what it sends, receives and reduces) slows memory-bound kernels too; GEMMs, which run beside
        gradient reduction and tensor-parallel collectives, are bound by their SMs, so that term is left out."""
        if self.comm_sms == 0 or sm_count <= 0:
            return 0.0
        held = min(self.comm_sms, sm_count - 1) / sm_count
        return held / (1 - held)

    def overlapped_pair_s(self, gemm_s: float, comm_s: float, slowdown: float) -> tuple[float, float]:
        """(GEMM seconds, exposed collective seconds) of a GEMM and a tensor-parallel collective pipelined in
        :attr:`tp_comm_overlap_chunks` chunks: the GEMM slowed by `slowdown` (c) while they overlap, the pair
        taking max(GEMM, collective) + min(GEMM, collective) / chunks in all (a two-stage pipeline of equal
        chunks: the first chunk of one waits for nothing, the last of the other for everything), of which what
        passes the GEMM's end is the collective's exposed part."""
        overlap = min(gemm_s, comm_s)
        gemm = gemm_s + overlap * slowdown
        total = max(gemm, comm_s) + min(gemm, comm_s) / self.tp_comm_overlap_chunks
        return gemm, total - gemm

    def synchronised(self, strategy: Strategy, grad_bytes: float) -> Strategy:
        """`strategy` with this framework's gradient synchronisation where the strategy leaves it at its default
        (``bulk``): with :attr:`overlap_grad_reduce` and data parallelism, Megatron-Core's buckets (``ddp`` mode, a
        bucket of ``max(40e6, 1e6 x dp)`` parameters of `grad_bytes` each, the first as large as the rest:
        ``megatron/core/distributed/distributed_data_parallel.py``), else unchanged."""
        if not self.overlap_grad_reduce or strategy.dp == 1 or strategy.grad_sync != "bulk":
            return strategy
        params = max(MEGATRON_BUCKET_PARAMS, 1_000_000 * strategy.dp)
        return strategy.with_(grad_sync="ddp", bucket_cap_mb=params * grad_bytes / MIB)

    def apply(self, model: Model) -> Model:
        """The model with this framework's attention kernel (its time and its stored activations)."""
        return with_attention(model, self.attention)

    def describe(self) -> str:
        host = "CUDA graphs (no per-kernel host time)" if self.cuda_graphs else (
            f"host {self.host_op_s * 1e6:.1f} us per forward and {self.host_backward_op_s * 1e6:.1f} us per backward "
            "kernel beyond the launch")  # fmt: skip
        parts = [f"{self.name}: {self.attention} attention", host]
        if self.comm_sms:
            parts.append(f"communication kernels hold {self.comm_sms} SMs")
        if self.tp_comm_overlap:
            parts.append(f"tensor-parallel communication overlapped with GEMMs in {self.tp_comm_overlap_chunks} "
                         "chunks")  # fmt: skip
        if self.overlap_grad_reduce:
            parts.append("gradients reduced in 40M-parameter buckets during backward")
        if self.overlap_param_gather:
            parts.append("sharded parameters gathered beside the next forward")
        return "; ".join(parts)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


_MEGATRON_SOURCE = ("Megatron-LM/Megatron-Core with Transformer Engine: --attention-backend flash (TE's fused or "
                    "FlashAttention), --bias-gelu-fusion, --bias-dropout-fusion, TE's fused layer norm, apex/TE "
                    "FusedAdam; eager PyTorch drives the kernels")  # fmt: skip

FRAMEWORKS: dict[str, Framework] = {}
"""Name -> preset (:func:`register_framework`)."""


def register_framework(framework: Framework) -> Framework:
    FRAMEWORKS[framework.name] = framework
    return framework


NCCL_SMS = 16
"""SMs an NCCL collective holds on an 8-GPU NVSwitch node (assumed): NCCL runs one thread block per channel, each
resident on an SM for the kernel's life; its topology search finds one ring per NVLink/NIC path (8 on DGX A100/H100)
and duplicates the channels it found (``src/graph/connect.cc``, at most ``MAXCHANNELS`` = 32): 16. Transformer
Engine's userbuffers give a pipelined reduce-scatter 16 SMs too (its default ``num_sm``)."""

for _framework in (
    Framework("megatron-core", "flash", comm_sms=NCCL_SMS, source=_MEGATRON_SOURCE),
    Framework("megatron-core-overlap", "flash", comm_sms=NCCL_SMS, tp_comm_overlap=True, overlap_grad_reduce=True,
              overlap_param_gather=True,
              source=_MEGATRON_SOURCE + "; with --tp-comm-overlap (Transformer Engine userbuffers: all-gather and "
                     "reduce-scatter pipelined with the GEMMs beside them; needs --sequence-parallel) and "
                     "--overlap-grad-reduce (bucketed gradient reduction during backward) and --overlap-param-gather "
                     "(the distributed optimizer's all-gathers beside the next forward), as NVIDIA's performance "
                     "recipes launch them"),
    Framework("megatron-lm-2021", "fused_softmax", comm_sms=NCCL_SMS,
              source="Megatron-LM v2-v3 (2021-22, Narayanan et al. and Korthikanti et al.'s runs): "
                     "--masked-softmax-fusion (megatron/model/fused_softmax.py, scores stored), fused bias-GeLU and "
                     "bias-dropout-add, apex FusedLayerNorm and FusedAdam; eager PyTorch"),
    Framework("deepspeed", "fused_softmax", comm_sms=NCCL_SMS,
              source="Megatron-DeepSpeed (Megatron-LM 2021 model code with DeepSpeed's engine): the same fused masked "
                     "softmax; eager PyTorch"),
    Framework("pytorch-eager", "flash", comm_sms=NCCL_SMS,
              source="plain PyTorch: F.scaled_dot_product_attention (its flash backend), eager modules"),
    Framework("pytorch-unfused", "unfused", comm_sms=NCCL_SMS,
              source="plain PyTorch with attention written out (matmul, softmax, dropout, matmul), eager modules"),
    Framework("torch-compile", "flash", cuda_graphs=True, comm_sms=NCCL_SMS,
              source="torch.compile(mode='reduce-overhead'): Inductor's fused kernels replayed from CUDA graphs"),
    Framework("ideal", "flash", host_op_s=0.0, host_backward_op_s=0.0,
              source="no framework cost beyond the GPU's kernel launch, overlap free (distsim's model before "
                     "frameworks)"),
    Framework("deeppool", "flash", host_op_s=0.0, host_backward_op_s=0.0,
              source="DeepPool's runtime (Park et al., MLSys'23): whole training iterations captured as CUDA graphs "
                     "('removing kernel launch overheads with CUDA graphs'); charged here at the GPU's launch per "
                     "kernel, an upper bound of a graph replay"),
):  # fmt: skip
    register_framework(_framework)

DEFAULT_FRAMEWORK = "megatron-core"
"""What the analytic model charges when no framework is named: Megatron-Core's, the framework most large runs use
(eager PyTorch's host time per kernel, NCCL's SMs taken from overlapped compute). ``--framework ideal`` gives the
model without framework costs (the GPU's launch per kernel only, overlap free); a device without a launch cost (a
CPU) is unaffected either way. The attention kernel of a model is the one its spec states (flash unless it says
``attention=``) unless a framework is named."""


def get_framework(name: str) -> Framework:
    """A preset by name (one line naming the choices on a miss)."""
    try:
        return FRAMEWORKS[name.lower()]
    except KeyError:
        raise UnknownNameError(f"unknown framework {name!r}; choose one of {', '.join(FRAMEWORKS)} or give a "
                               "framework file") from None  # fmt: skip


def framework_from_dict(data: object, where: str) -> Framework:
    """A framework file: ``{name: ..., base: megatron-core, attention: ..., host_op_s: ..., ...}`` (``base`` names
    the preset the unset fields come from; default: :data:`DEFAULT_FRAMEWORK`)."""
    if not isinstance(data, Mapping):
        raise FrameworkError(f"{where}: a framework file is a mapping like {{name: mine, attention: flash}}")
    allowed = {f.name for f in fields(Framework)} | {"base"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise FrameworkError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")
    base_name = data.get("base", DEFAULT_FRAMEWORK)
    if not isinstance(base_name, str):
        raise FrameworkError(f"{where}: base must be a framework name, got {base_name!r}")
    base = get_framework(base_name)
    values: dict[str, Any] = {k: v for k, v in data.items() if k != "base"}
    values.setdefault("name", f"{base.name} (custom)")
    try:
        return replace(base, **values)
    except FrameworkError as exc:
        raise FrameworkError(f"{where}: {exc}") from None
    except TypeError as exc:
        raise FrameworkError(f"{where}: {exc}") from None
