"""Calibration: the link fit recovers latency and bandwidth; a saved profile is what the planner uses."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.config.schema import ClusterConfig
from harness.plan.comm import bus_factor
from harness.plan.hardware import HARDWARE, PROFILE_VERSION, hardware_profile, load_profile, save_profile
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
    measured = replace(HARDWARE["h100_sxm"], name="my-cluster", intra_node_bandwidth=123e9, source="measured:x",
                       version=PROFILE_VERSION)
    path = save_profile(measured, tmp_path / "my.json")
    assert load_profile(path).intra_node_bandwidth == 123e9
    cluster = ClusterConfig(name="c", nodes=2, accelerators_per_node=8, accelerator="h100_sxm", profile=str(path))
    profile = hardware_profile(cluster)
    assert profile.source == "measured:x" and profile.intra_node_bandwidth == 123e9
    datasheet = hardware_profile(ClusterConfig(name="c", nodes=2, accelerators_per_node=8, accelerator="h100_sxm"))
    assert datasheet.source == "datasheet" and datasheet.intra_node_bandwidth == HARDWARE["h100_sxm"].intra_node_bandwidth


def test_each_collective_kind_gets_its_own_link():
    # gloo reduce-scatters through an all-reduce: twice the ring's steps, which a per-kind fit absorbs
    world, samples = 2, {}
    truth = {"all_gather": (100e-6, 4e9), "reduce_scatter": (200e-6, 2e9)}
    for kind, (alpha, bandwidth) in truth.items():
        samples[kind] = [(n, alpha + n * bus_factor(kind, world) / bandwidth) for n in (1 << 10, 1 << 16, 1 << 22)]
    for kind, (alpha, bandwidth) in truth.items():
        got = fit_link({kind: samples[kind]}, world)
        assert got == pytest.approx((alpha, bandwidth), rel=1e-6)


def test_a_profile_from_an_older_calibration_is_measured_again(tmp_path):
    old = replace(HARDWARE["h100_sxm"], name="old", source="measured:x", version=PROFILE_VERSION - 1)
    assert load_profile(save_profile(old, tmp_path / "old.json")) is None
    current = replace(old, version=PROFILE_VERSION, collective_links={"all_reduce": (1e-4, 1e9)})
    loaded = load_profile(save_profile(current, tmp_path / "new.json"))
    assert loaded.version == PROFILE_VERSION and tuple(loaded.collective_links["all_reduce"]) == (1e-4, 1e9)
