"""Meta-device construction: no storage at build time; materialising gives the model's own initialisation."""

import math

import pytest
import torch

from harness.config.compose import compose_run_config
from harness.engines.materialize import materialize
from harness.modeling.model import build_model

FIELDS = compose_run_config([]).model.hf_config


def test_build_on_meta_allocates_no_parameter():
    model = build_model(FIELDS, 0, on_meta=True)
    assert all(p.is_meta for p in model.parameters())


def test_materialised_model_is_initialised_like_a_full_build():
    full = build_model(FIELDS, 0)
    model = build_model(FIELDS, 0, on_meta=True)
    materialize(model, model, torch.device("cpu"), seed=0)
    assert not any(p.is_meta for p in (*model.parameters(), *model.buffers()))
    std = FIELDS["initializer_range"]
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.equal(param, torch.ones_like(param)), name
        else:
            assert abs(param.std().item() - std) < 0.15 * std, name  # normal(0, initializer_range)
    assert torch.equal(model.model.rotary_emb.inv_freq, full.model.rotary_emb.inv_freq)
    tokens = torch.randint(0, FIELDS["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=tokens, labels=tokens).loss.item()
    assert abs(loss - math.log(FIELDS["vocab_size"])) < 0.02 * math.log(FIELDS["vocab_size"])  # untrained: ln V


def test_materialising_only_a_part_leaves_the_rest_on_meta():
    model = build_model(FIELDS, 0, on_meta=True)
    materialize(model.model.layers[0], model, torch.device("cpu"), seed=0)
    assert not any(p.is_meta for p in model.model.layers[0].parameters())
    assert all(p.is_meta for p in model.model.layers[1].parameters())


def test_materialising_keeps_tied_embeddings_one_parameter():
    """Tied input and output embeddings stay one tensor: to_empty gives every module its own copy, which
    would train two matrices and hold a second one's gradient and Adam state."""
    tied = {**FIELDS, "tie_word_embeddings": True}
    model = build_model(tied, 0, on_meta=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    materialize(model, model, torch.device("cpu"), seed=0)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert len(list(model.parameters())) == len(list(build_model(tied, 0).parameters()))


def test_an_initialised_models_loss_on_uniform_tokens_starts_where_the_band_says():
    """ln V + initializer_range^2 * hidden / 2: a model wide enough that the term is 1 % of the loss."""
    from harness.runtime.reference import initialised_loss_band

    fields = {**FIELDS, "hidden_size": 512, "intermediate_size": 1024, "vocab_size": 32000,
              "num_attention_heads": 8, "num_key_value_heads": 4}
    model = build_model(fields, 0)
    # 2048 tokens: the mean loss varies by about the logits' spread / sqrt(2048) = 0.45 / 45 = 0.01
    tokens = torch.randint(0, fields["vocab_size"], (8, 256), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        loss = float(model(input_ids=tokens, labels=tokens).loss)
    low, high = initialised_loss_band(fields)
    assert high - low == pytest.approx(0.02**2 * 512 / 2)
    assert loss == pytest.approx(high, abs=0.04) and loss > low + 0.06
