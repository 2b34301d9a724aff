"""NCCL's protocols in the collective model (comm.ring_time, comm.collective_time) against NCCL's own tuning model,
whose numbers are written out here from src/graph/tuning.cc (ncclTunerConstantsDefaults, ncclTopoTuneModel):
Ring latencies in us (base; NVLink step; network step) Simple 8.4 / 3.4 / 14, LL 6.6 / 0.6 / 2.7, LL128 14 / 1.9 /
4.0; LL's bus bandwidth x 0.5 capped at llMaxBws, LL128's x 0.92; across nodes an NVLink step costs at least the
network post overhead (1 us on Intel hosts, 2 on AMD)."""

from __future__ import annotations

import pytest

from harness.plan.comm import Group, bus_factor, collective_time, protocols, ring_time
from harness.plan.hardware import HARDWARE

US, GB, MB = 1e-6, 1e9, 1e6
H100, A100, MI300X = HARDWARE["h100_sxm"], HARDWARE["a100_sxm"], HARDWARE["mi300x"]


def nccl(kind, nbytes, group, hw, base, intra, inter, bandwidth):
    """Time by NCCL's formula: latency over the ring's steps, then the bytes at the bus bandwidth."""
    n, nodes = group.size, group.nodes
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    inter_steps = 0 if nodes == 1 else (2 if kind == "all_reduce" else 1) * (nodes - 1)
    return (base + (steps - inter_steps) * intra + inter_steps * inter) * US + nbytes * bus_factor(kind, n) / bandwidth


def test_within_an_h100_node_each_protocol_is_nccls():
    group, nvlink = Group(8, 1), H100.intra_node_bandwidth  # 370 GB/s: LL's half is above Hopper's 141 GB/s cap
    for nbytes in (64e3, 4 * MB, 256 * MB):
        assert ring_time("all_gather", nbytes, group, H100) == pytest.approx(
            nccl("all_gather", nbytes, group, H100, 8.4, 3.4, 14.0, nvlink))
        assert ring_time("all_gather", nbytes, group, H100, "ll") == pytest.approx(
            nccl("all_gather", nbytes, group, H100, 6.6, 0.6, 2.7, 141 * GB))
        assert ring_time("all_gather", nbytes, group, H100, "ll128") == pytest.approx(
            nccl("all_gather", nbytes, group, H100, 14.0, 1.9, 4.0, 0.92 * nvlink))


def test_across_more_than_two_intel_nodes_ll_is_capped_and_nvlink_steps_cost_the_post_overhead():
    group = Group(512, 64)  # 64 DGX H100 nodes
    busbw = 8 * H100.inter_node_bandwidth * 0.9  # eight NICs a node at NIC_EFFICIENCY
    assert ring_time("all_gather", 100 * MB, group, H100, "ll") == pytest.approx(
        nccl("all_gather", 100 * MB, group, H100, 6.6, 1.0, 2.7, 20.4 * GB))
    assert ring_time("all_gather", 100 * MB, group, H100, "ll128") == pytest.approx(
        nccl("all_gather", 100 * MB, group, H100, 14.0, 1.9, 4.0, 0.92 * busbw))
    # two nodes: the cap is 39 GB/s
    assert ring_time("reduce_scatter", 100 * MB, Group(16, 2), H100, "ll") == pytest.approx(
        nccl("reduce_scatter", 100 * MB, Group(16, 2), H100, 6.6, 1.0, 2.7, 39.0 * GB))


def test_dgx_a100s_amd_hosts_take_amds_cap_and_overhead():
    group = Group(64, 8)
    assert ring_time("all_gather", 10 * MB, group, A100, "ll") == pytest.approx(
        nccl("all_gather", 10 * MB, group, A100, 6.6, 2.0, 2.7, 19.0 * GB))
    assert ring_time("all_gather", 10 * MB, group, A100, "ll128") == pytest.approx(
        nccl("all_gather", 10 * MB, group, A100, 14.0, 2.0, 4.0, 0.92 * 8 * A100.inter_node_bandwidth * 0.9))


@pytest.mark.parametrize("nbytes, picked", [(16e3, "ll"), (400 * MB, "ll128")])
def test_the_fastest_protocol_is_picked_and_a_large_gather_across_nodes_is_never_ll(nbytes, picked):
    group = Group(512, 64)
    times = {p: ring_time("all_gather", nbytes, group, H100, p) for p in ("simple", "ll", "ll128")}
    assert collective_time("all_gather", nbytes, group, H100) == pytest.approx(times[picked])
    assert min(times, key=times.get) == picked
    # LL at half the bus bandwidth, uncapped, would have won the 400 MB gather over LL128
    if picked == "ll128":
        assert times["ll"] > 5 * times["ll128"]


def test_ll128_only_where_nccl_enables_it_and_never_for_point_to_point():
    assert "ll128" in protocols("all_reduce", H100) and "ll128" in protocols("all_gather", A100)
    assert "ll128" not in protocols("all_reduce", MI300X)  # no measured RCCL default here: LL only
    assert protocols("p2p", H100) == ("simple", "ll") == protocols("all_to_all", H100)
