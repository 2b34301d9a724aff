"""What DeepSpeed holds on the device beside the training states, read off DeepSpeed itself on one CPU rank.

The gradient reduction buckets are the bytes the plan counts: the zero section the renderer writes for a GPU
cluster, run by DeepSpeed (the buffers are the same on CPU; only their device differs), beside
harness.plan.memory.deepspeed_bucket_bytes for that GPU. ZeRO-3's parameters kept gathered by its reuse rule
are recorded as a fact the plan does not model yet."""

import json
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness.config.compose import compose_run_config
from harness.engines.deepspeed import zero_section
from harness.plan.memory import deepspeed_bucket_bytes

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GPU_RUN = compose_run_config(["recipes=cpu_zero2", "cluster=h100_8x8"])


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.mark.parametrize("stage,precision", [(1, "bf16"), (2, "bf16"), (2, "fp32"), (3, "bf16")])
def test_deepspeeds_reduction_buckets_are_what_the_plan_counts(stage, precision):
    run = replace(GPU_RUN, layout=replace(GPU_RUN.layout, zero_stage=stage, precision=precision))
    zero = zero_section(run)
    proc = subprocess.run([sys.executable, "-m", "tests.integration.deepspeed_bucket_probe", json.dumps(zero),
                           precision, _free_port()], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])["bucket_bytes_in_backward"]
    planned = deepspeed_bucket_bytes(run.layout, run.cluster.accelerator, rank_numel=10**12)
    assert measured == planned, (zero, measured, planned)


@pytest.mark.parametrize("reuse, gathered", [(0, []), (3 * 64 * 64, [6, 7]), (10**9, list(range(8)))])
def test_deepspeed_zero3_keeps_gathered_what_it_reuses_within_stage3_max_reuse_distance(reuse, gathered):
    """A DeepSpeed fact the plan's gathered term does not follow yet (it counts twice the largest module): after
    a module's forward, ZeRO-3 keeps its parameters gathered when the parameters the trace runs through before
    their next use number fewer than stage3_max_reuse_distance (partitioned_param_coordinator.py
    __params_to_release). The last layers are within reach of their backward; under the default 1e9 elements a
    model smaller than that keeps every layer gathered from its forward to its backward."""
    proc = subprocess.run([sys.executable, "-m", "tests.integration.deepspeed_reuse_probe", str(reuse), _free_port()],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["gathered_at_backward_start"] == gathered
