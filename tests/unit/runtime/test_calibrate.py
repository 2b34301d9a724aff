"""Calibration: the link fit recovers latency and bandwidth; a saved profile is what the planner uses."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.config.schema import ClusterConfig
from harness.plan.comm import bus_factor
from harness.plan.hardware import HARDWARE, hardware_profile, load_profile, save_profile
from harness.runtime.calibrate import fit_link


def test_fit_link_recovers_latency_and_bandwidth():
    alpha, bandwidth, world = 50e-6, 2e9, 2
    samples = {}
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "p2p"):
        steps = 1 if kind == "p2p" else (2 * (world - 1) if kind == "all_reduce" else world - 1)
        count = 2 if kind == "p2p" else 1
        samples[kind] = [(n, count * (steps * alpha + n * bus_factor(kind, world) / bandwidth))
                         for n in (1 << 10, 1 << 16, 1 << 22)]
    got_alpha, got_bandwidth = fit_link(samples, world)
    assert got_alpha == pytest.approx(alpha, rel=1e-6) and got_bandwidth == pytest.approx(bandwidth, rel=1e-6)


def test_a_calibrated_profile_replaces_the_datasheet(tmp_path):
    measured = replace(HARDWARE["h100_sxm"], name="my-cluster", intra_node_bandwidth=123e9, source="measured:x")
    path = save_profile(measured, tmp_path / "my.json")
    assert load_profile(path).intra_node_bandwidth == 123e9
    cluster = ClusterConfig(name="c", nodes=2, accelerators_per_node=8, accelerator="h100_sxm", profile=str(path))
    profile = hardware_profile(cluster)
    assert profile.source == "measured:x" and profile.intra_node_bandwidth == 123e9
    datasheet = hardware_profile(ClusterConfig(name="c", nodes=2, accelerators_per_node=8, accelerator="h100_sxm"))
    assert datasheet.source == "datasheet" and datasheet.intra_node_bandwidth == HARDWARE["h100_sxm"].intra_node_bandwidth
