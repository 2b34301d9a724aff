"""Hardware profiles for the time model: every constant with its source, datasheet or calibrated."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from harness.config.schema import DEFAULT_ATTENTION_KERNEL
from harness.plan.peak import peak_flops
from harness.rundir.writer import write_text

GB = 1e9
US = 1e-6
# The fused attention kernels' backward runs 5 matmuls to the forward's 2 (Dao 2023, FlashAttention-2 sec. 3.1).
ATTENTION_BACKWARD_FLOPS_RATIO = 2.5


@dataclass(frozen=True, eq=False)  # hashed by identity: the time model memoises on it
class HardwareProfile:
    """What one accelerator, its node and its network can do; rates in bytes/s, FLOP/s and seconds."""

    name: str
    matmul_efficiency: float  # maximum achievable matmul FLOP/s / dense datasheet peak
    # attention kernel FLOP/s as a fraction of the dense peak, per attn_implementation
    attention_efficiency_sdpa: float
    attention_efficiency_flash: float
    memory_bandwidth: float  # device memory, bytes/s
    memory_efficiency: float  # achievable fraction of it for streaming kernels
    op_latency_s: float  # time one kernel or eager op costs whatever its size (launch, dispatch)
    gpus_per_node: int
    intra_node_bandwidth: float  # collective bus bandwidth per rank within a node, bytes/s
    inter_node_bandwidth: float  # per rank across nodes (one NIC per GPU)
    collective_base_latency_s: float  # fixed cost of one collective call
    intra_step_latency_s: float  # per algorithm step within a node
    inter_step_latency_s: float  # per algorithm step across nodes
    low_latency_protocol: bool  # NCCL's LL / LL128 protocols (NCCL_PROTOCOL_LIMITS) beside Simple
    overlaps_comm: bool  # communication runs beside compute (GPU copy engines / NCCL SMs)
    host_link_bandwidth: float  # device <-> host copies per rank (PCIe), bytes/s
    cpu_adam_params_per_s: float  # parameters per second one rank's CPU Adam updates
    nvme_bandwidth: float  # bytes/s one rank reads or writes its NVMe swap files
    # attention backward time / forward time: fused kernels recompute the scores, 5 matmuls against the
    # forward's 2 (Dao 2023, FlashAttention-2 sec. 3.1) at the forward's rate on GPUs; measured on CPUs,
    # whose SDPA backward runs far below its forward rate
    attention_backward_ratio: float = ATTENTION_BACKWARD_FLOPS_RATIO
    # A fused attention kernel's rate by shape (compute_time.attention_kernel_efficiency): the attention efficiencies
    # above hold at head dim 128 as the sequence grows; at head dim 64 the rate is this fraction of it, and at
    # sequence length T it is 1 / (1 + attention_half_rate_tokens / T) of it (1.0 / 0: no shape dependence).
    attention_small_head_ratio: float = 1.0
    attention_half_rate_tokens: float = 0.0
    # The head dims the fused kernel is built for: a head dim between two runs the larger one's kernel on
    # zero-padded q, k and v (compute_time.kernel_head_dim); empty: any head dim runs as itself.
    attention_head_dims: Tuple[int, ...] = ()
    # the kernel runs behind flash-attn's bert_padding unpad / pad (compute_time.unpad_pad_time; MPT's attn_impl=flash)
    attention_unpad: bool = False
    # fixed seconds per (sequence, head) of a fused attention call, forward and backward (0: FLOPs dominate)
    attention_head_latency_s: float = 0.0
    attention_backward_head_latency_s: float = 0.0
    # Measured per collective kind: (latency per algorithm step, bus bandwidth). A library's algorithms differ
    # by kind (gloo reduce-scatters through an all-reduce); empty: the NCCL model above for every kind.
    collective_links: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    # Cores the ranks of one node share (CPU ranks time-slice them); 0: every rank has its own device.
    cores_per_node: int = 0
    # Per engine, what its measured steps took over the model's prediction: {engine: {"compute": f, "comm": g}},
    # written only by `harness tune` (harness.plan.engine_factors); none: 1.0 for every engine.
    engine_factors: Dict[str, Dict[str, float]] = field(default_factory=dict)
    # Each accelerator drives its own NIC (DGX / HGX rails): a ring across nodes crosses the network on as many NICs
    # per node as the group has ranks there (comm.bus_bandwidth); False: the node shares one link.
    nic_per_accelerator: bool = False
    # NVLink SHARP (NCCL's NVLS algorithm) reduces inside the NVSwitch: an all-reduce within a node of more than
    # four ranks runs faster than its ring (NVLS_ALL_REDUCE_GAIN).
    nvlink_sharp: bool = False
    sm_count: int = 0  # streaming multiprocessors (GPUs): what an overlapped collective's CTAs take a share of
    # A GEMM's rate beyond its waves falls with its smallest dimension d as d / (d + gemm_half_rate_dim)
    # (compute_time.gemm_time); 0: no such fall (not measured on this accelerator)
    gemm_half_rate_dim: float = 0.0
    # Seconds the host takes to dispatch one eager aten op with autograd (a forward op or a backward node) while
    # an accelerator runs the kernels (host_work.dispatch_s): what bounds a step whose kernels are shorter than
    # their dispatch. 0: the host is the device (CPU profiles, whose op_latency_s is on the critical path).
    host_op_latency_s: float = 0.0
    # Share of the time one rank stalls on its own (its host's garbage collector, OS noise), holding up every rank
    # that waits for it at each layer (time_model.straggler_stretch); 0: not modelled (CPU profiles measure the
    # wait for a core instead).
    rank_stall_share: float = 0.0
    measured_peak_flops: Optional[float] = None  # CPU: the measured matmul peak stands in for a datasheet
    source: str = "datasheet"
    version: int = 0  # PROFILE_VERSION of the calibration that wrote it; datasheet rows carry none

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


# One table, one citation per constant.
#   MAMF: stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison
#         table" (BF16): A100 SXM 271.2/312 = 86.9%, H100 SXM 794.5/989 = 80.3%, GH200 828.6/989 = 83.6%,
#         MI300X 781.9/1300 = 60.1%.
#   Attention: FlashAttention-2's forward + backward benchmarks (Dao-AILab/flash-attention, assets/
#         flash2_a100_fwd_bwd_benchmark.png and flash2_h100_fwd_bwd_benchmark.png; batch x seqlen 16k tokens,
#         causal, TFLOP/s counting the causal half) fit rate(T) = R_d / (1 + T0 / T) within 2% at every point from
#         T = 512 to 16k: A100 causal head dim 128: R = 194 TFLOP/s (62.2% of 312), T0 = 484; head dim 64: R = 176
#         (0.91 of it), T0 = 505. H100 causal head dim 128: R = 334 (33.8% of 989), T0 = 532; head dim 64: R = 293
#         (0.88), T0 = 546 (Shah et al. 2024, FlashAttention-3, sec. 1: "FlashAttention-2 achieves only 35%
#         utilization on H100"). T0 ~ 500 is a fixed cost per query block (the diagonal block of the causal mask,
#         the softmax rescale and output write) that long sequences amortise. attn_implementation flash_attention_2
#         and torch SDPA both run FA2 kernels. H200 computes as H100.
#   Attention head dims: a fused kernel is compiled for a few head dims and runs a head dim between two as the
#         larger (zero-padded: its time is the larger's, its useful FLOPs the head dim's). FlashAttention-2 (and
#         torch SDPA's copy of it): 32 / 64 / 96 / 128 / 160 / 192 / 256, some releases 224 too (flash-attn
#         csrc/flash_attn/src/static_switch.h, HEADDIM_SWITCH: "if (HEADDIM <= 32) ... else if (HEADDIM <= 64)
#         ..."); FlashAttention v1: 32 / 64 / 128 (flash-attn 1.x csrc/flash_attn/fmha_api.cpp, run_fmha_fwd: d <= 32,
#         <= 64, <= 128); its Triton port: powers of two from 16 (flash_attn_triton.py: BLOCK_HEADDIM =
#         max(next_power_of_2(d), 16), d <= 128). Phi-2's head dim 80 runs FA2's 96 kernel, FA1's 128.
#   FlashAttention v1 (cluster.attention_kernel=flash_attention_1): the same two charts' FlashAttention bars
#         (orange), causal, T = 512 / 1k / 2k / 4k / 8k / 16k. A100 head dim 128: 55 / 62 / 69 / 76 / 80 / 83
#         TFLOP/s, head dim 64: 58 / 70 / 77 / 87 / 92 / 97; H100 head dim 128: 98 / 109 / 108 / 126 / 135 / 137,
#         head dim 64: 104 / 123 / 136 / 138 / 149 / 156. Fit with one T0 per chip (the mean of the two head
#         dims' own fits), R_d by least relative error: A100 R = 82.7 (26.5% of 312), head dim 64 1.136 of it,
#         T0 = 311 (within 7% at every bar); H100 R = 134.1 (13.56% of 989), head dim 64 1.132, T0 = 228
#         (within 4.2% at head dim 64; 12% at the head dim 128 2k bar, which lies below its 1k neighbour's
#         trend). FA1 runs head dim 64 faster than 128, and never reached Hopper's tensor-core rate. The A100
#         chart's FlashAttention Triton bars (red; the Triton kernel MPT's attn_impl=triton ports) are 1-6%
#         below this fit at causal head dim 128 (50 / 61 / 68 / 74 / 78 / 80): the fit stands for both.
#   GEMM waves: an output of ceil(m/Tm) x ceil(n/Tn) tiles (x the split-K factor) runs in waves of one thread
#         block per SM, each wave costing as much full or not, a partial tile as much as a whole one (NVIDIA,
#         "Matrix Multiplication Background User's Guide", "Tile quantization" and "Wave quantization";
#         stas00/ml-engineering training/performance/README.md, "Tile and wave quantization": time ~
#         ceil(blocks / SMs)). GEMM_TILES: the 256x128 / 128x256 / 128x128 tiles the guide names for large
#         bf16 GEMMs; SPLIT_K: the reduction split among 2-8 blocks when the tiles are too few, keeping at least
#         SPLIT_K_MIN_DEPTH of it per block. SMs: A100 108, H100 / H200 132 (NVIDIA's architecture
#         whitepapers; the same README). The MAMF efficiency above is a full-wave GEMM's.
#   GEMM shape: one H200 (tests/data/gpu_components_h200.json: `make gpu-check`'s components stage, 2026-11-27,
#         torch 2.11.0+cu130), 102 bf16 products at Llama-3.1-8B / 70B layer shapes (4k / 8k tokens, tp 1 and 8; the
#         forward, input- and weight-gradient orientations): 167-814 TFLOP/s. The wave model alone predicted them a
#         median 25% fast (11% where every dimension is >= 4096, 47% where one is <= 1024: grouped k/v projections
#         and tp 8 shards). A rate falling with the smallest dimension d as d / (d + D) fits them with D = 320, the
#         least squares of log(measured / predicted) (mean square 0.0144, from 0.0885 without it). Hopper's SMs and
#         tiles are the H100's too: the same D there; A100 and MI300X are not measured (no fall).
#   HBM: A100 80GB datasheet 2,039 GB/s; H100 SXM datasheet 3.35 TB/s; H200 datasheet 4.8 TB/s; MI300X data
#         sheet 5.3 TB/s. Achievable streaming fraction ~90% (NVIDIA's BabelStream-class copy results; the
#         ml-engineering "memory bandwidth" section quotes 85-92%).
#   NCCL: latencies of NCCL's tuning model (src/graph/tuning.cc, ncclTunerConstantsDefaults, as mirrored by
#         torch/_inductor/comm_analysis.py): Ring/Simple base 8.4 us, per step NVLink 3.4 us, network 14 us.
#   Bus bandwidth: nccl-tests all_reduce_perf on DGX H100 reaches ~480 GB/s busbw over NVLink 4 (NVIDIA DGX
#         H100 user guide / NCCL release notes); torch comm_analysis uses 370 GB/s (Hopper) NVLink, 50 GB/s
#         (NDR 400G) and 25 GB/s (HDR 200G) per GPU across nodes. Ampere: 233 GB/s, the all-reduce bus bandwidth
#         FlagPerf measured on one DGX A100 (A100 40GB SXM) at 4 GiB: 232.3 GB/s with ncclAllReduce and 233.9 GB/s
#         with torch.distributed (FlagOpen/FlagPerf, base/toolkits/ and base/benchmarks/
#         interconnect-MPI_intraserver/nvidia/A100/README.md: 464.65 / 467.87 GB/s, which their code doubles to
#         count both directions); torch comm_analysis's 240 GB/s is 3% above both.
#   Across nodes: NCCL's rings (and trees) open several channels whose node crossings fall on different
#         accelerators, so every NIC of the node is busy at once: the bus bandwidth of a collective over g ranks
#         per node is g x the per-NIC rate (stas00/ml-engineering, network/README.md, "Inter-node speed depends on
#         intra-node speed": 4 nodes of 8 accelerators with 8 x 50 GB/s NICs reach 362 GB/s busbw at 1 GiB and
#         382 GB/s at 16 GiB, against 400 GB/s of NICs: NIC_EFFICIENCY 0.9), capped by the node's own links.
#         NDR 400G: 50 GB/s per NIC (H100 / H200 / MI300X nodes), HDR 200G: 25 GB/s (A100).
#   NVLS: the same README, "SHARP": 8x H200 all-reduce at 8 GiB, NVLS over ring busbw 1.14 / 1.19 / 1.26 / 1.29 at
#         5 / 6 / 7 / 8 GPUs (ring 363-366 GB/s whatever the count, matching the 370 GB/s above; NCCL keeps the
#         ring at 4 GPUs and fewer). NVSwitch nodes of Hopper only (A100's NVSwitch has no SHARP).
#   Overlap: NCCL launches one CTA per channel and keeps its SM to itself (NVIDIA/nccl#689, sjeaugey: "NCCL
#         CTAs won't share an SM with compute kernels"); DGX A100 all-reduce runs 24 CTAs, 2 per NVLink
#         (NVIDIA/nccl#1225, #1703), and an H100 all-gather beside a GEMM launches 24 blocks (NVIDIA developer forum,
#         "Compute-communication overlap causes severe GEMM performance degradation because of tail effect"):
#         NCCL_COLLECTIVE_CTAS 24 of the SM count (A100 108, H100 / H200 132: NVIDIA's architecture whitepapers;
#         MI300X 304 CUs, with RCCL's own channel count unknown here: left at none). A send / receive to a
#         peer on another node runs NCCL_NCHANNELS_PER_NET_PEER channels, "typically 2" (NVIDIA/nccl#1424):
#         NCCL_P2P_CTAS 2.
#   Host dispatch: the host of `make gpu-check`'s H200 machine (tests/data/gpu_host_h200.json, 2026-11-27, Intel Xeon,
#         16 cores, torch 2.11.0+cu130; tools/gpu_host_overhead.py): a chain of y * 1.0001 on CUDA tensors with
#         autograd costs 14.7 us a dispatched op (forward op or backward node; 11.3 us without autograd). The GPU
#         profiles take it as their host's rate: it is the host CPU's, not the accelerator's.
#   Host link: PCIe Gen5 x16 64 GB/s (Gen4 32 GB/s) per direction, ~80% achievable in pinned copies.
#   CPU Adam: DeepSpeed ZeRO-Offload (Ren et al. 2021, table 2): CPU-Adam updates 1B parameters in 0.22 s
#         on a 2x20-core host, 4.5e9 params/s per host, shared by 8 ranks -> 5.6e8 per rank.
#   NVMe: ZeRO-Infinity (Rajbhandari et al. 2021, sec. 7): ~25 GB/s read per DGX-2 node over 8 ranks (3.1 GB/s each).
FA2_HEAD_DIMS, FA1_HEAD_DIMS, FA1_TRITON_HEAD_DIMS = (32, 64, 96, 128, 160, 192, 256), (32, 64, 128), (16, 32, 64, 128)
_A100 = dict(sm_count=108, attention_small_head_ratio=0.91, attention_half_rate_tokens=495,
             attention_head_dims=FA2_HEAD_DIMS)
_H100 = dict(sm_count=132, attention_small_head_ratio=0.88, attention_half_rate_tokens=540, gemm_half_rate_dim=320,
             attention_head_dims=FA2_HEAD_DIMS)
_A100_FA2, _H100_FA2 = 0.622, 0.338  # FlashAttention-2's forward + backward rate over the dense peak ("Attention")
# An attention kernel generation's rates per accelerator, replacing the profile's own (FlashAttention-2's, the
# default kernel, which needs no entry); an accelerator missing from a kernel's row has no measured rate for it.
# A kernel whose backward runs below its forward's rate (ATTENTION_BACKWARD_FLOPS_RATIO, above HardwareProfile)
# spends more than 2.5 / 3.5 of its time there, which is what checkpointing does not repeat (a recompute reruns
# the forward only).
# FlashAttention v1 on A100: the forward "reaches 30-50% of the theoretical maximum FLOPs/s", the backward "25-35%"
# (Dao 2023, FlashAttention-2, sec. 1): the midpoints. MPT's Triton port is no nearer its forward's rate
# (flash_attn/flash_attn_triton.py: "Triton forward is generally faster than CUDA forward, while Triton backward
# is generally slower than CUDA backward").
FA1_FORWARD_UTILISATION, FA1_BACKWARD_UTILISATION = 0.40, 0.30
# FlashAttention v1's fits ("FlashAttention v1" above): forward + backward rate over the dense peak at head dim 128,
# head dim 64's rate over it, per-query-block tokens T0
_A100_FA1_FIT, _H100_FA1_FIT = (0.265, 1.136, 311), (0.1356, 1.132, 228)


def forward_rate_of(combined_efficiency: float, backward_ratio: float) -> float:
    """A kernel's forward efficiency from its forward + backward one (the charts' TFLOP/s over 3.5 forwards of
    FLOPs) when its backward takes `backward_ratio` forwards of time: 3.5 F / R = (1 + b) F / R_fwd."""
    return combined_efficiency * (1.0 + backward_ratio) / (1.0 + ATTENTION_BACKWARD_FLOPS_RATIO)


def _fa1(combined_efficiency: float, small_head_ratio: float, half_rate_tokens: float,
         head_dims: Tuple[int, ...] = FA1_HEAD_DIMS) -> Dict[str, Any]:
    backward_ratio = ATTENTION_BACKWARD_FLOPS_RATIO * FA1_FORWARD_UTILISATION / FA1_BACKWARD_UTILISATION
    forward = forward_rate_of(combined_efficiency, backward_ratio)
    return dict(attention_efficiency_sdpa=forward, attention_efficiency_flash=forward,
                attention_backward_ratio=backward_ratio, attention_small_head_ratio=small_head_ratio,
                attention_half_rate_tokens=half_rate_tokens, attention_head_dims=head_dims)


_A100_FA1, _H100_FA1 = _fa1(*_A100_FA1_FIT), _fa1(*_H100_FA1_FIT)
# FlashAttention v1's Triton port runs head dim 128 at the CUDA kernel's head dim 64 rate: the port was made to
# "make the backward for d=128 much faster by reducing register spilling" (flash_attn_triton.py), and llm-foundry's
# A100 rows (MPT, attn_impl=triton; tests/data/llm_foundry_a100_*.csv) whose attention is over 60% of the predicted
# step agree with it: head dim 64 runs within 3% of the CUDA fit's rate (mpt-125m / 350m, 16k-64k tokens), head dim
# 128 1.12-1.18 x faster than its head dim 128 rate (mpt-760m / 1b / 3b, 16k-32k), where 1.136 is the hd64 / hd128
# ratio. No fitted number: the CUDA kernel's own fit, its head dim 64 rate at both. Across chips the port scales as
# FlashAttention-2 does (H100 / A100 = 334 / 194 TFLOP/s, the charts above), not as FA1 (1.62): its forward runs
# one program per query block looping over the keys (flash_attn_triton.py's launch grid, seqlen_q / BLOCK_M x
# batch x heads), FA2's partitioning (Dao 2023, sec. 3.2), where FA1 looped over key blocks outside.
_A100_FA1_TRITON_EFFICIENCY = _A100_FA1_FIT[0] * _A100_FA1_FIT[1]
_A100_FA1_TRITON = _fa1(_A100_FA1_TRITON_EFFICIENCY, 1.0, _A100_FA1_FIT[2], FA1_TRITON_HEAD_DIMS)
# the rate in TFLOP/s times FA2's H100 / A100 TFLOP/s, over the H100's peak: the peaks cancel
_H100_FA1_TRITON = _fa1(_A100_FA1_TRITON_EFFICIENCY * _H100_FA2 / _A100_FA2, 1.0, _H100_FA1_FIT[2],
                        FA1_TRITON_HEAD_DIMS)
ATTENTION_KERNEL_RATES: Dict[str, Dict[str, Dict[str, Any]]] = {
    "flash_attention_1": {"a100_sxm": _A100_FA1, "a100_sxm_40gb": _A100_FA1, "h100_sxm": _H100_FA1,
                          "h200": _H100_FA1},
    "flash_attention_1_triton": {"a100_sxm": _A100_FA1_TRITON, "a100_sxm_40gb": _A100_FA1_TRITON,
                                 "h100_sxm": _H100_FA1_TRITON, "h200": _H100_FA1_TRITON},
    # FA2's own rates (the profiles'), its inputs and output copied around it (compute_time.UNPAD_PAD)
    "flash_attention_2_unpadded": {name: {"attention_unpad": True}
                                   for name in ("a100_sxm", "a100_sxm_40gb", "h100_sxm", "h200")},
}
# NCCL's ring protocols beside Simple (src/graph/tuning.cc, ncclTunerConstantsDefaults and ncclTopoTuneModel, NCCL
# 2.30): (base latency, step latency over NVLink, over the network, bus bandwidth factor). LL sends an 8-byte flag
# with every 8 bytes (x 0.5) and its bus bandwidth is capped at llMaxBws: by GPU generation within a node (Ampere
# 87.7 GB/s, Hopper 141), by the host's CPU vendor across nodes (Intel: 39.0 over two nodes, 20.4 over more; AMD:
# 22.5 / 19.0); NCCL 2.18, which the 2024 tables ran, capped it harder (a quarter of the bus bandwidth across nodes,
# 87.7 GB/s within a Hopper node: LL128 takes over from about 2 MB instead of 4.5 MB in a node). LL128 sends 120
# of every 128 bytes (x 0.92; its per-channel cap, 20 GB/s Ampere and 36.7 Hopper, exceeds the links at
# NCCL_COLLECTIVE_CTAS channels) and is on by default on NVLink nodes of Ampere and Hopper only. Across nodes a
# ring's NVLink steps cost at least the network post overhead, 1 us on Intel and 2 on AMD hosts (getNetOverhead;
# x 3 for Simple, under its 3.4 us). Hosts: DGX A100, 2x AMD EPYC 7742; DGX H100 / H200, 2x Intel Xeon 8480C
# (NVIDIA DGX user guides).
NCCL_SIMPLE = (8.4 * US, 3.4 * US, 14.0 * US, 1.0)  # the profiles' own collective latencies below
NCCL_LL = (6.6 * US, 0.6 * US, 2.7 * US, 0.5)
NCCL_LL128 = (14.0 * US, 1.9 * US, 4.0 * US, 0.92)
_LL_MAX_INTEL, _LL_MAX_AMD = (39.0 * GB, 20.4 * GB), (22.5 * GB, 19.0 * GB)  # over two nodes, over more
NCCL_PROTOCOL_LIMITS = {  # accelerator: (LL cap within a node, LL caps across nodes, net post overhead, LL128 on)
    "a100_sxm": (87.7 * GB, _LL_MAX_AMD, 2.0 * US, True),
    "a100_sxm_40gb": (87.7 * GB, _LL_MAX_AMD, 2.0 * US, True),
    "h100_sxm": (141.0 * GB, _LL_MAX_INTEL, 1.0 * US, True),
    "h200": (141.0 * GB, _LL_MAX_INTEL, 1.0 * US, True),
}
# Stragglers: synchronous training moves at the pace of its slowest rank at every collective the compute waits
#         for, so a rank's private stall (a garbage-collector pass, OS noise) holds up every rank it meets there,
#         and the loss grows with their number (Petrini et al. 2003, "The Case of the Missing Supercomputer
#         Performance", SC'03: noise amplification). Megatron-LM's --manual-gc ("helps to align the timing of the
#         collection across ranks which mitigates the impact of CPU-associated jitters") and torchtitan's gc_freq
#         (pytorch/torchtitan#148: about 1.5% per step on 512 GPUs of FSDP from aligned collection alone) exist
#         for it. RANK_STALL_SHARE is the median, over the 17 groups of FSDP rows that differ only in their GPU
#         count in the llm-foundry tables (tests/data/llm_foundry_*.csv; from 8-128 to 64-512 GPUs), of the
#         per-rank share that turns the model's tokens/s per GPU ratio between a group's ends into the measured
#         one, the model run without it (from 2.0e-5 to 7.0e-4, and -2.0e-3 where the A100 40GB 1b row at 32
#         GPUs lies 20% below its 64- and 128-GPU neighbours). 2.2e-4 of the time: an 11 ms stall every 50 s.
#         tests/unit/plan/test_published_throughput.py checks that it still explains them.
RANK_STALL_SHARE = 2.2e-4
GEMM_TILES = ((128, 256), (256, 128), (128, 128))
SPLIT_K = (1, 2, 4, 8)
SPLIT_K_MIN_DEPTH = 1024
NCCL_COLLECTIVE_CTAS = 24
NCCL_P2P_CTAS = 2
NIC_EFFICIENCY = 0.9
NVLS_ALL_REDUCE_GAIN = {5: 1.14, 6: 1.19, 7: 1.26, 8: 1.29}
_NVIDIA_NCCL = dict(nic_per_accelerator=True, collective_base_latency_s=NCCL_SIMPLE[0],
                    intra_step_latency_s=NCCL_SIMPLE[1], inter_step_latency_s=NCCL_SIMPLE[2], low_latency_protocol=True,
                    overlaps_comm=True, op_latency_s=4 * US, cpu_adam_params_per_s=5.6e8, nvme_bandwidth=3.1 * GB,
                    host_op_latency_s=14.7 * US, rank_stall_share=RANK_STALL_SHARE)
HARDWARE: Dict[str, HardwareProfile] = {
    "a100_sxm": HardwareProfile("a100_sxm", 0.869, _A100_FA2, _A100_FA2, 2039 * GB, 0.90, gpus_per_node=8,
                                intra_node_bandwidth=233 * GB, inter_node_bandwidth=25 * GB,
                                host_link_bandwidth=25 * GB, **_A100, **_NVIDIA_NCCL),
    "a100_sxm_40gb": HardwareProfile("a100_sxm_40gb", 0.869, _A100_FA2, _A100_FA2, 1555 * GB, 0.90, gpus_per_node=8,
                                     intra_node_bandwidth=233 * GB, inter_node_bandwidth=25 * GB,
                                     host_link_bandwidth=25 * GB, **_A100, **_NVIDIA_NCCL),
    "h100_sxm": HardwareProfile("h100_sxm", 0.803, _H100_FA2, _H100_FA2, 3350 * GB, 0.90, gpus_per_node=8,
                                intra_node_bandwidth=370 * GB, inter_node_bandwidth=50 * GB,
                                host_link_bandwidth=51 * GB, nvlink_sharp=True, **_H100, **_NVIDIA_NCCL),
    "h200": HardwareProfile("h200", 0.836, _H100_FA2, _H100_FA2, 4800 * GB, 0.90, gpus_per_node=8,
                            intra_node_bandwidth=370 * GB, inter_node_bandwidth=50 * GB,
                            host_link_bandwidth=51 * GB, nvlink_sharp=True, **_H100, **_NVIDIA_NCCL),
    "mi300x": HardwareProfile("mi300x", 0.601, 0.30, 0.30, 5300 * GB, 0.85, gpus_per_node=8,
                              intra_node_bandwidth=300 * GB, inter_node_bandwidth=50 * GB,
                              host_link_bandwidth=51 * GB, **_NVIDIA_NCCL),
}

# Bumped when calibration measures something new: an older cached file is measured again, not used.
PROFILE_VERSION = 5  # 5: timings less the calibrating thread's wait for a core

# Where a profile measured on this host is cached (written by `harness calibrate`, read by the planner).
PROFILE_DIR = Path.home() / ".cache" / "harness" / "profiles"


def profile_path(name: str) -> Path:
    """The cached calibration of a cluster or host `name`."""
    return PROFILE_DIR / f"{name}.json"


def save_profile(profile: HardwareProfile, path: Optional[Path] = None, raw: Optional[Dict[str, Any]] = None) -> Path:
    """Write a calibrated profile as JSON, with the measurements it came from under "raw" (one atomic rename)."""
    path = Path(path) if path else profile_path(profile.name)
    return write_text(path, json.dumps({**profile.to_dict(), **({"raw": raw} if raw is not None else {})}, indent=2))


def load_profile(path: Path) -> Optional[HardwareProfile]:
    """A profile file, or None when it is missing, does not hold every field or was measured by an older
    calibration (its `version` below PROFILE_VERSION)."""
    try:
        data = json.loads(Path(path).read_text())
        known = {f.name for f in fields(HardwareProfile)}
        profile = HardwareProfile(**{k: v for k, v in data.items() if k in known})
    except (OSError, ValueError, TypeError):
        return None
    return profile if profile.version >= PROFILE_VERSION else None


_LOADED: Dict[str, Optional[HardwareProfile]] = {}


def _calibrated(path: str) -> Optional[HardwareProfile]:
    """A profile file, read once per process once it is there (a missing one is looked for again: a
    calibration may write it meanwhile)."""
    if _LOADED.get(path) is None:
        _LOADED[path] = load_profile(Path(path))
    return _LOADED[path]


def hardware_profile(cluster: Any) -> Optional[HardwareProfile]:
    """The profile the planner uses: a calibrated file (cluster.profile; `host` is this host's cached
    profile, written by `harness calibrate`) before the datasheet table; cluster fields override
    bandwidths and node size. None: nothing known."""
    path = getattr(cluster, "profile", None)
    if path == "host":
        path = str(profile_path(cpu_profile_name()))
    base = _calibrated(path) if path else None
    if base is None:
        base = HARDWARE.get(cluster.accelerator)
    if base is None:
        return None
    changes: Dict[str, Any] = {"gpus_per_node": cluster.accelerators_per_node}
    kernel = getattr(cluster, "attention_kernel", DEFAULT_ATTENTION_KERNEL)
    if kernel != DEFAULT_ATTENTION_KERNEL:
        rates = attention_kernel_rates(kernel, cluster.accelerator)
        if rates is None:
            return None
        changes.update(rates)
    if getattr(cluster, "intra_node_gbps", 0):
        changes["intra_node_bandwidth"] = cluster.intra_node_gbps * GB / 8
    if getattr(cluster, "inter_node_gbps", 0):
        changes["inter_node_bandwidth"] = cluster.inter_node_gbps * GB / 8
    return replace(base, **changes)


def attention_kernel_rates(kernel: str, accelerator: str) -> Optional[Dict[str, Any]]:
    """The attention constants `kernel` runs at on `accelerator` (ATTENTION_KERNEL_RATES); {} for the default
    kernel, whose rates every profile holds; None: not measured there."""
    if kernel == DEFAULT_ATTENTION_KERNEL:
        return {}
    return ATTENTION_KERNEL_RATES.get(kernel, {}).get(accelerator)


def cpu_profile_name() -> str:
    """Cache key of this host's CPU profile."""
    import socket

    return f"cpu-{socket.gethostname()}"


def achievable_peak(profile: HardwareProfile, accelerator: str, precision: str) -> Optional[float]:
    """Dense FLOP/s a large GEMM reaches: datasheet peak x MAMF efficiency, or the measured CPU figure."""
    if profile.measured_peak_flops:
        return profile.measured_peak_flops * profile.matmul_efficiency
    peak = peak_flops(accelerator, precision).flops
    return None if peak is None else peak * profile.matmul_efficiency
