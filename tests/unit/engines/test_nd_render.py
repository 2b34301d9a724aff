"""nd.render writes what nd_session.apply reads: nd_plan.json and a torchrun line; every plan entry becomes a torch
ParallelStyle aimed at a module that exists in the family's Hugging Face decoder layer; a one-process apply
trains exactly like the plain model."""

import json
from dataclasses import replace

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
)

from harness.config.compose import compose_run_config
from harness.engines import nd, nd_plans, nd_session
from harness.engines.lm_loss import causal_lm_loss, shifted_labels
from harness.engines.optimizer import ADAMW_BETAS, ADAMW_EPS
from harness.engines.rendered import (
    MASTER_ADDR,
    MASTER_PORT,
    MONITOR_INTERVAL,
    NODE_RANK,
    RANK_PROGRAM,
)
from harness.engines.stage_module import StageModule
from harness.modeling.model import build_model
from harness.plan.parallel_dims import ParallelDims

BASE = compose_run_config(["engine=nd", "layout=single", "layout.precision=fp32", "tracking=disabled"])
BASE_HF = BASE.model.hf_config
FAMILIES = {
    "llama": {},
    "mistral": {"model_type": "mistral"},
    "qwen2": {"model_type": "qwen2"},
    "qwen3": {"model_type": "qwen3", "head_dim": 16},
    "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {"model_type": "qwen3_moe", "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32},
    "olmo2": {"model_type": "olmo2"},
    "phi3": {"model_type": "phi3", "pad_token_id": 0, "eos_token_id": 2},
}


def config(**layout):
    cfg = replace(BASE, layout=replace(BASE.layout, **layout))
    processes = ParallelDims.of(cfg.layout).world_size
    return replace(cfg, cluster=replace(cfg.cluster, accelerators_per_node=processes))


def test_render_writes_the_plan_and_a_torchrun_line(tmp_path):
    cfg = config(tp=2, dp_shard=2, zero_stage=3)
    rendered = nd.render(cfg, tmp_path)
    plan = json.loads((tmp_path / nd.PLAN_FILE).read_text())
    assert plan == json.loads(json.dumps(nd_plans.nd_plan(cfg)))
    assert rendered.files == [nd.PLAN_FILE] and rendered.engine == "nd" and rendered.launcher == "torchrun"
    assert rendered.argv == ["torchrun", "--nnodes", "1", "--nproc_per_node", "4", "--node_rank", NODE_RANK,
                             "--master_addr", MASTER_ADDR, "--master_port", MASTER_PORT, *MONITOR_INTERVAL,
                             *RANK_PROGRAM, str(tmp_path)]  # fmt: skip


def test_render_refuses_what_nd_cannot_run(tmp_path):
    with pytest.raises(ValueError, match="tp=8 must divide num_attention_heads=4"):
        nd.render(config(tp=8), tmp_path)
    assert not (tmp_path / nd.PLAN_FILE).exists()


def test_render_refuses_other_launchers(tmp_path):
    cfg = config(tp=2)
    with pytest.raises(ValueError, match="torchrun"):
        nd.render(replace(cfg, engine=replace(cfg.engine, launcher="accelerate")), tmp_path)


@pytest.mark.parametrize("sp", [False, True])
def test_plan_entries_become_torch_styles(sp):
    plan = nd_plans.layer_tp_plan(BASE_HF, sp)
    styles = {path: nd_session.build_style(spec) for path, spec in plan.items()}
    assert isinstance(styles["self_attn.q_proj"], ColwiseParallel)
    assert isinstance(styles["mlp.down_proj"], RowwiseParallel)
    if sp:
        assert isinstance(styles["input_layernorm"], SequenceParallel)
        assert isinstance(styles["self_attn"], PrepareModuleInput)
        assert styles["mlp.down_proj"].output_layouts == (Shard(1),)
    top = {path: nd_session.build_style(spec) for path, spec in nd_plans.top_tp_plan(sp, True).items()}
    assert top["embed_tokens"].input_layouts == (Replicate(),)
    assert top["lm_head"].output_layouts == (Shard(-1),) and top["lm_head"].use_local_output is False
    moe = nd_session.build_style(nd_plans.layer_tp_plan({**BASE_HF, **FAMILIES["mixtral"]}, True)["mlp"])
    assert isinstance(moe, PrepareModuleInputOutput)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("sp", [False, True])
def test_plan_paths_exist_in_the_hf_decoder_layer(family, sp):
    """Each planned module exists in transformers' layer, and the attention is called as the plan expects."""
    hf = {**BASE.model.hf_config, **FAMILIES[family]}
    from transformers import AutoModelForCausalLM

    from harness.modeling.model import hf_config_object

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config_object(hf))
    layer = model.model.layers[0]
    for path in nd_plans.layer_tp_plan(hf, sp):
        layer.get_submodule(path)
    stage = StageModule(model, [0, 1], True, True, 1)
    for path in nd_plans.top_tp_plan(sp, False):
        assert getattr(stage, path) is not None
    if family == "qwen2":
        assert layer.self_attn.q_proj.bias is not None  # sharded with its columns by ColwiseParallel


def test_stage_modules_hold_only_their_parts():
    model = build_model({**BASE.model.hf_config, "num_hidden_layers": 4}, 0)
    first = StageModule(model, [0, 1], True, False, 1)
    last = StageModule(model, [2, 3], False, True, 1)
    assert first.lm_head is None and first.norm is None and list(first.layers) == ["0", "1"]
    assert last.embed_tokens is None and list(last.layers) == ["2", "3"]
    count = sum(p.numel() for p in first.parameters()) + sum(p.numel() for p in last.parameters())
    assert count == sum(p.numel() for p in model.parameters())


def test_stage_forward_equals_the_hf_forward():
    """Rotary embeddings computed in the stage, no attention mask (SDPA is causal): same logits."""
    model = build_model({**BASE.model.hf_config, "num_hidden_layers": 4}, 0)
    tokens = torch.randint(0, 256, (2, 16))
    first = StageModule(model, [0, 1], True, False, 1)
    last = StageModule(model, [2, 3], False, True, 1)
    torch.testing.assert_close(last(first(tokens)), model(input_ids=tokens).logits, rtol=0, atol=0)
    loss = causal_lm_loss(model(input_ids=tokens).logits, shifted_labels(tokens))
    torch.testing.assert_close(loss, model(input_ids=tokens, labels=tokens).loss)


@pytest.fixture
def one_process_group(monkeypatch):
    import torch.distributed as dist

    from harness.launch.local import free_port

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_one_process_apply_trains_like_the_plain_model(tmp_path, one_process_group):
    from harness.modeling.device import DeviceKind

    cfg = config()
    nd.render(cfg, tmp_path)
    bench = cfg.bench
    reference = build_model(cfg.model.hf_config, bench.seed)
    optimizer = torch.optim.AdamW(reference.parameters(), lr=bench.lr, betas=ADAMW_BETAS,
                                  eps=ADAMW_EPS, weight_decay=bench.weight_decay)  # fmt: skip
    session = nd_session.apply(cfg, tmp_path, build_model(cfg.model.hf_config, bench.seed), DeviceKind("cpu", "gloo"))
    assert (session.dp_rank, session.dp_size) == (0, 1)
    generator = torch.Generator().manual_seed(0)
    for step in range(3):
        batches = [torch.randint(0, 256, (2, 32), generator=generator) for _ in range(2)]
        state = {}
        got = session.train_step(iter(batches), on_boundary=lambda: state.update(session.state_bytes()))
        want = []
        for tokens in batches:
            loss = reference(input_ids=tokens, labels=tokens).loss
            (loss / len(batches)).backward()
            want.append(loss.detach())
        torch.nn.utils.clip_grad_norm_(reference.parameters(), bench.grad_clip)
        optimizer.step()
        optimizer.zero_grad()
        torch.testing.assert_close(got, torch.stack(want).mean(), rtol=1e-6, atol=0)
    assert state == {**nd_plans.predicted_state_bytes(cfg.model.hf_config, cfg.layout, 0), "host_bytes": 0}
