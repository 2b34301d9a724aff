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


def test_sequence_parallel_runs_norms_and_residual_adds_on_a_tp_share_of_the_tokens():
    spec = model_spec_from_hf("llama3_1_8b", REAL_SHAPES["llama3_1_8b"])
    # per token at tp 8, bf16: eager norms 2 x (3e + 32) h and adds 2 x 3e h are split 8 ways; rotary and SwiGLU
    # are already split by heads and ffn columns
    norms_adds = 2 * (3 * 2 + 32) * 4096 + 2 * 3 * 2 * 4096
    assert layer_elementwise_bytes(spec, 1, 8, 2) - layer_elementwise_bytes(spec, 1, 8, 2, sp=True) == \
        pytest.approx(norms_adds * 7 / 8)
    fused = 2 * 4 * 2 * 4096  # Megatron's add + norm kernels
    assert compiled_layer_elementwise_bytes(spec, 1, 8, 2) - compiled_layer_elementwise_bytes(spec, 1, 8, 2, True) \
        == pytest.approx(fused * 7 / 8)
    off, on = (make_plan(run_config(model="llama3_1_70b", engine=dict(name="nd", sequence_parallel=flag),
                                    cluster=H100_8X8, dp_shard=8, tp=8, zero_stage=3, seq_len=8192, micro_batch=1))
               for flag in (False, True))
    assert on.time.compute_s["elementwise"] < 0.5 * off.time.compute_s["elementwise"]
    assert on.time.compute_s["gemm"] == off.time.compute_s["gemm"]


def test_compile_shortens_only_the_elementwise_part_of_the_plan():
    eager, compiled = (make_plan(run_config(model="llama3_1_8b", engine=dict(name="nd", compile=flag),
                                            cluster=H100_8X8, dp_shard=64, zero_stage=3, seq_len=8192,
                                            micro_batch=1)).time.compute_s for flag in (False, True))
    assert compiled["gemm"] == eager["gemm"] and compiled["attention"] == eager["attention"]
    assert compiled["elementwise"] < eager["elementwise"] / 2
    assert compiled["elementwise"] > 0


# ---- FP8 ----
from harness.config.compose import compose_run_config  # noqa: E402
from harness.engines.fsdp import accelerate_config  # noqa: E402
from harness.engines.megatron_lm import megatron_flags  # noqa: E402
from harness.engines.nd_plans import nd_plan  # noqa: E402
from harness.plan.peak import peak_flops  # noqa: E402
from harness.plan.validate import validate  # noqa: E402

A100_8X8 = dict(H100_8X8, name="a100_8x8", accelerator="a100_sxm")
FP8_70B = dict(model="llama3_1_70b", cluster=H100_8X8, dp_shard=64, tp=1, zero_stage=3, seq_len=8192, micro_batch=1,
               activation_checkpointing="full")


def fp8_plan(engine="nd", precision="fp8", compile=True, **layout):
    fields = {**FP8_70B, **layout}
    if engine == "megatron_lm":
        fields["zero_stage"] = 1
    return make_plan(run_config(engine=dict(name=engine, compile=compile and engine != "megatron_lm"),
                                precision=precision, **fields))


def errors(**kw):
    cfg = run_config(**kw)
    return validate(cfg, model_spec_from_hf(cfg.model.name, cfg.model.hf_config))[0]


def test_fp8_peak_is_the_datasheets_dense_figure():
    # H100 SXM datasheet: FP8 3,958 TFLOP/s with sparsity, 1,979 dense; A100 has no FP8 tensor cores.
    assert peak_flops("h100_sxm", "fp8").flops == 1979e12
    assert peak_flops("h100_sxm", "fp8").flops == 2 * peak_flops("h100_sxm", "bf16").flops
    assert peak_flops("a100_sxm", "fp8").flops is None


def test_fp8_is_refused_where_it_cannot_run_naming_the_field():
    on_a100 = errors(model="llama3_1_8b", engine=dict(name="nd"), cluster=A100_8X8, dp_shard=64, zero_stage=3,
                     precision="fp8")
    assert ["layout.precision=fp8 on accelerator=a100_sxm: it has no FP8 tensor cores (FP8 GEMMs need Hopper / "
            "Ada / Blackwell or MI300-class devices)"] == on_a100
    assert any(e.startswith("layout.precision=fp8 on accelerator=cpu") for e in errors(precision="fp8"))
    deepspeed = errors(model="llama3_1_8b", cluster=H100_8X8, dp_shard=64, precision="fp8")
    assert any(e.startswith("layout.precision=fp8 with engine=deepspeed: DeepSpeed 0.19 has no FP8") for e in deepspeed)
    odd = dict(REAL_SHAPES["tiny_llama"], hidden_size=72, intermediate_size=136)
    assert ("layout.precision=fp8: hidden_size=72, q_width/tp=72, kv_width/tp=36, intermediate_size/tp=136 must be "
            "divisible by 16 (FP8 GEMMs, torch._scaled_mm)") in errors(
        hf_config=odd, engine=dict(name="nd"), cluster=H100_8X8 | dict(nodes=1, accelerators_per_node=2),
        zero_stage=3, precision="fp8")
    assert errors(model="llama3_1_8b", engine=dict(name="nd"), cluster=H100_8X8, dp_shard=64, zero_stage=3,
                  precision="fp8") == []


def test_llama_70b_fp8_plans_with_the_fp8_peak_both_mfus_and_only_the_converted_gemms_faster():
    bf16, fp8 = fp8_plan(precision="bf16"), fp8_plan()
    assert fp8.valid and fp8.peak_flops_per_device == 1979e12
    assert fp8.peak_flops_source == "datasheet:h100_sxm:fp8"
    assert fp8.mfu_by_peak["bf16_peak"] == pytest.approx(2 * fp8.mfu_by_peak["fp8_peak"])
    assert fp8.predicted_mfu == fp8.mfu_by_peak["fp8_peak"]
    assert bf16.mfu_by_peak == {}
    # The weight GEMMs run at twice the rate (1-byte operands); attention is untouched; the casts add
    # elementwise traffic; states are bf16's and torchao's dynamic scaling keeps nothing between steps.
    b, f = bf16.time.compute_s, fp8.time.compute_s
    assert f["gemm"] < 0.6 * b["gemm"]
    assert f["attention"] == b["attention"]
    assert f["elementwise"] > b["elementwise"]
    assert fp8.memory.state_bytes == bf16.memory.state_bytes
    assert fp8.memory.scaling_state_bytes == 0


def test_megatron_fp8_keeps_transformer_engines_amax_history():
    plan = fp8_plan("megatron_lm")
    # 80 layers x 7 linears x 3 operands x (1024 history + scale + inverse) x 4 bytes
    assert plan.memory.scaling_state_bytes == 80 * 7 * 3 * 1026 * 4
    flags = megatron_flags(compose_run_config(["engine=megatron_lm", "model=llama3_1_70b", "cluster=h100_8x8",
                                               "layout.dp_shard=8", "layout.tp=8", "layout.zero_stage=1",
                                               "layout.precision=fp8"]))
    assert flags["--bf16"] is True and flags["--fp8-format"] == "hybrid"
    assert flags["--fp8-amax-history-len"] == 1024 and flags["--fp8-amax-compute-algo"] == "max"


def test_nd_and_fsdp_render_torchaos_float8_settings():
    base = ["model=llama3_1_8b", "cluster=h100_8x8", "layout.dp_shard=64", "layout.zero_stage=3",
            "layout.precision=fp8"]
    plan = nd_plan(compose_run_config(["engine=nd", *base]))
    assert plan["float8"] == {"recipe_name": "tensorwise", "skip_modules": ["lm_head"], "dim_multiple": 16,
                              "enable_fsdp_float8_all_gather": False}
    assert plan["data_parallel"]["mixed_precision"] == {"param_dtype": "bf16", "reduce_dtype": "fp32"}
    accelerate = accelerate_config(compose_run_config(["engine=fsdp", *base]))
    assert accelerate["mixed_precision"] == "fp8" and accelerate["fp8_config"] == {"backend": "AO"}
    assert nd_plan(compose_run_config(["engine=nd", *base[:-1]]))["float8"] is None


def test_megatron_fp8_flags_pass_megatron_cores_config(monkeypatch):
    from tests.unit.engines.megatron_core_config import transformer_config

    flags = megatron_flags(compose_run_config(["engine=megatron_lm", "model=llama3_1_70b", "cluster=h100_8x8",
                                               "layout.dp_shard=8", "layout.tp=8", "layout.zero_stage=1",
                                               "layout.precision=fp8"]))
    config = transformer_config(flags)
    assert (config.fp8, config.fp8_amax_history_len, config.fp8_amax_compute_algo) == ("hybrid", 1024, "max")
    assert config.bf16


def test_fsdp_fp8_config_reads_back_through_accelerates_launcher(tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    from harness.engines import fsdp

    fsdp.render(compose_run_config(["engine=fsdp", "model=llama3_1_8b", "cluster=h100_8x8", "layout.dp_shard=64",
                                    "layout.zero_stage=3", "layout.precision=fp8"]), tmp_path)
    loaded = load_config_from_file(str(tmp_path / fsdp.CONFIG_FILE))
    assert loaded.mixed_precision == "fp8" and loaded.fp8_config == {"backend": "AO"}
    # accelerate launch turns each fp8_config key into its --fp8_<key> argument.
    assert "fp8_backend" in vars(launch_command_parser().parse_args(["x.py"]))


# What FP8 converts is what torchao's float8 training swaps: nn.Linear modules only. Tiny members of four families,
# converted by the runtime's own converter, against the shares the planner reads from the model's shape.
TINY_FAMILIES = {
    "llama": dict(REAL_SHAPES["tiny_llama"]),
    "gpt2": dict(model_type="gpt2", vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=128),
    "mixtral": dict(model_type="mixtral", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, num_local_experts=16, num_experts_per_tok=2),
    "deepseek_v3": dict(model_type="deepseek_v3", vocab_size=256, hidden_size=64, intermediate_size=128,
                        moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                        n_routed_experts=16, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                        q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
                        n_group=1, topk_group=1),
}


def converted_shares(hf_config, layer: int):
    """(attention, MLP) shares of decoder layer `layer`'s weight-matrix FLOPs per token that torchao runs in FP8,
    after the runtime's converter (harness.engines.float8) swapped the model's linears: each matrix weighs its
    active elements (a routed expert tensor's k of its E rows)."""
    import torch
    from transformers import AutoModelForCausalLM

    from harness.config.model_shape import _decoder_layers, hf_config_object
    from harness.engines.float8 import convert_to_float8
    from harness.plan.regime import torchao_float8_config

    config = hf_config_object(hf_config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    convert_to_float8(model, torchao_float8_config())
    block = _decoder_layers(model, config)[1][layer]
    modules = dict(block.named_modules())
    experts, k = getattr(config, "n_routed_experts", None) or getattr(config, "num_local_experts", 0), \
        config.num_experts_per_tok if hasattr(config, "num_experts_per_tok") else 0
    sums = {"attn": [0.0, 0.0], "mlp": [0.0, 0.0]}
    for name, param in block.named_parameters():
        if param.dim() < 2 or "norm" in name:
            continue
        routed = ".experts." in name and "shared" not in name
        weight = param.numel() * (k / experts if routed else 1.0)
        part = sums["attn" if name.startswith("self_attn.") or name.startswith("attn.") else "mlp"]
        part[1] += weight
        part[0] += weight * (type(modules[name.rsplit(".", 1)[0]]).__name__ == "Float8Linear")
    return tuple(converted / total for converted, total in sums.values())


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_fp8_shares_are_what_torchaos_converter_swaps(family):
    hf_config = TINY_FAMILIES[family]
    spec = model_spec_from_hf(family, hf_config)
    layer = len(spec.layer_pattern) - 1  # DeepSeek-V3's last layer is a MoE one (its first is dense)
    assert (spec.linear_attention_share, spec.linear_mlp_share) == pytest.approx(converted_shares(hf_config, layer))
    expected = {"llama": (1, 1), "gpt2": (0, 0), "mixtral": (1, 0)}
    if family in expected:
        assert (spec.linear_attention_share, spec.linear_mlp_share) == expected[family]
    else:  # the shared expert is nn.Linear, the routed ones grouped tensors: 1 of 1 + k experts' FLOPs and the router
        assert 0.3 < spec.linear_mlp_share < 1 / 3


def test_fp8_on_gpt2_is_refused_on_torchao_engines_naming_conv1d():
    for engine in ("nd", "fsdp"):
        problems = errors(model="gpt2", cluster=H100_8X8, dp_shard=64, zero_stage=3, engine=dict(name=engine),
                          precision="fp8")
        assert (f"layout.precision=fp8 with model=gpt2: its decoder layers hold no nn.Linear (transformers builds "
                f"gpt2's projections as Conv1D) and engine={engine} trains FP8 with torchao's float8 training, which "
                "converts nn.Linear modules only: the run would be bf16") in problems


def test_mixtral_fp8_on_nd_speeds_up_attention_projections_only_and_says_so():
    fields = dict(model="mixtral_8x7b", cluster=H100_8X8, dp_shard=32, tp=2, zero_stage=3, seq_len=4096,
                  micro_batch=1, activation_checkpointing="full", engine=dict(name="nd"))
    bf16, fp8 = (make_plan(run_config(precision=p, **fields)) for p in ("bf16", "fp8"))
    assert fp8.valid
    assert any("its routed experts (grouped tensors, not nn.Linear modules) stay bf16: FP8 runs 11% of the layers' "
               "weight-GEMM FLOPs" in w for w in fp8.warnings)
    # Only the attention projections (about 11% of the GEMM time) halve; the experts' GEMMs are bf16's.
    saved = 1 - fp8.time.compute_s["gemm"] / bf16.time.compute_s["gemm"]
    assert 0.02 < saved < 0.10
    # Megatron-LM's Transformer Engine layers run the grouped expert GEMMs in FP8 too.
    te = make_plan(run_config(precision="fp8", **{**fields, "engine": dict(name="megatron_lm"), "zero_stage": 1}))
    te_bf16 = make_plan(run_config(precision="bf16", **{**fields, "engine": dict(name="megatron_lm"),
                                                        "zero_stage": 1}))
    assert te.time.compute_s["gemm"] < 0.6 * te_bf16.time.compute_s["gemm"]


def test_transformer_engines_fp8_casts_fuse_their_amax_and_cast_weights_once_a_step():
    from harness.plan.regime import fp8_cast_bytes

    rows = [(8192, 8192, 1024, 1)]  # (m x k) @ (k x n)
    torchao = fp8_cast_bytes(rows, 2, backward=True)
    te = fp8_cast_bytes(rows, 2, backward=True, delayed_scaling=True)
    assert torchao == 5 * (8192 * 8192 + 8192 * 1024 + 8192 * 1024)  # amax pass + cast, weights every time
    assert te == 3 * (8192 * 8192 + 8192 * 1024)  # cast with its amax, activations and gradients
    megatron = fp8_plan("megatron_lm").time.compute_s["elementwise"]
    nd = fp8_plan("nd", compile=False, zero_stage=3).time.compute_s["elementwise"]
    assert megatron < nd
