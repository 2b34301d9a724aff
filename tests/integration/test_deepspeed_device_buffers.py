"""What DeepSpeed holds on the device beside the training states, read off DeepSpeed itself on one CPU rank.

The gradient reduction buckets are the bytes the plan counts: the zero section the renderer writes for a GPU
cluster, run by DeepSpeed (the buffers are the same on CPU; only their device differs), beside
harness.plan.memory.deepspeed_bucket_bytes for that GPU. The parameters ZeRO-3 keeps gathered into the backward
(its reuse rule) are those harness.plan.states.deepspeed_kept_numel counts."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness.config.compose import compose_run_config
from harness.engines.deepspeed import zero_section
from harness.launch.local import free_port
from harness.plan.memory import deepspeed_bucket_bytes

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GPU_RUN = compose_run_config(["recipes=cpu_zero2", "cluster=h100_8x8"])


def _probe(module: str, *args: str) -> dict:
    """The JSON last line of tests/integration/<module>.py run in a process of its own (its last argument a port)."""
    proc = subprocess.run([sys.executable, "-m", f"tests.integration.{module}", *args, str(free_port())], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stage,precision", [(1, "bf16"), (2, "bf16"), (2, "fp32"), (3, "bf16")])
def test_deepspeeds_reduction_buckets_are_what_the_plan_counts(stage, precision):
    run = replace(GPU_RUN, layout=replace(GPU_RUN.layout, zero_stage=stage, precision=precision))
    zero = zero_section(run)
    measured = _probe("deepspeed_bucket_probe", json.dumps(zero), precision)["bucket_bytes_in_backward"]
    planned = deepspeed_bucket_bytes(run.layout, run.cluster.accelerator, rank_numel=10**12)
    assert measured == planned, (zero, measured, planned)


@pytest.mark.parametrize("reuse, gathered", [(0, []), (3 * 64 * 64, [6, 7]), (10**9, list(range(8)))])
def test_deepspeed_zero3_keeps_gathered_what_it_reuses_within_stage3_max_reuse_distance(reuse, gathered):
    """After a module's forward, ZeRO-3 keeps its parameters gathered when the parameters the trace runs through
    before their next use number fewer than stage3_max_reuse_distance (partitioned_param_coordinator.py
    __params_to_release): eight equal layers without recompute, the last two within 3 layers' reach of their
    backward; under the default 1e9 elements every layer of a model smaller than that."""
    assert _probe("deepspeed_reuse_probe", str(reuse), "linear", "0")["gathered_layers"] == gathered


# A 4-layer Llama: 36,992 elements a layer, an lm_head and a table of 16,384.
TINY = dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


@pytest.mark.parametrize("tied, recompute, reuse", [(False, False, 60_000), (False, True, 60_000),
                                                    (True, False, 100_000), (True, True, 100_000),
                                                    (False, True, 10**9), (True, False, 30_000)])
def test_the_plans_zero3_kept_elements_are_what_deepspeed_keeps_gathered(tied, recompute, reuse):
    """deepspeed_kept_numel beside DeepSpeed's own gathered set at the lm_head's backward, on a transformers
    decoder with and without a tied table and full recompute; within 1% (a norm's place in the layer's order)."""
    from harness.plan.model_spec import model_spec_from_hf
    from harness.plan.states import deepspeed_kept_numel, rank_params
    from harness.plan.support import ENGINE_SUPPORT

    fields = dict(TINY, tie_word_embeddings=tied)
    spec = model_spec_from_hf("tiny", fields)
    params = rank_params(spec, 1, 1, tuple(range(fields["num_hidden_layers"])), True, True, 1,
                         ENGINE_SUPPORT["deepspeed"].tp_shards_vocab)
    measured = _probe("deepspeed_reuse_probe", str(reuse), json.dumps(fields), "1" if recompute else "0")["gathered_numel"]
    assert deepspeed_kept_numel(params, recompute, reuse) == pytest.approx(measured, rel=0.01)
