"""Framework: what the training framework adds to a model's kernels, as a value with presets (like clusters).

Real runs differ from an idealised one by what their framework does: which attention kernel runs (and so which
activations stay in memory), how much host time each operator costs before its kernel reaches the GPU (Python,
PyTorch's dispatcher, autograd), and whether CUDA graphs remove that host time. A :class:`Framework` states these;
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
        if not isinstance(self.cuda_graphs, bool):
            raise FrameworkError(f"framework {self.name!r}: cuda_graphs must be true or false")

    def host_s(self, kernels: int, phase: str, launch_s: float) -> float:
        """Host seconds to issue `kernels` kernels of a forward (``F``) or backward (``B``) event on a GPU whose
        launch takes `launch_s` per kernel (none on a device that runs its own work: launch_s 0)."""
        if self.cuda_graphs or launch_s <= 0:
            return 0.0
        extra = self.host_op_s if phase == "F" else self.host_backward_op_s
        return kernels * (launch_s + extra)

    def apply(self, model: Model) -> Model:
        """The model with this framework's attention kernel (its time and its stored activations)."""
        return with_attention(model, self.attention)

    def describe(self) -> str:
        host = "CUDA graphs (no per-kernel host time)" if self.cuda_graphs else (
            f"host {self.host_op_s * 1e6:.1f} us per forward and {self.host_backward_op_s * 1e6:.1f} us per backward "
            "kernel beyond the launch")  # fmt: skip
        return f"{self.name}: {self.attention} attention; {host}"


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


for _framework in (
    Framework("megatron-core", "flash", source=_MEGATRON_SOURCE),
    Framework("megatron-lm-2021", "fused_softmax",
              source="Megatron-LM v2-v3 (2021-22, Narayanan et al. and Korthikanti et al.'s runs): "
                     "--masked-softmax-fusion (megatron/model/fused_softmax.py, scores stored), fused bias-GeLU and "
                     "bias-dropout-add, apex FusedLayerNorm and FusedAdam; eager PyTorch"),
    Framework("deepspeed", "fused_softmax",
              source="Megatron-DeepSpeed (Megatron-LM 2021 model code with DeepSpeed's engine): the same fused masked "
                     "softmax; eager PyTorch"),
    Framework("pytorch-eager", "flash",
              source="plain PyTorch: F.scaled_dot_product_attention (its flash backend), eager modules"),
    Framework("pytorch-unfused", "unfused",
              source="plain PyTorch with attention written out (matmul, softmax, dropout, matmul), eager modules"),
    Framework("torch-compile", "flash", cuda_graphs=True,
              source="torch.compile(mode='reduce-overhead'): Inductor's fused kernels replayed from CUDA graphs"),
    Framework("ideal", "flash", host_op_s=0.0, host_backward_op_s=0.0,
              source="no framework cost beyond the GPU's kernel launch (distsim's model before frameworks)"),
    Framework("deeppool", "flash", host_op_s=0.0, host_backward_op_s=0.0,
              source="DeepPool's runtime (Park et al., MLSys'23): whole training iterations captured as CUDA graphs "
                     "('removing kernel launch overheads with CUDA graphs'); charged here at the GPU's launch per "
                     "kernel, an upper bound of a graph replay"),
):  # fmt: skip
    register_framework(_framework)

DEFAULT_FRAMEWORK = "ideal"
"""What the analytic model charges when no framework is named: the GPU's launch per kernel only, as before frameworks
(the shipped examples' figures are stated under it). Name the framework a run used (``--framework megatron-core``) to
charge its host time."""


def get_framework(name: str) -> Framework:
    """A preset by name (one line naming the choices on a miss)."""
    try:
        return FRAMEWORKS[name.lower()]
    except KeyError:
        raise UnknownNameError(f"unknown framework {name!r}; choose one of {', '.join(FRAMEWORKS)} or give a "
                               "framework file") from None  # fmt: skip


def framework_from_dict(data: object, where: str) -> Framework:
    """A framework file: ``{name: ..., base: megatron-core, attention: ..., host_op_s: ..., ...}`` (``base`` names
    the preset the unset fields come from; default megatron-core)."""
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
