"""ModelSpec parameter counts equal transformers' own models built on the meta device."""

from __future__ import annotations

import pytest

from harness.plan.model_spec import model_spec_from_hf, param_tensors
from plan_helpers import MODEL_PRESETS, REAL_SHAPES, hf_counts, meta_model, preset

# Shapes that exercise every branch: biases, tied heads, q/k norms, explicit head_dim, MoE, GELU.
VARIANTS = {
    "llama_biases_tied": dict(model_type="llama", vocab_size=1000, hidden_size=96, intermediate_size=200,
                              num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                              attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    "qwen2_tied_small": dict(model_type="qwen2", vocab_size=1200, hidden_size=128, intermediate_size=320,
                             num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                             tie_word_embeddings=True),
    "qwen3_head_dim": dict(model_type="qwen3", vocab_size=500, hidden_size=64, intermediate_size=96,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                           attention_bias=True),
    "qwen3_moe": dict(model_type="qwen3_moe", vocab_size=500, hidden_size=64, intermediate_size=96,
                      moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, num_experts=6, num_experts_per_tok=2),
    "mistral_head_dim": dict(model_type="mistral", vocab_size=700, hidden_size=80, intermediate_size=160,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    "gpt2_n_inner": dict(model_type="gpt2", vocab_size=300, n_embd=48, n_layer=2, n_head=4, n_inner=100,
                         n_positions=64),
}
# The families the planner first knew by hand: now checks of the generic, meta-built path.
HAND_WRITTEN_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "gpt2")
CASES = {**{f"real:{k}": v for k, v in REAL_SHAPES.items()}, **{f"variant:{k}": v for k, v in VARIANTS.items()},
         **{f"preset:{p.stem}": preset(p)["hf_config"] for p in MODEL_PRESETS},
         **{f"defaults:{t}": {"model_type": t} for t in HAND_WRITTEN_FAMILIES}}


@pytest.mark.parametrize("fields", CASES.values(), ids=list(CASES))
def test_counts_equal_transformers(fields):
    spec = model_spec_from_hf("m", fields)
    counts = hf_counts(meta_model(fields), spec.experts_per_token, spec.num_experts)
    assert spec.total_params == counts["total"]
    assert spec.embedding_params == counts["embedding"]
    assert spec.non_embedding_params == counts["non_embedding"]
    assert spec.active_params == counts["active"]


@pytest.mark.parametrize("fields", CASES.values(), ids=list(CASES))
def test_param_tensors_sum_to_the_counts(fields):
    spec = model_spec_from_hf("m", fields)
    layer, first, last = param_tensors(spec)

    def numel(tensors):
        total = 0
        for t in tensors:
            n = 1
            for size in t.shape:
                n *= size
            total += n
        return total

    assert numel(layer) == spec.layer_params  # the most common layer
    assert len(spec.layer_total_params) == spec.num_layers
    assert sum(spec.layer_total_params) + numel(first) + numel(last) == spec.total_params


# Totals published with the checkpoints (model cards / safetensors metadata), reproduced by transformers.
PUBLISHED_TOTALS = {
    "llama3_1_8b": 8_030_261_248,
    "llama3_1_70b": 70_553_706_496,
    "llama3_1_405b": 405_853_388_800,
    "mistral_7b": 7_241_732_096,
    "qwen2_5_7b": 7_615_616_512,
    "mixtral_8x7b": 46_702_792_704,
    "gpt2": 124_439_808,
}


@pytest.mark.parametrize("name", PUBLISHED_TOTALS)
def test_published_totals(name):
    assert model_spec_from_hf(name, REAL_SHAPES[name]).total_params == PUBLISHED_TOTALS[name]


# Parameter counts published with the new presets' checkpoints (model cards, technical reports).
def test_new_presets_match_published_counts():
    import yaml
    from plan_helpers import ROOT

    def spec(name):
        fields = yaml.safe_load((ROOT / "hydra_configs" / "model" / f"{name}.yaml").read_text())["hf_config"]
        return model_spec_from_hf(name, fields)

    assert spec("gemma2_9b").total_params == 9_241_705_984  # google/gemma-2-9b safetensors: 9.24B
    assert spec("gemma2_27b").total_params == 27_227_128_320  # google/gemma-2-27b safetensors: 27.2B
    qwen = spec("qwen3_235b_a22b")  # Qwen3 technical report table 2: 235B total, 22B activated
    assert qwen.total_params == pytest.approx(235e9, rel=0.001) and qwen.active_params == pytest.approx(22e9, rel=0.01)
    # DeepSeek-V3 README_WEIGHTS: 671B main-model parameters, 36.6B activated (its 0.9B output head in,
    # the input embedding out)
    deepseek = spec("deepseek_v3")
    assert deepseek.total_params == pytest.approx(671e9, rel=0.0005)
    assert deepseek.active_params - deepseek.embedding_params == pytest.approx(36.6e9, rel=0.005)
    assert deepseek.qk_head_dim == 192 and deepseek.v_head_dim == 128 and deepseek.num_experts == 256
    assert deepseek.layer_active_params[0] != deepseek.layer_active_params[3]  # three dense layers first
    gemma = spec("gemma2_9b")
    assert gemma.attention_windows[:2] == (4096, 0) and gemma.final_logit_softcapping == 30.0
    assert gemma.attn_implementation == "eager"  # transformers' Gemma 2 has no SDPA path (soft-capped scores)


def test_mixtral_active_parameters_are_12_9b():
    spec = model_spec_from_hf("mixtral_8x7b", REAL_SHAPES["mixtral_8x7b"])
    assert spec.active_params == 12_879_925_248  # "12.9B active parameters" (Mistral AI, Mixtral of Experts)
    assert spec.is_moe and spec.num_experts == 8 and spec.experts_per_token == 2


def test_shape_fields():
    llama = model_spec_from_hf("llama3_1_8b", REAL_SHAPES["llama3_1_8b"])
    assert (llama.num_layers, llama.hidden_size, llama.num_heads, llama.num_kv_heads, llama.head_dim,
            llama.ffn_size, llama.vocab_size) == (32, 4096, 32, 8, 128, 14336, 128256)
    assert llama.mlp_kind == "swiglu" and not llama.tied_embeddings and llama.lm_head_params == 128256 * 4096
    qwen = model_spec_from_hf("qwen2_5_7b", REAL_SHAPES["qwen2_5_7b"])
    assert qwen.qkv_bias and not qwen.out_bias
    gpt2 = model_spec_from_hf("gpt2", REAL_SHAPES["gpt2"])
    assert gpt2.mlp_kind == "gelu" and gpt2.norm_kind == "layernorm" and gpt2.tied_embeddings
    assert gpt2.learned_positions == 1024 and gpt2.embedding_params == (50257 + 1024) * 768
    assert gpt2.lm_head_params == 0 and gpt2.ffn_size == 4 * 768


def test_encoders_and_unknown_types_are_refused_by_name():
    with pytest.raises(ValueError, match="model_type='bert' is not a decoder-only causal LM"):
        model_spec_from_hf("b", {"model_type": "bert"})
    with pytest.raises(ValueError, match="model_type='no_such_family' is not a transformers model type"):
        model_spec_from_hf("b", {"model_type": "no_such_family"})


def test_spec_is_frozen_and_serialisable():
    import dataclasses
    import json

    spec = model_spec_from_hf("gpt2", REAL_SHAPES["gpt2"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.num_layers = 3
    assert json.loads(json.dumps(spec.to_dict()))["total_params"] == 124_439_808


def test_a_composite_config_plans_as_the_text_decoder_transformers_builds_from_it():
    """AutoModelForCausalLM builds Llama 4's composite config as Llama4ForCausalLM, its text decoder alone: the
    spec is that decoder's; a composite config without a text decoder config is refused by name."""
    from types import SimpleNamespace

    from harness.config.model_shape import _decoder_config

    text = dict(vocab_size=256, hidden_size=64, intermediate_size=96, intermediate_size_mlp=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                num_local_experts=4, num_experts_per_tok=1)
    composite = model_spec_from_hf("scout", {"model_type": "llama4", "text_config": text})
    alone = model_spec_from_hf("scout-text", {"model_type": "llama4_text", **text})
    assert (composite.total_params, composite.active_params, composite.num_layers) == (
        alone.total_params, alone.active_params, 2)
    with pytest.raises(ValueError, match="give the decoder's fields \\(num_hidden_layers ...\\) under "
                                         "model.hf_config.text_config"):
        model_spec_from_hf("scout", {"model_type": "llama4", "num_hidden_layers": 2, "text_config": text})
    lone = SimpleNamespace(model_type="imaginary", num_hidden_layers=None)
    lone.get_text_config = lambda: lone
    with pytest.raises(ValueError, match="composite \\(multimodal\\) config without a text decoder config"):
        _decoder_config(lone)


def test_fields_transformers_rejects_give_its_reason_not_a_traceback():
    """dots3's config class validates its own fields (a strict dataclass validator): its reason is the message."""
    with pytest.raises(ValueError, match=r"\(dots3_note_text\): transformers rejects these fields: ValueError: "
                                         "num_key_value_heads must match num_attention_heads"):
        model_spec_from_hf("tiny", {"model_type": "dots3_note_text", "num_attention_heads": 4, "num_key_value_heads": 2})


def test_an_empty_cache_variable_falls_back_to_the_user_cache(monkeypatch, tmp_path):
    """HARNESS_MODEL_CACHE= (set but empty) must not write shape files into the working directory."""
    from pathlib import Path

    from harness.config.model_shape import cache_dir

    monkeypatch.setenv("HARNESS_MODEL_CACHE", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "harness" / "model_shapes"
    monkeypatch.setenv("HARNESS_MODEL_CACHE", str(tmp_path / "shapes"))
    assert cache_dir() == Path(tmp_path / "shapes")


def test_a_cached_shape_is_found_without_importing_transformers_and_its_version_is_in_the_key(monkeypatch):
    """Every command plans from the shape cache; the key still changes with the installed transformers, read from
    its package metadata (importing transformers costs each command a second of CPU)."""
    import subprocess
    import sys

    import transformers

    from harness.config import model_shape

    probe = ("import sys; from harness.config.model_shape import shape_key; "
             "print(shape_key({'model_type': 'llama'})); print('transformers' in sys.modules)")
    key, imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                   check=True).stdout.split()
    assert imported == "False"
    assert key == model_shape.shape_key({"model_type": "llama"})
    installed = transformers.__version__
    monkeypatch.setattr(model_shape.importlib.metadata, "version",
                        lambda name: installed + ".post1" if name == "transformers" else "0")
    model_shape._transformers_version.cache_clear()  # read once a process: this one "upgraded" it
    try:
        assert model_shape.shape_key({"model_type": "llama"}) != key
    finally:
        model_shape._transformers_version.cache_clear()
