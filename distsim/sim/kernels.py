"""Analytic kernel times on one device: the per-op model behind :class:`distsim.sim.costs.AnalyticCosts`.

A block's ops (:mod:`distsim.core.models.ops`) are scaled to the event's micro-batch size and tensor-parallel shard and
costed one kernel at a time; the event's device time is their sum and its host launch time is its kernel count times
``GPU.kernel_launch_s``. Every kernel also pays ``GPU.kernel_latency_s`` (start, first-wave ramp, tail).

* **GEMM** (tile and wave quantisation, as a tensor-core GEMM runs: NVIDIA, "Matrix Multiplication Background User's
  Guide", sections on tile and wave quantization). The output is cut into 128 x 128 tiles (64 wide along a dimension of
  at most 64); the tiles run in waves of ``sm_count``, one tile per SM, each tile taking its
  ``2 * 128 * 128 * k`` FLOPs at ``peak * compute_efficiency / sm_count`` plus its epilogue, the output tile written
  at the running tiles' share of memory bandwidth. A GEMM with at most half a wave of tiles may split k over the idle
  SMs (split-K, reduced in fp32 afterwards) where that is faster. The time is never below the GEMM's bytes (A, B and
  C once) over memory bandwidth. On a device without SMs (a CPU) it is the roofline max(FLOPs / achieved FLOP/s,
  bytes / bandwidth).
* **Memory-bound kernels** move their bytes at ``memory_bandwidth * memory_efficiency``, row reductions (layer norm,
  softmax, batch norm, cross-entropy) at ``REDUCTION_EFFICIENCY`` of that.
* **Flash attention** (Dao 2023, FlashAttention-2, Algorithms 1 and 2): the forward runs one thread block per
  128-query block and head, looping over 128-key blocks (a causal mask skips the blocks above the diagonal, Sec.
  3.1.1); each block pair does two 128 x 128 x d matrix multiplies on the tensor cores and, not overlapped with them,
  one exp per score on the special-function units (16 per SM per clock: CUDA C++ Programming Guide, "Arithmetic
  Instructions" throughput table, compute capability 7.0-9.0) and ``SOFTMAX_FP32_OPS`` FP32 operations per score
  (scale, running max, sum, conversion). The backward runs one thread block per key block, five matrix multiplies
  per pair (the recomputed scores, dP, dV, dK, dQ), the same softmax work, and adds each pair's dQ into an fp32
  buffer (128 x d 4-byte atomic adds at memory bandwidth); plus the dO.O row sums and the dQ conversion kernels.
* **Stored-score attention** (``unfused``, ``fused_softmax``: Megatron-LM before flash attention, the kernels of
  :data:`distsim.core.models.ops.SCORE_KERNELS`): each kernel on its own, the batched GEMMs (Q K^T, P V; backward
  dP, dV, dQ, dK) as GEMMs above with one matrix per sequence and head (``torch.baddbmm``/``torch.bmm`` over
  micro-batch x local heads; the whole s x s square, a causal mask skips nothing), the scale, mask, softmax and
  dropout kernels as memory-bound kernels over the scores, the softmax and its backward as row reductions.

Constants below are from first principles, vendor documents or this project's own H100 measurements
(``shared/evidence/h100-2026-11-22/micro.log``), as each says.
"""

from __future__ import annotations

import math

from distsim.core.cluster import GPU
from distsim.core.errors import ClusterError
from distsim.core.models.ops import AttentionOp, GemmOp, MemoryOp, Op

TILE = 128
"""Output tile edge of a tensor-core GEMM: CUTLASS's and cuBLAS's default 128 x 128 threadblock tile (NVIDIA,
"Matrix Multiplication Background User's Guide"; CUTLASS "Efficient GEMM in CUDA")."""
MIN_TILE = 64
"""Narrowest tile edge used for a thin dimension (Hopper's wgmma instructions are 64 rows tall)."""
ACCUMULATE_BYTES = 8
"""Bytes per element a weight-gradient GEMM's epilogue moves: it reads and writes the fp32 main gradient it
accumulates into (Megatron-LM's gradient-accumulation fusion)."""
SPLIT_K_PARTIAL_BYTES = 4
"""Split-K partial sums are fp32."""
FA_BLOCK = 128
"""Query and key block of FlashAttention-2 for head dimensions up to 128 (Dao 2023, Sec. 3.3)."""
SFU_OPS_PER_SM_PER_CLOCK = 16
"""exp2 results per SM per clock (CUDA C++ Programming Guide, throughput of native arithmetic instructions)."""
SOFTMAX_FP32_OPS = 4
"""FP32 instructions per attention score besides the exp, forward and backward (FlashAttention-2 Algorithm 1
lines 8-10: scale-and-subtract the max, running max, running sum, convert to 16 bits; Algorithm 2: dS = P (dP - D))."""
ATTENTION_BWD_MATMULS = 5
"""Matrix multiplies per block pair in FlashAttention-2's backward (Algorithm 2: S, dP, dV, dK, dQ), against 2."""
REDUCTION_EFFICIENCY = 0.70
"""Share of a streaming kernel's bandwidth a row reduction reaches: this project's H100 (micro.log, 2^27 fp16
elements, rows of 1024) moved 1825 GB/s in layer norm and 2337 GB/s in softmax against 2903-2988 GB/s in GeLU and
copy: 0.61 and 0.78, mean 0.70."""


def _tile(dim: int) -> int:
    """Tile edge along a dimension of `dim` elements: 128, or 64 for a dimension of at most 64."""
    return MIN_TILE if dim <= MIN_TILE else TILE


def _bandwidth(gpu: GPU) -> float:
    return gpu.memory_bandwidth_bytes_per_s * gpu.memory_efficiency


def gemm_s(
    gpu: GPU, m: float, n: float, k: float, moved_bytes: float, out_bytes_per_elem: float, batch: float = 1,
    fp8: bool = False,
) -> float:  # fmt: skip
    """Seconds of one m x n x k GEMM's work (no kernel latency), or of a batched GEMM of `batch` such matrices in one
    kernel (their tiles share the waves); `moved_bytes` are A, B and C read or written once (the floor, all of the
    batch), `out_bytes_per_elem` what the epilogue moves per output element; `fp8`: on the FP8 tensor cores."""
    flops = 2.0 * m * n * k * batch
    rate = (fp8_rate(gpu) if fp8 else gpu.peak_flops_per_s) * gpu.compute_efficiency
    bw = _bandwidth(gpu)
    floor = moved_bytes / bw
    sms = int(gpu.sm_count)
    if sms <= 0 or flops == 0:
        return max(flops / rate, floor)
    tm, tn = _tile(math.ceil(m)), _tile(math.ceil(n))
    tiles = math.ceil(batch) * math.ceil(m / tm) * math.ceil(n / tn)
    best = math.inf
    for split in _splits(tiles, sms):
        waves = math.ceil(tiles * split / sms)
        running = min(sms, tiles * split)  # tiles in flight share the memory bandwidth for their epilogues
        epilogue = SPLIT_K_PARTIAL_BYTES if split > 1 else out_bytes_per_elem
        tile_s = 2.0 * tm * tn * math.ceil(k / split) / (rate / sms) + tm * tn * epilogue / (bw / running)
        t = waves * tile_s
        if split > 1:  # reduce the fp32 partials into the output
            t += batch * m * n * (split * SPLIT_K_PARTIAL_BYTES + out_bytes_per_elem) / bw
        best = min(best, t)
    return max(best, floor)


def fp8_rate(gpu: GPU) -> float:
    """The GPU's dense FP8 tensor-core peak; one line naming the GPU where it has none."""
    if gpu.fp8_flops_per_s <= 0:
        raise ClusterError(f"{gpu.name} has no FP8 tensor cores: simulate an fp8 model on an H100 or H200, or use "
                           "precision=bf16-mixed")  # fmt: skip
    return gpu.fp8_flops_per_s


def _splits(tiles: int, sms: int) -> list[int]:
    """Split-K factors tried: 1, and when at most half a wave of tiles runs, the powers of two up to the number of
    slices that fill the SMs; the fastest is taken, as cuBLAS's heuristics aim to. (The set does not depend on k, so
    a longer inner dimension never makes a GEMM faster.)"""
    out = [1]
    while 2 * tiles * out[-1] <= sms:
        out.append(2 * out[-1])
    return out


def memory_s(gpu: GPU, nbytes: float, reduction: bool = False) -> float:
    """Seconds of a memory-bound kernel's work moving `nbytes` (no kernel latency)."""
    bw = _bandwidth(gpu) * (REDUCTION_EFFICIENCY if reduction else 1.0)
    return nbytes / bw


def _causal_pairs(nq: int, nk: int) -> int:
    """(query block, key block) pairs a causal mask keeps: query block i sees key blocks 0..i."""
    return sum(min(nk, i + 1) for i in range(nq))


def attention_s(gpu: GPU, op: AttentionOp, batch_heads: float, phase: str) -> float:
    """Seconds of an attention core's work over `batch_heads` (micro-batch x local heads) sequences: the flash
    kernel(s), or the stored-score kernels of ``op.impl`` (:func:`score_attention_s`)."""
    if op.impl != "flash":
        return score_attention_s(gpu, op, batch_heads, phase)
    d, e = op.head_dim, op.elem_bytes
    nq, nk = math.ceil(op.q_len / FA_BLOCK), math.ceil(op.kv_len / FA_BLOCK)
    pairs = _causal_pairs(nq, nk) if op.causal else nq * nk
    kept = pairs / (nq * nk)  # share of the score matrix computed
    rate = gpu.peak_flops_per_s * gpu.compute_efficiency
    bw = _bandwidth(gpu)
    io = op.io_bytes / op.heads * batch_heads  # Q, K, V, O of these sequences
    matmuls = 2 if phase == "F" else ATTENTION_BWD_MATMULS
    sms = int(gpu.sm_count)
    if sms <= 0:  # a CPU: the kept FLOPs at the achieved rate, the tensors at bandwidth
        if op.causal and op.q_len == op.kv_len:  # the lower triangle, token by token: never less for a longer one
            kept = (op.q_len + 1) / (2 * op.q_len)
        flops = op.flops / op.heads * batch_heads * kept * matmuls / 2
        return flops / rate + io * (1 if phase == "F" else 2) / bw
    scores_s = 1 / (SFU_OPS_PER_SM_PER_CLOCK * gpu.clock_hz) if gpu.clock_hz > 0 else 0.0
    if gpu.fp32_flops_per_s > 0:
        scores_s += SOFTMAX_FP32_OPS / (gpu.fp32_flops_per_s / 2 / sms)
    block = FA_BLOCK * FA_BLOCK
    pair_s = matmuls * 2.0 * block * d / (rate / sms) + block * scores_s
    if phase == "F":  # a thread block per query block: reads its Q block, writes its O block
        ctas, loop = batch_heads * nq, pairs / nq
        cta_io_s = 2 * FA_BLOCK * d * e / (bw / sms)
        extra_s = 0.0
    else:  # a thread block per key block: reads K, V, writes dK, dV; each pair adds its dQ into an fp32 buffer
        ctas, loop = batch_heads * nk, pairs / nk
        pair_s += FA_BLOCK * d * 4 / (bw / sms)
        cta_io_s = 4 * FA_BLOCK * d * e / (bw / sms)
        extra_s = batch_heads * op.q_len * d * (2 * e + 4 + e) / bw  # dO.O row sums; fp32 dQ -> dQ
    t = math.ceil(ctas / sms) * (loop * pair_s + cta_io_s) + extra_s
    return max(t, io * (1 if phase == "F" else 2) / bw)


def score_attention_s(gpu: GPU, op: AttentionOp, batch_heads: float, phase: str) -> float:
    """Seconds of a stored-score attention core's kernels (``op.score_kernels(phase)``) over `batch_heads` sequences
    (no kernel latency): batched GEMMs at e bytes per output element, memory-bound kernels over the scores."""
    q, kv, d, e = op.q_len, op.kv_len, op.head_dim, op.elem_bytes
    total = 0.0
    for kernel in op.score_kernels(phase):
        nbytes = kernel.bytes(q, kv, d, e) * batch_heads
        if kernel.gemm is None:
            total += memory_s(gpu, nbytes, kernel.reduction)
        else:
            m, n, k = kernel.dims(q, kv, d)
            total += gemm_s(gpu, m, n, k, nbytes, e, batch=batch_heads)
    return total


def op_s(gpu: GPU, op: Op, phase: str, micro_batch_size: int, tp: int) -> tuple[float, int]:
    """(device seconds, kernels) of one op of a block for an event: forward (``F``) or backward (``B``) over
    `micro_batch_size` samples, sharded over `tp` ranks where the op is sharded."""
    b = micro_batch_size
    lat = gpu.kernel_latency_s
    if isinstance(op, GemmOp):
        return _gemm_op_s(gpu, op, phase, b, tp)
    if isinstance(op, AttentionOp):
        kernels = op.fwd_kernels if phase == "F" else op.bwd_kernels
        return attention_s(gpu, op, b * op.heads / tp, phase) + kernels * lat, kernels
    assert isinstance(op, MemoryOp)
    share = tp if op.tp == "shard" else 1
    if phase == "F":
        nbytes, kernels = op.bytes * b / share, op.kernels
    else:
        nbytes, kernels = (op.bwd_factor * op.bytes * b + op.bwd_fixed_bytes) / share, op.bwd_kernels
    if kernels == 0:
        return 0.0, 0
    return memory_s(gpu, nbytes, op.reduction) + kernels * lat, kernels


def _gemm_op_s(gpu: GPU, op: GemmOp, phase: str, b: int, tp: int) -> tuple[float, int]:
    """Forward: Y[m x n] = X[m x k] W[k x n]. Backward: dX = dY W^T (m x k, inner n) and dW = X^T dY (k x n,
    inner m) accumulated into the fp32 main gradient."""
    e = op.elem_bytes
    fp8 = e == 1  # FP8 operands (their casts are ops of their own), bf16 outputs
    out = 2 if fp8 else e
    n = op.n / tp if op.split == "n" else op.n
    k = op.k / tp if op.split == "k" else op.k
    m = op.m * b
    x = (m * k if op.in_elems is None else op.in_elems * b / (tp if op.split == "k" else 1)) * e
    w, y = k * n * e, m * n * e
    lat = gpu.kernel_latency_s
    if phase == "F":
        return gemm_s(gpu, m, n, k, x + w + m * n * out, out, fp8=fp8) + lat, 1
    dx = gemm_s(gpu, m, k, n, y + w + x * out / e, out, fp8=fp8)
    dw = gemm_s(gpu, k, n, m, x + y + k * n * ACCUMULATE_BYTES, ACCUMULATE_BYTES, fp8=fp8)
    return dx + dw + 2 * lat, 2


def block_s(gpu: GPU, ops: tuple[Op, ...], phase: str, micro_batch_size: int, tp: int) -> tuple[float, int]:
    """(device seconds, kernels) of a block's ops for one event."""
    total, kernels = 0.0, 0
    for op in ops:
        t, n = op_s(gpu, op, phase, micro_batch_size, tp)
        total += t
        kernels += n
    return total, kernels
