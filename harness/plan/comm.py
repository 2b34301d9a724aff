"""Time of one collective: latency + bytes x bus factor / bus bandwidth, ring or tree, within or across nodes."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple, Tuple

from harness.plan.hardware import (NCCL_LL, NCCL_LL128, NCCL_PROTOCOL_LIMITS, NCCL_SIMPLE, NIC_EFFICIENCY,
                                   NVLS_ALL_REDUCE_GAIN, HardwareProfile)

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")


class Group(NamedTuple):
    """A process group: its size and how many nodes it spans."""

    size: int
    nodes: int


@lru_cache(maxsize=4096)
def axis_group(size: int, stride: int, gpus_per_node: int) -> Group:
    """The group of one parallel axis whose ranks are `stride` apart in the global rank order (inner axes
    vary fastest): it stays inside a node while stride x size <= gpus per node."""
    if size <= 1:
        return Group(1, 1)
    per_node = max(1, gpus_per_node // max(1, stride)) if stride < gpus_per_node else 1
    return Group(size, max(1, math.ceil(size / per_node)))


def bus_factor(kind: str, n: int) -> float:
    """Bytes each rank moves per byte of the collective's buffer on a ring (nccl-tests PERFORMANCE.md):
    all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n of the full buffer, all-to-all (n-1)/n,
    point-to-point 1."""
    if kind == "p2p":
        return 1.0
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    return (n - 1) / n


def bus_bandwidth(kind: str, group: Group, hw: HardwareProfile) -> float:
    """Bus bandwidth (bytes/s per rank, as nccl-tests reports busbw) of a large collective over `group`.

    Within a node: the NVLink ring's, times NVLink SHARP's gain for an all-reduce over more than four ranks
    where the switch has it. Across nodes, a ring collective: NCCL's channels cross the node boundary at
    different ranks, so the node's traffic spreads over the NICs of every rank the group has there (one NIC per
    accelerator, at NIC_EFFICIENCY of its rate), capped by the node's links; a group with one rank per node runs
    on one NIC (hardware.py's table cites both measurements). Traffic that is not forwarded around a ring
    leaves on each rank's own NIC: a point-to-point transfer to a peer on another node, and an all-to-all's
    share for the n - g ranks off the node (g ranks per node): each rank sends (n - g)/n of its buffer over
    its NIC while the (g - 1)/n for its node mates moves over NVLink beside it, so its bus bandwidth (bytes x
    (n - 1)/n over the time) is the NIC's x (n - 1)/(n - g)."""
    if group.nodes <= 1:
        gain = NVLS_ALL_REDUCE_GAIN.get(min(group.size, max(NVLS_ALL_REDUCE_GAIN)), 1.0) \
            if kind == "all_reduce" and hw.nvlink_sharp else 1.0
        return hw.intra_node_bandwidth * gain
    if not hw.nic_per_accelerator:
        return hw.inter_node_bandwidth
    per_node, nic = math.ceil(group.size / group.nodes), hw.inter_node_bandwidth * NIC_EFFICIENCY
    if kind == "p2p":
        return nic
    if kind == "all_to_all":
        return min(hw.intra_node_bandwidth, nic * (group.size - 1) / max(1, group.size - per_node))
    return min(hw.intra_node_bandwidth, per_node * nic)


def _steps(kind: str, n: int) -> int:
    if kind == "p2p":
        return 1
    return 2 * (n - 1) if kind in ("all_reduce", "all_to_all") else n - 1


def ring_time(kind: str, nbytes: float, group: Group, hw: HardwareProfile, protocol: str = "simple") -> float:
    """NCCL's ring model (tuning.cc ncclTopoTuneModel / ncclTopoGetAlgoTime): base latency, then one step
    latency per ring step (network steps for the hops between nodes), then bytes at the bus bandwidth of the
    slowest link (bus_bandwidth). `protocol` "ll" or "ll128" takes that protocol's latencies and bandwidth
    (hardware.NCCL_LL, NCCL_LL128: ratios to Simple's where the profile's Simple numbers are not NCCL's own)."""
    n = group.size
    if n <= 1 and kind != "p2p":
        return 0.0
    bandwidth = bus_bandwidth(kind, group, hw)
    steps = _steps(kind, n)
    inter_steps = 0 if group.nodes == 1 else (2 if kind == "all_reduce" else 1) * (group.nodes - 1)
    intra, inter, base = hw.intra_step_latency_s, hw.inter_step_latency_s, hw.collective_base_latency_s
    if kind in hw.collective_links:  # measured for this kind: its own step latency and bandwidth
        step_latency, bandwidth = hw.collective_links[kind]
        intra = inter = step_latency
        base = 0.0
    if protocol != "simple":
        base, intra, inter, bandwidth = _protocol_terms(protocol, group, hw, base, intra, inter, bandwidth)
    latency = base + (steps - inter_steps) * intra + inter_steps * inter
    return latency + nbytes * bus_factor(kind, n) / bandwidth


def _protocol_terms(protocol: str, group: Group, hw: HardwareProfile, base: float, intra: float, inter: float,
                    bandwidth: float) -> Tuple[float, float, float, float]:
    """LL's or LL128's (base, NVLink step, network step latency, bus bandwidth) from Simple's: NCCL's numbers
    scaled by the profile's Simple ones over NCCL's (8.4 / 3.4 / 14 us), the bandwidth by the protocol's factor,
    LL's capped (NCCL_PROTOCOL_LIMITS); across nodes an NVLink step costs at least the network post overhead."""
    ll_within, ll_across, post_overhead, _ = protocol_limits(hw)
    p_base, p_intra, p_inter, factor = NCCL_LL if protocol == "ll" else NCCL_LL128
    simple_base, simple_intra, simple_inter, _ = NCCL_SIMPLE
    base, intra, inter = base * p_base / simple_base, intra * p_intra / simple_intra, inter * p_inter / simple_inter
    bandwidth *= factor
    if group.nodes > 1:
        intra = max(intra, post_overhead)
    if protocol == "ll":
        bandwidth = min(bandwidth, ll_within if group.nodes == 1 else ll_across[0 if group.nodes == 2 else 1])
    return base, intra, inter, bandwidth


def tree_all_reduce_time(nbytes: float, group: Group, hw: HardwareProfile) -> float:
    """NCCL's tree all-reduce: reduce up and broadcast down a tree of nodes, latency growing with
    log2(nodes) instead of the ring's 2(n-1) steps; bus bandwidth x 0.92, algorithm bandwidth half of it."""
    n = group.size
    if n <= 1:
        return 0.0
    per_node = max(1, n // group.nodes)
    bandwidth = bus_bandwidth("all_reduce", group, hw) * 0.92
    latency = hw.collective_base_latency_s + 2 * ((per_node - 1) * hw.intra_step_latency_s
                                                  + math.log2(group.nodes) * hw.inter_step_latency_s)
    return latency + nbytes / (0.5 * bandwidth)


def protocols(kind: str, hw: HardwareProfile) -> Tuple[str, ...]:
    """The protocols NCCL may pick for a collective on this profile's nodes: LL128 for the ring collectives where it
    is on by default (NCCL_PROTOCOL_LIMITS; an accelerator missing there has LL only); point-to-point transfers
    (and all-to-all, grouped from them) run Simple or LL (src/enqueue.cc: LL below NCCL_P2P_LL_THRESHOLD)."""
    ll128 = protocol_limits(hw)[3]
    return ("simple", "ll", "ll128") if ll128 and kind not in ("p2p", "all_to_all") else ("simple", "ll")


def protocol_limits(hw: HardwareProfile) -> Tuple[float, Tuple[float, float], float, bool]:
    """The profile's accelerator's (LL cap within a node, LL caps over two nodes and over more, network post overhead,
    LL128 on) from NCCL_PROTOCOL_LIMITS; an accelerator missing there: LL uncapped, no post overhead, no LL128."""
    return NCCL_PROTOCOL_LIMITS.get(hw.name, (math.inf, (math.inf, math.inf), 0.0, False))


@lru_cache(maxsize=1 << 16)
def collective_time(kind: str, nbytes: float, group: Group, hw: HardwareProfile) -> float:
    """Seconds for one collective of `nbytes` (the full buffer: all-reduce input, all-gather output,
    reduce-scatter input, all-to-all send buffer, point-to-point message): the fastest algorithm and
    protocol the library would pick. Small messages are latency-bound, so efficiency falls with size."""
    if kind not in KINDS:
        raise ValueError(f"collective kind={kind!r} must be one of {KINDS}")
    if nbytes <= 0 or (group.size <= 1 and kind != "p2p"):
        return 0.0
    best = ring_time(kind, nbytes, group, hw)
    if hw.low_latency_protocol and kind not in hw.collective_links:  # a measured kind is what it measured
        best = min(ring_time(kind, nbytes, group, hw, protocol) for protocol in protocols(kind, hw))
        if kind == "all_reduce" and group.nodes > 1:
            best = min(best, tree_all_reduce_time(nbytes, group, hw))
    return best
