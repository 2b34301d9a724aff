"""FLOPs per token against published formulas and figures: PaLM, Megatron-LM, Kaplan, torchtitan."""

from __future__ import annotations

import dataclasses

import pytest

from harness.plan.flops import FlopConvention, flops_per_token, forward_flops_per_token, recompute_flops_per_token
from harness.plan.model_spec import model_spec_from_hf
from harness.plan.utilization import hfu, mfu, tokens_per_step
from plan_helpers import REAL_SHAPES

FULL = FlopConvention("full", True)
CAUSAL = FlopConvention("causal", True)
KAPLAN = FlopConvention("causal", False)


def gpt(h=12288, layers=96, heads=96, vocab=51200, seq=2048):
    """A GPT-3-shaped model through the gpt2 code path: LayerNorm + biases, 4h GELU MLP, tied head."""
    return model_spec_from_hf("gpt", dict(model_type="gpt2", n_embd=h, n_layer=layers, n_head=heads,
                                          vocab_size=vocab, n_positions=seq))


def test_torchtitan_formula_for_llama3_8b():
    # torchtitan get_num_flop_per_token: 6 * (params - nn.Embedding params) + 12 * l * h * q * t.
    spec = model_spec_from_hf("llama3_1_8b", REAL_SHAPES["llama3_1_8b"])
    for seq in (2048, 8192):
        expected = 6 * (spec.total_params - spec.embedding_params) + 12 * 32 * 32 * 128 * seq
        assert flops_per_token(spec, seq, FULL) == expected


def test_palm_appendix_b_formula_for_a_tied_model():
    # PaLM (Chowdhery et al. 2022, appendix B): 6N + 12LHQT, N all parameters of a model whose input
    # embedding is its output projection (a lookup costs nothing, the projection is counted once).
    fields = dict(REAL_SHAPES["tiny_llama"], tie_word_embeddings=True, num_hidden_layers=3)
    spec = model_spec_from_hf("tied", fields)
    assert flops_per_token(spec, 128, FULL) == 6 * spec.total_params + 12 * 3 * 4 * 16 * 128


def test_palm_540b_mfu_46_2_percent():
    # PaLM 540B: 118 layers, 48 heads of 256, T = 2048, 540.35B parameters, shared 256k x 18432 embedding;
    # 238.3k tokens/s on 6144 TPU v4 (275 TFLOP/s bf16) = 46.2% MFU (PaLM table 3 / appendix B).
    base = model_spec_from_hf("palm", dict(REAL_SHAPES["tiny_llama"], tie_word_embeddings=True))
    vocab, hidden, layers = 256_000, 18_432, 118
    per_layer = (540.35e9 - vocab * hidden) / layers
    palm = dataclasses.replace(base, num_layers=layers, num_heads=48, head_dim=256, hidden_size=hidden,
                               vocab_size=vocab, active_layer_params=per_layer, final_norm_params=0,
                               layer_active_params=(per_layer,) * layers, attention_windows=(0,) * layers,
                               attention_chunks=(0,) * layers, qk_head_dim=256, v_head_dim=256)
    per_token = flops_per_token(palm, 2048, FULL)
    assert per_token == pytest.approx(6 * 540.35e9 + 12 * 118 * 48 * 256 * 2048)
    assert round(mfu(238.3e3, per_token, 275e12, 6144), 3) == 0.462


def test_megatron_hardware_flops_with_full_recompute():
    # Narayanan et al. 2021 (Megatron-LM, sec. 5.1), per token with activation recomputation:
    # 96·l·h²·(1 + s/(6h) + V/(16·l·h)), counting matmuls only. Our count also covers the O(h) LayerNorm
    # and bias parameters (13h per layer, 2h final LN): the difference is exactly 8·13·l·h + 6·2·h.
    h, layers, vocab, seq = 12288, 96, 51200, 2048
    spec = gpt(h, layers, 96, vocab, seq)
    hardware = flops_per_token(spec, seq, FULL) + recompute_flops_per_token(spec, seq, FULL, "full")
    megatron = 96 * layers * h**2 * (1 + seq / (6 * h) + vocab / (16 * layers * h))
    assert hardware - (8 * 13 * layers * h + 6 * 2 * h) == pytest.approx(megatron, rel=1e-12)


def test_korthikanti_model_flops_without_recompute():
    # Korthikanti et al. 2022 (sec. 6, model FLOPs): 72·l·h²·(1 + s/(6h) + V/(12·l·h)) per token.
    h, layers, vocab, seq = 12288, 96, 51200, 2048
    model = flops_per_token(gpt(h, layers, 96, vocab, seq), seq, FULL)
    korthikanti = 72 * layers * h**2 * (1 + seq / (6 * h) + vocab / (12 * layers * h))
    assert model - 6 * (13 * layers * h + 2 * h) == pytest.approx(korthikanti, rel=1e-12)
    # Full recomputation makes it 4/3 of that at scale (their HFU vs MFU).
    hardware = model + recompute_flops_per_token(gpt(h, layers, 96, vocab, seq), seq, FULL, "full")
    assert hardware / model == pytest.approx(4 / 3, rel=0.01)


def test_kaplan_forward_count():
    # Kaplan et al. 2020, table 1: C_forward = 2N + 2·n_layer·n_ctx·d_attn with N = 12·n_layer·d² (no
    # biases, no embeddings, no de-embedding): the causal convention without the lm_head, x3 for training.
    h, layers, seq = 1024, 24, 1024
    spec = gpt(h, layers, 16, 50257, seq)
    kaplan_forward = 2 * 12 * layers * h**2 + 2 * layers * seq * h
    assert flops_per_token(spec, seq, KAPLAN) - 6 * (13 * layers * h + 2 * h) == 3 * kaplan_forward


def test_six_n_approximation_holds_for_large_models():
    # Kaplan / Chinchilla C ~ 6·N·D: at 70B and T = 2048 attention adds ~1% and the lm_head is inside N.
    spec = model_spec_from_hf("llama3_1_70b", REAL_SHAPES["llama3_1_70b"])
    assert flops_per_token(spec, 2048, CAUSAL) / (6 * spec.non_embedding_params) == pytest.approx(1, abs=0.02)


def test_gqa_counts_smaller_kv_projections():
    mha = model_spec_from_hf("mha", dict(REAL_SHAPES["llama3_1_8b"], num_key_value_heads=32))
    gqa = model_spec_from_hf("gqa", REAL_SHAPES["llama3_1_8b"])
    # k and v: 2 x h x (32 - 8) x 128 fewer weights per layer, 6 FLOPs each
    assert flops_per_token(mha, 4096, CAUSAL) - flops_per_token(gqa, 4096, CAUSAL) == 6 * 32 * 2 * 4096 * 24 * 128


def test_swiglu_has_three_matrices_gelu_two():
    swiglu = model_spec_from_hf("s", REAL_SHAPES["tiny_llama"])
    gelu = model_spec_from_hf("g", dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, n_inner=128,
                                        vocab_size=256, n_positions=128))
    assert swiglu.expert_params == 3 * 64 * 128
    assert gelu.expert_params == 2 * 64 * 128 + 128 + 64  # with fc/proj biases
    f_swiglu = forward_flops_per_token(swiglu, 64, CAUSAL)
    assert f_swiglu.layers == 2 * 2 * swiglu.active_layer_params


def test_moe_counts_active_experts_and_router():
    spec = model_spec_from_hf("mixtral_8x7b", REAL_SHAPES["mixtral_8x7b"])
    per_token = flops_per_token(spec, 4096, CAUSAL)
    layer = spec.attention_params + spec.norm_params + spec.router_params + 2 * spec.expert_params
    assert per_token == 6 * (32 * layer + spec.final_norm_params + 32000 * 4096) + 6 * 32 * 32 * 128 * 4096
    assert per_token < 6 * spec.total_params / 3  # 2 of 8 experts


def test_lm_head_in_or_out_and_tied_or_untied():
    untied = model_spec_from_hf("u", REAL_SHAPES["tiny_llama"])
    tied = model_spec_from_hf("t", dict(REAL_SHAPES["tiny_llama"], tie_word_embeddings=True))
    head = 6 * 256 * 64
    assert flops_per_token(untied, 64, CAUSAL) - flops_per_token(untied, 64, KAPLAN) == head
    assert flops_per_token(tied, 64, CAUSAL) - flops_per_token(tied, 64, KAPLAN) == head
    # the tied head is still a matmul: same FLOPs, fewer parameters
    assert flops_per_token(tied, 64, CAUSAL) == flops_per_token(untied, 64, CAUSAL)


def test_causal_halves_attention_and_grows_linearly_with_sequence():
    spec = model_spec_from_hf("llama3_1_8b", REAL_SHAPES["llama3_1_8b"])
    attention_full = 12 * 32 * 32 * 128 * 8192
    assert flops_per_token(spec, 8192, FULL) - flops_per_token(spec, 8192, CAUSAL) == attention_full / 2
    assert flops_per_token(spec, 8192, CAUSAL) - flops_per_token(spec, 4096, CAUSAL) == 6 * 32 * 32 * 128 * 4096


def test_recompute_flops():
    spec = model_spec_from_hf("llama3_1_8b", REAL_SHAPES["llama3_1_8b"])
    forward = forward_flops_per_token(spec, 4096, CAUSAL)
    assert recompute_flops_per_token(spec, 4096, CAUSAL, "none") == 0
    assert recompute_flops_per_token(spec, 4096, CAUSAL, "selective") == forward.attention_core
    assert forward.attention_core == 2 * 32 * 32 * 128 * 4096
    assert recompute_flops_per_token(spec, 4096, CAUSAL, "full") == forward.layers + forward.attention_core
    with pytest.raises(ValueError, match="activation_checkpointing='some'"):
        recompute_flops_per_token(spec, 4096, CAUSAL, "some")


def test_convention_name_travels():
    assert FULL.name == "6N+12LHQT:attn=full:lm_head"
    assert KAPLAN.name == "6N+6LHQT:attn=causal:no_lm_head"
    assert dataclasses.asdict(CAUSAL)["name"] == "6N+6LHQT:attn=causal:lm_head"
    with pytest.raises(ValueError, match="attention='sliding'"):
        FlopConvention("sliding")


def test_tokens_per_step_counts_data_parallel_replicas_only():
    assert tokens_per_step(micro_batch=2, grad_accum=4, dp_replicate=2, dp_shard=8, seq_len=4096) == 2 * 4 * 16 * 4096


def test_mfu_and_hfu():
    assert mfu(1000.0, 6e9, 1e12, 8) == pytest.approx(1000 * 6e9 / 8e12)
    assert hfu(1000.0, 6e9, 2e9, 1e12, 8) == pytest.approx(1000 * 8e9 / 8e12)
    assert mfu(1000.0, 6e9, None, 8) is None and hfu(1000.0, 6e9, 0.0, None, 8) is None


@pytest.mark.parametrize("seq_len,window", [(64, 0), (64, 16), (64, 64), (64, 100), (50, 7)])
def test_keys_per_query_against_a_counted_mask(seq_len, window):
    """Causal: the mask's kept (query, key) pairs over T, less the half diagonal (min(T, w)/2 pairs) the
    continuous limit leaves out (T/2 rather than (T+1)/2, as 6LHQT counts). Full: min(T, w) per query."""
    from harness.plan.flops import keys_per_query

    w = window or seq_len
    kept = sum(min(i + 1, w) for i in range(seq_len))  # query i sees keys max(0, i-w+1) .. i
    half_diagonal = min(w, seq_len) / 2
    assert keys_per_query(seq_len, window, "causal") == pytest.approx((kept - half_diagonal) / seq_len, rel=1e-12)
    assert keys_per_query(seq_len, window, "full") == min(seq_len, w)


@pytest.mark.parametrize("seq_len, chunk", [(64, 16), (70, 16), (16, 64), (8192, 8192), (10000, 8192)])
def test_chunked_keys_per_query_against_a_counted_mask(seq_len, chunk):
    """Chunked attention (Llama 4): query i sees keys from the start of its chunk to i. Causal: the kept pairs
    less the half diagonal (T/2) over T; full: every pair of each chunk's block."""
    from harness.plan.flops import keys_per_query

    kept = sum(i % chunk + 1 for i in range(seq_len))
    blocks = sum(min(chunk, seq_len - start) ** 2 for start in range(0, seq_len, chunk))
    assert keys_per_query(seq_len, 0, "causal", chunk) == pytest.approx((kept - seq_len / 2) / seq_len, rel=1e-12)
    assert keys_per_query(seq_len, 0, "full", chunk) == pytest.approx(blocks / seq_len, rel=1e-12)


@pytest.mark.parametrize("seq_len, rate, topk", [(16, 4, 0), (16, 4, 2), (13, 4, 8), (3, 8, 0), (4096, 128, 0),
                                                 (4096, 4, 512), (1000, 3, 5)])
def test_compressed_keys_per_query_against_the_block_bias(seq_len, rate, topk):
    """DeepSeek-V4's compressed entries: query t sees entry w once its window is complete, w < (t + 1) // m (the
    compressor's block bias), at most topk of them in a CSA layer. Causal: those pairs over T; full: every entry."""
    from harness.plan.flops import compressed_keys_per_query

    entries = seq_len // rate
    cap = topk or entries
    kept = sum(min(sum(1 for w in range(entries) if w < (t + 1) // rate), cap) for t in range(seq_len))
    assert compressed_keys_per_query(seq_len, rate, topk, "causal") == pytest.approx(kept / seq_len, rel=1e-12)
    assert compressed_keys_per_query(seq_len, rate, topk, "full") == min(entries, cap)
    assert compressed_keys_per_query(seq_len, 0, topk, "causal") == 0.0
