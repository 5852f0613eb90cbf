"""The eight workloads of EasyScale's Table 1 and their capability per GPU type, which the synthetic trace generator
(:mod:`distsim.elastic.synth`) draws from and the Philly reader (:mod:`distsim.elastic.jobs`) assigns.

``MODELS`` gives mini-batches/s per GPU of the trace's types (:data:`TYPES`, registered GPU types of
:mod:`distsim.core.cluster`). The V100 figure is a per-model assumption; P100 and T4 scale it by vendor ratios:
compute-bound models by FP32 peak (V100 15.7, P100 9.3, T4 8.1 TFLOPS: 0.59 and 0.52; the P100's is the PCIe card's,
below the registered SXM2 part's 10.6), memory-bound ones (NeuMF, ShuffleNetV2) by the registered types' memory
bandwidth (900, 732, 320 GB/s: 0.81 and 0.36).
"""

from __future__ import annotations

from distsim.core.cluster import gpu_type

TYPES = tuple(gpu_type(t)[0] for t in ("V100", "P100", "T4"))
"""The GPU types of EasyScale's trace experiment, by their registered names."""
_COMPUTE = dict(zip(TYPES, (1.0, 9.3 / 15.7, 8.1 / 15.7), strict=True))
_MEMORY = {t: gpu_type(t)[1].memory_bandwidth_bytes_per_s / gpu_type("V100")[1].memory_bandwidth_bytes_per_s
           for t in TYPES}  # fmt: skip


def _caps(v100: float, ratios: dict[str, float]) -> dict[str, float]:
    return {t: round(v100 * r, 3) for t, r in ratios.items()}


MODELS: dict[str, dict[str, float]] = {
    "shufflenetv2": _caps(12.0, _MEMORY),
    "resnet50": _caps(10.0, _COMPUTE),
    "vgg19": _caps(6.0, _COMPUTE),
    "yolov3": _caps(4.0, _COMPUTE),
    "neumf": _caps(40.0, _MEMORY),
    "bert": _caps(5.0, _COMPUTE),
    "electra": _caps(6.0, _COMPUTE),
    "swin": _caps(4.5, _COMPUTE),
}
"""Mini-batches/s per GPU of each type, per model (V100 assumed, P100/T4 by vendor ratios)."""
