"""Cluster description: nodes x GPUs, the GPU's speed and memory, and the two link classes.

Links are described per flow. ``intra`` is what one GPU gets to a peer on its node (NVLink through NVSwitch, or
PCIe). ``inter`` is what one network interface gives; a node has ``nics_per_node`` of them. When k point-to-point
flows leave a node at the same time through its NICs, each gets ``inter.bandwidth * min(1, nics_per_node / k)``; k
collectives crossing the node's boundary at once share all its NICs, as NCCL stripes a collective over every NIC:
each gets ``inter.bandwidth * nics_per_node / k`` (beyond one NIC, no more than the intra-node link can feed). The
event-flow builder knows k from the strategy's structure (how many symmetric peers on a node issue the same transfer
at once).

Every preset cites where its figures come from; figures a paper does not state are marked "assumed".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from distsim.core.errors import ClusterError, UnknownNameError, suggest

GB = 1e9
Gbit = 1e9 / 8
TFLOPS = 1e12
MAX_GPUS = 2**20
"""Most GPUs a cluster may have (1,048,576): the largest training clusters have some 100,000. Simulation is per
distinct GPU, but placement and the per-GPU view are arrays over every GPU, so a typo like --nodes 100000000 is
refused here rather than allocating gigabytes."""


@dataclass(frozen=True)
class GPU:
    """One accelerator."""

    name: str
    peak_flops_per_s: float
    """Dense tensor-core peak for the training dtype, FLOP/s."""
    memory_bytes: float
    """Device memory capacity, bytes."""
    memory_bandwidth_bytes_per_s: float
    """Device memory bandwidth, bytes/s."""
    compute_efficiency: float = 0.5
    """Fraction of peak a large kernel achieves (a GEMM tile's main loop, between its waves); used only by the
    analytic estimate (a profile replaces it)."""
    kernel_overhead_s: float = 10e-6
    """Fixed cost per compute event of a block without ops (launches, small kernels); analytic estimate only."""
    kernel_launch_s: float = 0.0
    """Host seconds to launch one kernel (an accelerator's host stream); 0 for CPUs, whose host runs the work."""
    sm_count: int = 0
    """Streaming multiprocessors: GEMM tiles and attention blocks run in waves of this many; 0 (CPUs): no waves."""
    clock_hz: float = 0.0
    """Clock at which the tensor-core peak is quoted, Hz: sets the special-function (exp) rate of an attention
    softmax, 16 per SM per clock; 0: softmax arithmetic is not modelled apart."""
    fp32_flops_per_s: float = 0.0
    """Non-tensor FP32 FLOP/s (an FMA is 2), for a softmax's element-wise arithmetic; 0: not modelled apart."""
    memory_efficiency: float = 1.0
    """Fraction of ``memory_bandwidth_bytes_per_s`` a streaming kernel achieves (1 where the bandwidth given is
    already a measured one)."""
    kernel_latency_s: float = 0.0
    """Device seconds every kernel of a block with ops takes beyond its work (start, first-wave ramp, tail)."""
    fp8_flops_per_s: float = 0.0
    """Dense FP8 tensor-core peak, FLOP/s (Hopper and later); 0: no FP8 tensor cores (an fp8 model is refused)."""


@dataclass(frozen=True)
class Link:
    """A link class as one flow sees it."""

    bandwidth_bytes_per_s: float
    """Bandwidth one flow gets, bytes/s (per direction)."""
    latency_s: float
    """Per-message latency (alpha), seconds."""


@dataclass(frozen=True)
class Cluster:
    """nodes x gpus_per_node identical GPUs; optional per-GPU slowdowns break symmetry (stragglers)."""

    name: str
    nodes: int
    gpus_per_node: int
    gpu: GPU
    intra: Link
    """GPU-to-GPU inside a node."""
    inter: Link
    """One NIC between nodes."""
    nics_per_node: int = 1
    source: str = ""
    slowdown: tuple[tuple[int, float], ...] = field(default=())
    """(gpu, factor) pairs: that GPU's compute takes factor x as long (a straggler). Empty: all nominal."""

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ClusterError(f"cluster {self.name!r}: nodes and gpus_per_node must be >= 1")
        if self.num_gpus > MAX_GPUS:
            raise ClusterError(
                f"cluster {self.name!r}: {self.nodes:,} nodes x {self.gpus_per_node:,} GPUs = {self.num_gpus:,} GPUs, "
                f"above the limit of {MAX_GPUS:,}"
            )
        if self.nics_per_node < 1:
            raise ClusterError(f"cluster {self.name!r}: nics_per_node must be >= 1")
        for label, value in (
            ("peak FLOP/s", self.gpu.peak_flops_per_s),
            ("memory", self.gpu.memory_bytes),
            ("memory bandwidth", self.gpu.memory_bandwidth_bytes_per_s),
            ("intra-node bandwidth", self.intra.bandwidth_bytes_per_s),
            ("inter-node bandwidth", self.inter.bandwidth_bytes_per_s),
        ):
            if not (value > 0 and math.isfinite(value)):
                raise ClusterError(f"cluster {self.name!r}: {label} must be a finite number > 0, got {value!r}")
        for label, value in (("compute_efficiency", self.gpu.compute_efficiency),
                             ("memory_efficiency", self.gpu.memory_efficiency)):  # fmt: skip
            if not 0 < value <= 1:
                raise ClusterError(f"cluster {self.name!r}: {label} must be in (0, 1]")
        if self.gpu.sm_count < 0 or self.gpu.sm_count != int(self.gpu.sm_count):
            raise ClusterError(f"cluster {self.name!r}: sm_count must be a whole number >= 0")
        for label, value in (
            ("kernel overhead", self.gpu.kernel_overhead_s),
            ("kernel launch", self.gpu.kernel_launch_s),
            ("kernel latency", self.gpu.kernel_latency_s),
            ("clock", self.gpu.clock_hz),
            ("fp32 FLOP/s", self.gpu.fp32_flops_per_s),
            ("intra-node latency", self.intra.latency_s),
            ("inter-node latency", self.inter.latency_s),
        ):
            if not (value >= 0 and math.isfinite(value)):
                raise ClusterError(f"cluster {self.name!r}: {label} must be a finite number >= 0, got {value!r}")
        for gpu, factor in self.slowdown:
            if not 0 <= gpu < self.num_gpus:
                raise ClusterError(f"cluster {self.name!r}: slowdown names GPU {gpu}, which it does not have")
            if not (factor > 0 and math.isfinite(factor)):
                raise ClusterError(f"cluster {self.name!r}: slowdown factor of GPU {gpu} must be a finite number > 0")

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def speed_factor(self, gpu: int) -> float:
        """How many times longer than nominal this GPU's compute takes (1.0 unless it is a straggler)."""
        for g, factor in self.slowdown:
            if g == gpu:
                return factor
        return 1.0

    def inter_flow_bandwidth(self, concurrent_flows: int) -> float:
        """Bandwidth of one of k point-to-point flows leaving a node at once through its NICs (a flow uses one)."""
        share = min(1.0, self.nics_per_node / max(1, concurrent_flows))
        return self.inter.bandwidth_bytes_per_s * share

    def inter_collective_bandwidth(self, concurrent: int) -> float:
        """Bandwidth of one of k collectives crossing a node's boundary at once: NCCL runs a channel per NIC and
        stripes a collective over all of them (reaching another GPU's NIC over NVLink, "PXN"), so each of the k
        gets nics/k NICs; beyond its own NIC it gets no more than the intra-node link can feed."""
        nic = self.inter.bandwidth_bytes_per_s
        share = self.nics_per_node / max(1, concurrent)
        if share <= 1:
            return nic * share
        return min(nic * share, max(nic, self.intra.bandwidth_bytes_per_s))

    def with_nodes(self, nodes: int) -> Cluster:
        return replace(
            self,
            nodes=nodes,
            slowdown=tuple((g, f) for g, f in self.slowdown if g < nodes * self.gpus_per_node),
        )

    def with_slowdown(self, slowdown: dict[int, float]) -> Cluster:
        return replace(self, slowdown=tuple(sorted(slowdown.items())))

    def scaled(self, compute: float = 1.0, bandwidth: float = 1.0) -> Cluster:
        """A what-if copy: compute `compute` x faster and every link `bandwidth` x wider."""
        gpu = replace(
            self.gpu,
            peak_flops_per_s=self.gpu.peak_flops_per_s * compute,
            memory_bandwidth_bytes_per_s=self.gpu.memory_bandwidth_bytes_per_s * compute,
            kernel_overhead_s=self.gpu.kernel_overhead_s / compute,
            kernel_latency_s=self.gpu.kernel_latency_s / compute,
            clock_hz=self.gpu.clock_hz * compute,
            fp32_flops_per_s=self.gpu.fp32_flops_per_s * compute,
        )
        intra = replace(self.intra, bandwidth_bytes_per_s=self.intra.bandwidth_bytes_per_s * bandwidth)
        inter = replace(self.inter, bandwidth_bytes_per_s=self.inter.bandwidth_bytes_per_s * bandwidth)
        return replace(self, gpu=gpu, intra=intra, inter=inter)

    def describe(self) -> str:
        g = self.gpu
        flops = g.peak_flops_per_s
        speed = f"{flops / TFLOPS:.0f} TFLOP/s" if flops >= TFLOPS else f"{flops / 1e9:.0f} GFLOP/s"
        return (
            f"{self.nodes} x {self.gpus_per_node} {g.name} ({speed}, "
            f"{g.memory_bytes / GB:.0f} GB); intra {self.intra.bandwidth_bytes_per_s / GB:.1f} GB/s, "
            f"inter {self.nics_per_node} x {self.inter.bandwidth_bytes_per_s / GB:.2f} GB/s"
        )


# Figures of the analytic kernel model that no datasheet gives, from this project's own H100 (shared/evidence/
# h100-2026-11-22/micro.log, one H100 80GB HBM3, torch 2.11, cuBLAS/cuDNN of CUDA 13) and assumed for the other GPUs:
#   compute_efficiency 0.80: a GEMM tile's main loop reaches 80 % of the dense peak (least-squares fit of the tile/wave
#     model to the 32 fp16/bf16 GEMMs measured there, 256x1024x1024 to 16384x12288x12288: 0.81-0.83, rms error 9 %);
#   memory_efficiency 0.89: a streaming kernel moves 0.89 of the datasheet bandwidth (copy of 2^27 fp16: 2988 GB/s
#     of 3350);
#   kernel_latency_s 2 us: device time of a kernel beyond its work (copy/GeLU/layer norm of 2^20 elements take
#     2.7-6.0 us for 4 MB; the same fit gives 0.5-2.5 us);
#   kernel_launch_s 7 us: host time to launch one kernel from eager PyTorch (7.22 us measured, 7.00 us per tiny kernel
#     back to back).
# SM counts and clocks are the vendor's: the clock is the one the datasheet's tensor peak implies, peak / (SMs x
# tensor-core FLOPs per SM per clock).
_MEASURED_H100 = {"compute_efficiency": 0.80, "memory_efficiency": 0.89, "kernel_latency_s": 2e-6,
                  "kernel_launch_s": 7e-6}  # fmt: skip
A40 = GPU(
    "A40",
    149.7 * TFLOPS,
    48 * GB,
    696 * GB,
    sm_count=84,
    clock_hz=1.74e9,
    fp32_flops_per_s=37.4 * TFLOPS,
    **_MEASURED_H100,
)  # NVIDIA A40 datasheet: FP16 tensor 149.7 TF dense, FP32 37.4 TF, 696 GB/s; GA102 (Ampere GA102 whitepaper): 84 SMs
# at 1740 MHz boost x 4 tensor cores x 256 FLOPs/clock = 149.7 TF
A10 = GPU(
    "A10",
    125 * TFLOPS,
    24 * GB,
    600 * GB,
    sm_count=72,
    clock_hz=1.695e9,
    fp32_flops_per_s=31.2 * TFLOPS,
    **_MEASURED_H100,
)  # NVIDIA A10 datasheet: FP16 tensor 125 TF dense, FP32 31.2 TF, 600 GB/s; 72 SMs at 1695 MHz boost
V100_16GB = GPU(
    "V100-SXM2-16GB",
    125 * TFLOPS,
    16 * GB,
    900 * GB,
    sm_count=80,
    clock_hz=1.53e9,
    fp32_flops_per_s=15.7 * TFLOPS,
    **_MEASURED_H100,
)  # V100 datasheet (125 TF tensor, 15.7 TF FP32, 900 GB/s) and Volta whitepaper (80 SMs, 1530 MHz); DAPPLE Table
# VIII: 16 GB
V100_32GB = replace(V100_16GB, name="V100-SXM2-32GB", memory_bytes=32 * GB)
# the 32 GB V100-SXM2 (same datasheet figures): EasyScale's V100s (its Sec. 6.3 fills "the 32GB V100 memory")
P100_16GB = GPU(
    "P100-SXM2-16GB",
    21.2 * TFLOPS,
    16 * GB,
    732 * GB,
    sm_count=56,
    clock_hz=1.48e9,
    fp32_flops_per_s=10.6 * TFLOPS,
    **_MEASURED_H100,
)  # Tesla P100 SXM2 datasheet: FP16 21.2 TF (no tensor cores; 2x FP32 via half2), FP32 10.6 TF, 732 GB/s, 16 GB;
# Pascal GP100 whitepaper: 56 SMs at 1480 MHz boost x 64 FP32 cores x 2 (FMA) x 2 (half2) = 21.2 TF
T4_16GB = GPU(
    "T4",
    65 * TFLOPS,
    16 * GB,
    320 * GB,
    sm_count=40,
    clock_hz=1.59e9,
    fp32_flops_per_s=8.1 * TFLOPS,
    **_MEASURED_H100,
)  # NVIDIA T4 datasheet: FP16 tensor 65 TF (mixed precision), FP32 8.1 TF, 320 GB/s GDDR6, 16 GB; Turing TU104
# (Turing whitepaper): 40 SMs x 8 tensor cores x 128 FLOPs/clock at 1590 MHz boost = 65.1 TF; its 70 W cap
# throttles the clock under sustained load, which this peak does not model
A100_80GB = GPU(
    "A100-SXM4-80GB",
    312 * TFLOPS,
    80 * GB,
    2039 * GB,
    sm_count=108,
    clock_hz=1.41e9,
    fp32_flops_per_s=19.5 * TFLOPS,
    **_MEASURED_H100,
)  # A100 datasheet: BF16 312 TF dense, FP32 19.5 TF, 2039 GB/s; Ampere GA100 whitepaper: 108 SMs, 1410 MHz boost
H100_80GB = GPU(
    "H100-SXM5-80GB",
    989 * TFLOPS,
    80 * GB,
    3350 * GB,
    sm_count=132,
    clock_hz=1.83e9,
    fp32_flops_per_s=67 * TFLOPS,
    fp8_flops_per_s=1979 * TFLOPS,
    **_MEASURED_H100,
)  # H100 datasheet: BF16 989 TF dense, FP8 1979 TF dense (3958 with sparsity), FP32 67 TF, 3.35 TB/s; Hopper
# whitepaper: 132 SMs (SXM5), 4 tensor cores x 1024 dense FP16 FLOPs/clock per SM, so 989 TF at 1830 MHz; micro.log's
# device reports 132 SMs and a 50 MB L2
H200 = GPU(
    "H200-SXM-141GB",
    989 * TFLOPS,
    141 * GB,
    4800 * GB,
    sm_count=132,
    clock_hz=1.83e9,
    fp32_flops_per_s=67 * TFLOPS,
    fp8_flops_per_s=1979 * TFLOPS,
    **_MEASURED_H100,
)  # H200 datasheet: the H100's Hopper GH100 (the same BF16 989 / FP8 1979 TF dense, FP32 67 TF, 132 SMs) with
# 141 GB of HBM3e at 4.8 TB/s; the kernel model's measured figures are the H100's (shared/evidence/h200-2026-11-26 ran
# this GPU with the H100's bandwidth, which this preset corrects)

CPU_CORE = GPU(
    "x86 CPU core (1 thread)",
    134e9,
    10 * GB,
    16 * GB,
    compute_efficiency=0.8,
    kernel_overhead_s=30e-6,
    kernel_latency_s=3.5e-6,
)  # measured on the development VM: fp32 matmul 134 GFLOP/s and copy 16 GB/s on one thread; an eager PyTorch op on a
# tiny tensor (add_) takes 3.5 us (torch 2.13, one thread); no SMs, so GEMMs and attention are rooflines
LOOPBACK = Link(2 * GB, 50e-6)  # gloo over loopback TCP (placeholder: the shipped CPU profile measures it)
VETH_1G = Link(1 * Gbit, 100e-6)  # veth pair shaped by tc tbf to 1 Gbit/s (distsim profile --link-bandwidth 1gbit)
CPU_SOURCE = (
    "this project's 2-core development VM emulating nodes with one rank per core (gloo); the inter-node link is a "
    "veth pair between network namespaces shaped to 1 Gbit/s with tc tbf; analytic figures measured with one thread "
    "(use the shipped CPU profile for real costs)"
)
PCIE4 = Link(24 * GB, 10e-6)  # PCIe 4.0 x16, ~24 GB/s achieved per direction (assumed)
IB_100G = Link(100 * Gbit, 5e-6)  # 100 Gb/s InfiniBand (assumed)
PCIE3 = Link(12 * GB, 10e-6)  # PCIe 3.0 x16, 15.75 GB/s raw, ~12 GB/s achieved per direction (assumed)
ETH_10G = Link(10 * Gbit, 10e-6)
# 10 Gigabit Ethernet: the IEEE 802.3ae line rate, 10 Gb/s. Latency 10 us: the upper end of the 5-10 us Mellanox quotes
# for commercially available 10GbE adapters without its RDMA offload (The Register, 2011-06-06, "Mellanox ConnectX-3
# chip", p. 2); MPI over the host's TCP stack adds its own per-message cost, so this is a lower bound there
IB_FDR = Link(14.0625 * 4 * 64 / 66 * Gbit, 1e-6)
# FDR InfiniBand 4x ("56 Gb/s"): 4 lanes x 14.0625 Gb/s signalling with 64b/66b encoding = 54.5 Gb/s of data
# (InfiniBand Architecture Specification Vol. 2, release 1.3); latency 1 us: Mellanox ConnectX-3 (the FDR adapter of
# its generation), product brief "1us MPI ping latency"
IB_MTU_BYTES = 4096
"""Payload of a full InfiniBand packet at the 4 KiB MTU that NCCL's IB transport and ConnectX adapters use."""
IB_HEADER_BYTES = 8 + 12 + 4 + 2
"""Bytes every InfiniBand packet adds to its payload on the wire: local route header 8, base transport header 12,
invariant CRC 4, variant CRC 2 (InfiniBand Architecture Specification Vol. 1, ch. 5 "Data packet format"; an RDMA
write's extended header, 16 B, rides its first packet only)."""
IB_PAYLOAD = IB_MTU_BYTES / (IB_MTU_BYTES + IB_HEADER_BYTES)
"""Share of an InfiniBand link's data rate that carries payload: 4096 / 4122 = 0.9937. HDR's and NDR's 200 and
400 Gb/s are already data rates (after line encoding, 64b/66b with forward error correction), unlike FDR's "56"
(see :data:`IB_FDR`); NCCL's Simple protocol, which it runs for large messages, adds no inline flags (its LL and LL128
protocols carry 50 % and 120/128 of payload, for small messages). The NIC's PCIe Gen4/Gen5 x16 slot (31.5 / 63 GB/s
after 128b/130b, about 0.91 of that after TLP headers at 256-byte payloads) does not bind at 25 / 50 GB/s."""
NVLINK_PAYLOAD = 256 / (256 + 16)
"""Share of an NVLink's data rate that carries payload: a packet is one 16-byte header flit (command, address,
CRC) and at most 256 bytes of data flits (Foley and Danskin, "Ultra-Performance Pascal GPU and NVLink Interconnect",
IEEE Micro 2017: 128-bit flits, a header flit per packet, data payloads of up to 256 bytes); 0.941. Smaller writes
carry less (assumed: NCCL's copies move full packets)."""

NVLINK4 = Link(450 * GB * NVLINK_PAYLOAD, 3e-6)
"""One GPU's NVLink4 through NVSwitch (DGX H100/H200): 450 GB/s per direction at its payload rate."""
IB_NDR = Link(400 * Gbit * IB_PAYLOAD, 5e-6)
"""One 400 Gb/s NDR InfiniBand NIC (DGX H100/H200) at its payload rate."""

MGWFBP_SOURCE = (
    "MG-WFBP (Shi et al., TPDS 2020) evaluates on V100 clusters joined by 10GbE and 56 Gb/s InfiniBand; modelled "
    "here as one V100 per node (every all-reduce crosses the network, one worker per node as in its cost model); "
    "GPU figures of the V100-SXM2 datasheet (which V100 variant the paper's nodes had is not modelled); link figures "
    "from the standard and a vendor latency, not fitted to the paper's measurements"
)

_PRESETS: dict[str, Cluster] = {
    "distsim-testbed": Cluster(
        "distsim-testbed",
        4,
        4,
        A40,
        PCIE4,
        IB_100G,
        1,
        source="DistSim (CF'23) Sec. 5.1: 16 A40 on 4 servers; links not stated: PCIe 4.0 and 100 Gb/s IB assumed",
    ),
    "distsim-a10": Cluster(
        "distsim-a10",
        4,
        4,
        A10,
        PCIE4,
        IB_100G,
        1,
        source="DistSim (CF'23) Sec. 6: 16 A10 on 4 nodes; links not stated: PCIe 4.0 and 100 Gb/s IB assumed",
    ),
    "dapple-a": Cluster(
        "dapple-a",
        2,
        8,
        V100_16GB,
        Link(130 * GB, 5e-6),
        Link(25 * Gbit, 20e-6),
        1,
        source="DAPPLE (PPoPP'21) Table III config A: 8x V100 NVLink per server (up to 130 GB/s, Sec. V-D), 25 Gb/s",
    ),
    "dapple-b": Cluster(
        "dapple-b",
        16,
        1,
        V100_16GB,
        Link(130 * GB, 5e-6),
        Link(25 * Gbit, 20e-6),
        1,
        source="DAPPLE (PPoPP'21) Table III config B: 1x V100 per server, 25 Gb/s Ethernet",
    ),
    "dapple-c": Cluster(
        "dapple-c",
        16,
        1,
        V100_16GB,
        Link(130 * GB, 5e-6),
        Link(10 * Gbit, 20e-6),
        1,
        source="DAPPLE (PPoPP'21) Table III config C: 1x V100 per server, 10 Gb/s Ethernet",
    ),
    "v100-10gbe": Cluster(
        "v100-10gbe", 16, 1, V100_16GB, PCIE3, ETH_10G, 1, source=MGWFBP_SOURCE + "; 10 Gigabit Ethernet, 16 nodes"
    ),
    "v100-ib56": Cluster(
        "v100-ib56", 16, 1, V100_16GB, PCIE3, IB_FDR, 1, source=MGWFBP_SOURCE + "; FDR InfiniBand 4x, 16 nodes"
    ),
    "dgx-a100": Cluster(
        "dgx-a100",
        128,
        8,
        A100_80GB,
        Link(300 * GB * NVLINK_PAYLOAD, 3e-6),
        Link(200 * Gbit * IB_PAYLOAD, 5e-6),
        8,
        source="NVIDIA DGX A100 architecture: NVLink3 via NVSwitch 300 GB/s per direction, 8x 200 Gb/s HDR IB; "
        "links at their achievable payload rate (NVLink packet and IB packet headers: NVLINK_PAYLOAD, IB_PAYLOAD); "
        "128 nodes (1024 GPUs)",
    ),
    "dgx-h200": Cluster(
        "dgx-h200",
        128,
        8,
        H200,
        NVLINK4,
        IB_NDR,
        8,
        source="NVIDIA DGX H200: 8x H200 with NVLink4 via NVSwitch 450 GB/s per direction, 8x 400 Gb/s NDR IB "
        "(as DGX H100); links at their achievable payload rate; 128 nodes",
    ),
    "dgx-h100": Cluster(
        "dgx-h100",
        128,
        8,
        H100_80GB,
        NVLINK4,
        IB_NDR,
        8,
        source="NVIDIA DGX H100: NVLink4 via NVSwitch 450 GB/s per direction, 8x 400 Gb/s NDR IB; links at their "
        "achievable payload rate (NVLink packet and IB packet headers: NVLINK_PAYLOAD, IB_PAYLOAD); 128 nodes",
    ),
    "cpu-1x2": Cluster("cpu-1x2", 1, 2, CPU_CORE, LOOPBACK, VETH_1G, 1, source=CPU_SOURCE + "; one node, two ranks"),
    "cpu-2x1": Cluster("cpu-2x1", 2, 1, CPU_CORE, LOOPBACK, VETH_1G, 1, source=CPU_SOURCE + "; two nodes, a rank each"),
}
PRESETS = MappingProxyType(_PRESETS)


def get_cluster(name: str) -> Cluster:
    """A built-in cluster by name."""
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise UnknownNameError(f"unknown cluster {name!r}{suggest(name, list(PRESETS))}") from None


_GPUS: dict[str, GPU] = {}
GPUS = MappingProxyType(_GPUS)
"""GPU types by short name (``distsim search elastic --gpus V100:4,T4:8``), read live: :func:`register_gpu` adds
one."""


def register_gpu(name: str, gpu: GPU) -> GPU:
    """Add (or replace) the GPU type `name` (names are matched case-insensitively: one that differs from a known
    name only in case replaces it). A name is what ``TYPE:COUNT`` lists give: no ':' or ','."""
    key = name.strip()
    if not key or ":" in key or "," in key:
        raise ClusterError(f"a GPU type name must be non-empty, without ':' or ',', got {name!r}")
    for known in [k for k in _GPUS if k.upper() == key.upper()]:
        del _GPUS[known]
    _GPUS[key] = gpu
    return gpu


def unregister_gpu(name: str) -> None:
    """Remove the GPU type `name` (a test's or plugin's); an unknown name is one line."""
    del _GPUS[gpu_type(name)[0]]


def gpu_type_names() -> tuple[str, ...]:
    return tuple(_GPUS)


for _name, _gpu in (("A10", A10), ("A40", A40), ("A100", A100_80GB), ("H100", H100_80GB), ("H200", H200),
                    ("P100", P100_16GB), ("T4", T4_16GB), ("V100", V100_32GB), ("V100-16GB", V100_16GB)):  # fmt: skip
    register_gpu(_name, _gpu)
del _name, _gpu


def gpu_type(name: str) -> tuple[str, GPU]:
    """A registered GPU type by short name, case-insensitive: (its canonical name, the GPU)."""
    key = name.strip().upper()
    canonical = {k.upper(): k for k in GPUS}
    if key in canonical:
        return canonical[key], GPUS[canonical[key]]
    import difflib

    close = difflib.get_close_matches(key, list(canonical), n=1, cutoff=0.6)
    hint = f" (did you mean {canonical[close[0]]!r}?)" if close else f"; known: {', '.join(GPUS)}"
    raise UnknownNameError(f"unknown GPU type {name!r}{hint}")
