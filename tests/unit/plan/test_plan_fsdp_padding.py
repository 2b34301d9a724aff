"""FSDP's padding of uneven shards: the planner's rules against torch's own FSDP1 and FSDP2, built in this
process on a fake process group (torch's FakeStore backend: no collectives run, shapes are real) for
every rank of a 3-rank shard group."""

import functools
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist

from harness.config.compose import compose_run_config
from harness.modeling.model import build_model, decoder_layer_class
from harness.plan.conventions import flat_shard_numel, state_convention
from harness.plan.planner import spec_for
from harness.plan.states import rank_params, rank_states, state_bytes

RANKS = 3
# hidden 60 (6 heads of 10) and vocab 251: no dim 0 and no flat parameter divides by 3, and the norms'
# 60 elements break 8-element (16-byte bf16) alignment inside each unit.
SHAPE = ["model.hf_config.hidden_size=60", "model.hf_config.num_attention_heads=6",
         "model.hf_config.num_key_value_heads=2", "model.hf_config.intermediate_size=100",
         "model.hf_config.vocab_size=251"]  # fmt: skip


@pytest.fixture(scope="module")
def cfg():
    return compose_run_config(["engine=fsdp", "layout.zero_stage=3", f"layout.dp_shard={RANKS}",
                               f"cluster.accelerators_per_node={RANKS}", "layout.precision=fp32", *SHAPE])


@contextmanager
def fake_rank(rank: int):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=RANKS)
    try:
        yield
    finally:
        dist.destroy_process_group()


def fsdp1_shard_numels(cfg, use_orig_params: bool):
    """Each unit's flat-parameter shard, as FullyShardedDataParallel allocates it on this rank."""
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    model = build_model(cfg.model.hf_config, 0)
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={decoder_layer_class(model)})
    wrapped = FullyShardedDataParallel(model, auto_wrap_policy=policy, use_orig_params=use_orig_params,
                                       device_id=torch.device("cpu"),
                                       mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))  # fmt: skip
    return sorted(unit._handle.flat_param.numel() for unit in FullyShardedDataParallel.fsdp_modules(wrapped))


def test_flat_shard_rule_by_hand():
    assert flat_shard_numel([5, 3], 2) == 4  # 8 elements, no padding needed
    assert flat_shard_numel([5, 4], 2) == 5  # 9 -> padded to 10
    assert flat_shard_numel([5, 3], 2, aligned_numel=4) == 6  # 5, pad 3, then 3: 11 -> padded to 12
    assert flat_shard_numel([5], 8) == 1  # fewer elements than ranks: one padded element each


@pytest.mark.parametrize("use_orig_params, aligned", [(False, 0), (True, 8)])
def test_fsdp1_flat_parameter_shards_match_the_rule(cfg, use_orig_params, aligned):
    params = rank_params(spec_for(cfg.model), 1, 1, tuple(range(cfg.model.hf_config["num_hidden_layers"])), True,
                         True, 1, (True, True))  # fmt: skip
    expected = sorted(flat_shard_numel(unit, RANKS, aligned) for unit, count in params.units for _ in range(count))
    for rank in range(RANKS):
        with fake_rank(rank):
            assert fsdp1_shard_numels(cfg, use_orig_params) == expected, rank
    if use_orig_params:  # the alignment shows: more than without it
        assert expected != sorted(flat_shard_numel(u, RANKS) for u, c in params.units for _ in range(c))


def test_planner_predicts_fsdp1_flat_shards(cfg):
    """rank_states for fsdp_version=1 (use_orig_params=False, as rendered) is the sum of the flat shards."""
    with fake_rank(0):
        held = sum(fsdp1_shard_numels(cfg, use_orig_params=False))
    (fsdp1,) = rank_states(spec_for(cfg.model), cfg.layout, "fsdp", fsdp_version=1)
    (fsdp2,) = rank_states(spec_for(cfg.model), cfg.layout, "fsdp")
    assert (fsdp1.param, fsdp1.grad, fsdp1.master + fsdp1.moments) == (4 * held, 4 * held, 8 * held)
    assert fsdp2.param != fsdp1.param  # the FSDP2 rule (dim 0 rows) gives another figure here


def test_fsdp2_shards_are_ceil_dim0_rows_padded_on_every_rank(cfg):
    """fully_shard allocates ceil(d0 / 3) rows on every rank (_fsdp_param.py: padded_sharded_param);
    the DTensor of the last rank is a narrower view of it. The planner predicts the padded storage."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    (planned,) = rank_states(spec_for(cfg.model), cfg.layout, "fsdp")
    for rank in range(RANKS):
        with fake_rank(rank):
            model = build_model(cfg.model.hf_config, 0)
            mesh = init_device_mesh("cpu", (RANKS,))
            layer = decoder_layer_class(model)
            for module in [m for m in model.modules() if isinstance(m, layer)]:
                fully_shard(module, mesh=mesh)
            fully_shard(model, mesh=mesh)
            padded = sum(p._sharded_param_data.numel() for s in fsdp_states(model) for p in s)
            local = sum(p._local_tensor.numel() for p in model.parameters())
        assert 4 * padded == planned.param, rank
        assert local <= padded


def fsdp_states(model):
    """The FSDPParam lists of every fully_shard group in the model."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            if group is not None:
                yield group.fsdp_params


def test_state_bytes_shard_flat_parameters_only_when_sharded(cfg):
    params = rank_params(spec_for(cfg.model), 1, 1, (0, 1), True, True, 1, (True, True))
    conv = state_convention("fsdp", "fp32", 0, fsdp_version=1)
    assert conv.partition == "flat"
    whole = params.dense_total
    assert state_bytes(conv, params, 0, RANKS, RANKS)["param"] == 4 * whole  # NO_SHARD: no padding
    assert state_bytes(conv, params, 3, 1, 1)["param"] == 4 * whole
