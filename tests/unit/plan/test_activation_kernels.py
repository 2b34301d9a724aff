"""The attention-kernel rules the activation model follows, against the libraries that make the choice: torch's
SDPA backend selection on CPU and transformers' decision to repeat K / V before SDPA."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.plan.activations import masked_layer_share, sdpa_kernel, sdpa_repeats_kv
from harness.plan.model_spec import model_spec_from_hf

LLAMA = dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
MATH = 0  # torch.nn.attention.SDPBackend.MATH


@pytest.fixture(scope="module")
def llama():
    return model_spec_from_hf("tiny", LLAMA)


@pytest.mark.parametrize("qk_dim,v_dim", [(16, 16), (24, 16), (192, 128)])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("masked", [False, True])
def test_the_cpu_kernel_is_the_one_torch_picks(llama, qk_dim, v_dim, dropout, masked):
    spec = dataclasses.replace(llama, qk_head_dim=qk_dim, v_head_dim=v_dim, attention_dropout=dropout)
    q = torch.randn(1, 4, 64, qk_dim, requires_grad=True)
    v = torch.randn(1, 4, 64, v_dim, requires_grad=True)
    mask = torch.ones(64, 64, dtype=torch.bool).tril()[None, None] if masked else None
    chosen = torch._fused_sdp_choice(q, q, v, attn_mask=mask, dropout_p=dropout)
    assert sdpa_kernel(spec, on_cpu=True) == ("math" if chosen == MATH else "fused")
    assert sdpa_kernel(spec, on_cpu=False) == "fused"  # CUDA's memory-efficient kernel takes both


@pytest.mark.parametrize("qk_dim,v_dim", [(16, 16), (24, 16), (256, 256), (320, 320)])
@pytest.mark.parametrize("masked", [False, True])
def test_kv_repetition_is_transformers_own(llama, qk_dim, v_dim, masked):
    from transformers.integrations.sdpa_attention import use_gqa_in_sdpa

    spec = dataclasses.replace(llama, qk_head_dim=qk_dim, v_head_dim=v_dim)
    key, value = torch.empty(1, 2, 8, qk_dim), torch.empty(1, 2, 8, v_dim)
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool) if masked else None
    assert sdpa_repeats_kv(spec, masked) == (not use_gqa_in_sdpa(mask, key, value))


def test_only_layers_whose_window_or_chunk_is_shorter_than_the_sequence_get_a_mask(llama):
    spec = dataclasses.replace(llama, attention_windows=(32, 0, 32, 0), attention_chunks=(0, 0, 0, 48))
    assert masked_layer_share(spec, 32) == 0.0  # the window covers the sequence: is_causal, no mask
    assert masked_layer_share(spec, 40) == 0.5
    assert masked_layer_share(spec, 64) == 0.75
    assert masked_layer_share(llama, 4096) == 0.0


def test_flash_attention_keeps_no_mask_and_grouped_kv(llama):
    """flash_attention_2 applies windows itself and groups K / V: no mask and no repeated K / V, where SDPA on
    the same windowed layers keeps both."""
    from harness.plan.activations import attention_activations

    windowed = dataclasses.replace(llama, attention_windows=(32, 32))
    sdpa = attention_activations(windowed, "hf", 2, 1, False, 64)
    flash = attention_activations(dataclasses.replace(windowed, attn_implementation="flash_attention_2"), "hf", 2, 1,
                                  False, 64)
    q, kv = llama.num_heads * llama.head_dim, llama.num_kv_heads * llama.head_dim
    assert flash == (2 * (q + 2 * kv) + 4 * llama.num_heads + 2 * q, 0.0, 0.0)
    assert sdpa == (2 * (q + 2 * q) + 4 * llama.num_heads + 2 * q, 0.0, 2)
