"""The regime's effects on the time model: torch.compile fuses the layer's elementwise work."""

from __future__ import annotations

import pytest

from harness.plan.compute_time import layer_elementwise_bytes
from harness.plan.model_spec import model_spec_from_hf
from harness.plan.planner import make_plan
from harness.plan.regime import compiled_layer_elementwise_bytes
from plan_helpers import REAL_SHAPES, run_config

H100_8X8 = dict(name="h100_8x8", nodes=8, accelerators_per_node=8, accelerator="h100_sxm",
                memory_per_accelerator_gib=None, host_memory_gib=2048.0)


def test_compiled_llama_8b_layer_moves_each_fused_tensor_once():
    spec = model_spec_from_hf("llama3_1_8b", REAL_SHAPES["llama3_1_8b"])
    # bf16, h = 4096, q = 4096, kv = 1024, f = 14336: two add+norms 2 x 4 x 2 x 4096, rotary 2 x 2 x 5120,
    # SwiGLU 3 x 2 x 14336 bytes per token; eager moves 585,728 (fp32 norm passes, separate adds, 8e rotary).
    assert compiled_layer_elementwise_bytes(spec, 1, 1, 2) == 65_536 + 20_480 + 86_016
    assert layer_elementwise_bytes(spec, 1, 1, 2) == 585_728
    assert compiled_layer_elementwise_bytes(spec, 1, 2, 2) < compiled_layer_elementwise_bytes(spec, 1, 1, 2)


def test_compile_shortens_only_the_elementwise_part_of_the_plan():
    eager, compiled = (make_plan(run_config(model="llama3_1_8b", engine=dict(name="nd", compile=flag),
                                            cluster=H100_8X8, dp_shard=64, zero_stage=3, seq_len=8192,
                                            micro_batch=1)).time.compute_s for flag in (False, True))
    assert compiled["gemm"] == eager["gemm"] and compiled["attention"] == eager["attention"]
    assert compiled["elementwise"] < eager["elementwise"] / 2
    assert compiled["elementwise"] > 0
