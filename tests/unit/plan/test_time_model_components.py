"""Each component of the GPU time model against a public measurement of that component alone."""

from __future__ import annotations

import pytest

from harness.plan.comm import Group, bus_factor, collective_time
from harness.plan.hardware import HARDWARE

H100 = HARDWARE["h100_sxm"]
GIB = 1 << 30


def busbw(kind: str, nbytes: float, group: Group, hw=H100) -> float:
    """Predicted bus bandwidth as nccl-tests reports it: bytes x bus factor / time."""
    return nbytes * bus_factor(kind, group.size) / collective_time(kind, nbytes, group, hw)


@pytest.mark.parametrize("gpus, measured", [(4, 363.3e9), (8, 473.1e9)])
def test_all_reduce_in_a_hopper_node_matches_nccl_tests(gpus, measured):
    # stas00/ml-engineering network/README.md, "SHARP": 8x H200 (NVLink 4, as H100), nccl-tests all_reduce at
    # 8 GiB: ring 363.3 GB/s at 4 GPUs, NVLS 473.1 GB/s at 8
    assert busbw("all_reduce", 8 * GIB, Group(gpus, 1)) == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("payload, measured", [(GIB, 361.99e9), (16 * GIB, 381.80e9)])
def test_all_reduce_across_four_nodes_runs_on_every_nic_of_the_node(payload, measured):
    # ml-engineering network/README.md, "Inter-node speed depends on intra-node speed": 4 nodes x 8 accelerators
    # with one 50 GB/s NIC each (the NDR 400G rate of H100 nodes), all_reduce busbw 362 GB/s at 1 GiB, 382 at
    # 16 GiB: the node's eight NICs, not one (a single NIC would give at most 50 GB/s)
    assert busbw("all_reduce", payload, Group(32, 4)) == pytest.approx(measured, rel=0.10)


def test_a_group_with_one_rank_per_node_crosses_on_one_nic():
    # the same arithmetic with one rank of the group per node: its own NIC carries all the traffic
    assert busbw("all_gather", 8 * GIB, Group(4, 4)) == pytest.approx(50e9 * 0.9, rel=0.05)
