"""Per-rank memory: the ZeRO paper, DeepSpeed's own estimators, Korthikanti et al., measured tensors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config.schema import LayoutConfig, engine_config
from harness.plan.activations import (STAGED_SCHEDULES, distinct_moments, inflight_microbatches, layer_activations,
                                      rank_activation_bytes, split_backward_moments, staged_moments,
                                      token_activations)
from harness.plan.conventions import STATE_CONVENTIONS, StateConvention, partition_numel, state_convention
from harness.plan.conventions import DEEPSPEED_BUCKET_NUMEL
from harness.plan.memory import Allowance, allowance_bytes, deepspeed_bucket_bytes, memory_per_rank
from harness.plan.pipeline import rank_layers, rank_stages, stage_layer_counts
from harness.plan.states import RankParams, place_states, rank_params, state_bytes
from harness.plan.model_spec import model_spec_from_hf
from harness.plan.planner import make_plan
from plan_helpers import REAL_SHAPES, meta_model, run_config

DEEPSPEED_BF16 = STATE_CONVENTIONS[("deepspeed", "bf16")]


def one_tensor(total: int, largest_layer: int = 0) -> RankParams:
    return RankParams(((total, total, 1),), total, (), 0, largest_layer, 0, True, True)


def placed(total: int, shards: int, zero: int, largest_layer: int = 0, conv: StateConvention = DEEPSPEED_BF16,
           offload_optimizer: str = "none", offload_params: str = "none"):
    layout = LayoutConfig(dp_shard=shards, zero_stage=zero, offload_optimizer=offload_optimizer,
                          offload_params=offload_params)
    st = place_states(conv, one_tensor(total, largest_layer), layout, 0)
    device = st.param + st.grad + st.master + st.moments + st.optimizer_grad + st.gathered
    return device, st


@pytest.mark.parametrize("zero, printed_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_7_5b_on_64_gpus(zero, printed_gb):
    # Rajbhandari et al. 2020, figure 1: Psi = 7.5B, N_d = 64, K = 12 (2 + 2 + 12 bytes per parameter).
    paper = StateConvention(2, 2, 4, 8, partition="even")
    states = state_bytes(paper, one_tensor(7_500_000_000), zero, 64, 64)
    total = states["param"] + states["grad"] + states["master"] + states["moments"]
    assert round(total / 1e9, 1) == printed_gb


SHAPES = [  # (parameters, GPUs per node, nodes, largest layer); parameters divisible by 2 x GPUs
    (7_500_000_000, 8, 8, 200_000_000),
    (1_000_000_000, 4, 1, 50_000_000),
    (70_553_706_496, 8, 8, 1_050_673_152),
    (8_030_261_248, 2, 1, 525_336_576),
]


@pytest.mark.parametrize("total, per_node, nodes, largest", SHAPES)
def test_deepspeed_zero2_estimator(total, per_node, nodes, largest):
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    n = per_node * nodes
    _, gpu = estimate_zero2_model_states_mem_needs(total, per_node, nodes, cpu_offload=False)
    device, _ = placed(total, n, 2)
    # DeepSpeed's comment: 2 params_16bit + (2 grads_16bit + 4 grads_32bit + 4 params_32bit + 8 optimizer) / N.
    # The 4-byte fp32 gradient partition is the copy stage_1_and_2 makes for the optimizer step, freed right
    # after it; this table keeps the 2 + 2 + 12 of the ZeRO paper and leaves that transient to the
    # allowance. So DeepSpeed = ours + 4 bytes x partitioned parameters, exactly.
    assert gpu == device + 4 * total // n
    cpu, gpu = estimate_zero2_model_states_mem_needs(total, per_node, nodes, cpu_offload=True)
    device, st = placed(total, n, 2, offload_optimizer="cpu")
    assert gpu == device == 2 * total  # only the 16-bit weights stay on the GPU
    if n <= 4:  # beyond 4 GPUs DeepSpeed sizes host memory for a full fp32 copy per process at load time
        # master 4 + moments 8 + fp32 gradients 4 per partitioned parameter, x its additional_buffer_factor
        assert cpu == int(1.5 * st.host * per_node)


@pytest.mark.parametrize("total, per_node, nodes, largest", SHAPES)
def test_deepspeed_zero3_estimator(total, per_node, nodes, largest):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    n = per_node * nodes
    _, gpu, largest_bytes = estimate_zero3_model_states_mem_needs(total, largest, per_node, nodes,
                                                                  cpu_offload=False)
    device, st = placed(total, n, 3, largest)
    assert st.gathered == largest_bytes == 4 * largest  # 16-bit params + grads of the gathered layer
    # DeepSpeed counts 18 bytes per partitioned parameter: 2 grads_16bit + 4 grads_32bit + 4 params_32bit +
    # 8 optimizer, i.e. the transient fp32 gradient (+4) and not the 16-bit parameter partition (-2) the
    # model keeps (ds_tensor): ours (2 + 2 + 4 + 8 = 16) + 2 bytes per partitioned parameter.
    assert gpu == device + 2 * total // n
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(total, largest, per_node, nodes, cpu_offload=True,
                                                        cpu_offload_params=False)
    device, st = placed(total, n, 3, largest, offload_optimizer="cpu")
    assert gpu == device  # the 16-bit partition and the gathered layer
    assert cpu == int(1.5 * st.host * per_node)  # 16 bytes per partitioned parameter per node, x 1.5
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(total, largest, per_node, nodes, cpu_offload=True,
                                                        cpu_offload_params=True)
    device, st = placed(total, n, 3, largest, offload_optimizer="cpu", offload_params="cpu")
    assert gpu == device == 4 * largest
    assert cpu == int(1.5 * st.host * per_node)  # 18 bytes per partitioned parameter per node, x 1.5


def test_deepspeed_figures_recorded_in_measured_md():
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    _, zero2 = estimate_zero2_model_states_mem_needs(7_500_000_000, 8, 8, cpu_offload=False)
    _, zero3, _ = estimate_zero3_model_states_mem_needs(7_500_000_000, 0, 8, 8, cpu_offload=False)
    assert (round(zero2 / 2**30, 2), round(zero3 / 2**30, 2)) == (15.93, 1.96)


def test_deepspeed_tiny_llama_probe():
    # DeepSpeed 0.19.8 on 2 CPU ranks, tiny_llama (106,816 parameters), bytes of each state on a rank:
    # bit16_groups_flat, single_partition_of_fp32_groups / fp32_partitioned_groups_flat, optimizer.state.
    def states(zero, precision):
        memory = make_plan(run_config(zero_stage=zero, precision=precision)).memory
        return memory.param_bytes, memory.master_bytes, memory.moment_bytes

    assert states(1, "bf16") == states(2, "bf16") == (213_632, 213_632, 427_264)
    assert states(1, "fp32") == (427_264, 213_632, 427_264)
    assert states(3, "bf16") == (106_816, 213_632, 427_264)
    assert make_plan(run_config(zero_stage=3)).memory.grad_bytes == 106_816  # grad_partitions_flat_buffer
    assert states(0, "fp32") == (427_264, 0, 854_528)  # plain torch AdamW


def test_partition_rules():
    assert partition_numel("even", (), 15, 2, True, 3) == 8
    assert partition_numel("dim0", ((15, 5, 1),), 15, 2, True, 3) == 9  # ceil(5 / 2) rows of 3
    assert partition_numel("dim0", ((15, 5, 4),), 60, 2, True, 3) == 36  # four such tensors
    assert partition_numel("deepspeed", ((5, 5, 1), (3, 3, 1)), 8, 2, True, 3) == 3 + 2  # each padded to N
    assert partition_numel("deepspeed", (), 5, 2, True, 2) == 4  # flat group padded to 2 x N = 4 -> 8
    assert partition_numel("deepspeed", (), 5, 2, False, 1) == 8  # the 16-bit flat buffer, padded too
    assert partition_numel("deepspeed", (), 5, 2, False, 0) == 5  # no flattening without ZeRO


def test_offload_moves_states_to_host_or_nvme():
    cfg = run_config(zero_stage=3, offload_optimizer="cpu", offload_params="cpu")
    on_device = make_plan(run_config(zero_stage=3)).memory
    moved = make_plan(cfg).memory
    assert moved.param_bytes == moved.master_bytes == moved.moment_bytes == moved.grad_bytes == 0
    # parameters (2) + master (4) + moments (8) + the 16-bit gradient partition (2) per partitioned
    # parameter: ZeRO-3 keeps its gradient buffer in the accumulation dtype, moved to the host
    assert moved.host_bytes == (on_device.param_bytes + on_device.master_bytes + on_device.moment_bytes
                                + on_device.grad_bytes)
    zero2 = make_plan(run_config(zero_stage=2, offload_optimizer="cpu")).memory
    zero2_on_device = make_plan(run_config(zero_stage=2)).memory
    # ZeRO-1/2 offload reduces straight into the fp32 host partition: 4 bytes per partitioned gradient
    assert zero2.host_bytes == (zero2_on_device.master_bytes + zero2_on_device.moment_bytes
                                + 2 * zero2_on_device.grad_bytes)
    nvme = make_plan(run_config(zero_stage=3, offload_optimizer="nvme", offload_params="nvme",
                                nvme_path="/local")).memory
    # DeepSpeed swaps only partitions of >= 1 MiB: all of tiny_llama's stay in host memory, as with cpu
    assert nvme.nvme_bytes == 0 and nvme.host_bytes == moved.host_bytes


def test_tensor_pipeline_and_expert_division():
    spec = model_spec_from_hf("tiny", REAL_SHAPES["tiny_llama"])
    h, vocab, norms = 64, 256, spec.norm_params
    whole = rank_params(spec, 1, 1, (0, 1), True, True, 1, (True, True))
    assert whole.dense_total == spec.total_params
    split = rank_params(spec, 2, 1, (0, 1), True, True, 1, (True, True))  # Megatron: vocab-parallel too
    assert split.dense_total == 2 * ((spec.layer_params - norms) // 2 + norms) + vocab * h + h
    first = rank_params(spec, 1, 1, (0,), True, False, 2, (True, True))
    last = rank_params(spec, 1, 1, (1,), False, True, 2, (True, True))
    assert first.dense_total == spec.layer_params + vocab * h  # embedding on the first stage
    assert last.dense_total == spec.layer_params + h + vocab * h  # final norm + lm_head on the last
    tied = model_spec_from_hf("tied", dict(REAL_SHAPES["tiny_llama"], tie_word_embeddings=True))
    assert rank_params(tied, 1, 1, (1,), False, True, 2, (True, True)).dense_total == tied.layer_params + h + vocab * h
    moe = model_spec_from_hf("moe", dict(model_type="mixtral", hidden_size=64, intermediate_size=96,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         vocab_size=256, num_local_experts=4, num_experts_per_tok=2))
    assert rank_params(moe, 1, 2, (0, 1), True, True, 1, (True, True)).expert_total == 2 * 2 * moe.expert_params


# DeepSeek-V3's shape at toy size: dense MLP in the first `first_k_dense_replace` layers, routed + shared
# experts after them.
DENSE_FIRST_MOE = dict(model_type="deepseek_v3", vocab_size=256, hidden_size=64, intermediate_size=96,
                       moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                       n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, kv_lora_rank=16,
                       q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, head_dim=8,
                       n_group=1, topk_group=1, max_position_embeddings=128)


@pytest.mark.parametrize("dense_layers", [1, 3])
def test_pipeline_ranks_hold_their_own_layer_kinds(dense_layers):
    """Under pp=2 each rank holds the parameters of its own layers, counted on the meta model: a dense-first
    MoE model's stages differ (one representative layer times the stage's layer count would not)."""
    fields = dict(DENSE_FIRST_MOE, first_k_dense_replace=dense_layers)
    spec = model_spec_from_hf("dense_first_moe", fields)
    model = meta_model(fields)
    layer_numel = [sum(p.numel() for p in layer.parameters()) for layer in model.model.layers]
    assert len(set(layer_numel)) == 2
    embedding, norm = (sum(p.numel() for p in module.parameters()) for module in (model.model.embed_tokens,
                                                                                 model.model.norm))
    counts = stage_layer_counts(4, 2, 1)
    for rank, ends in ((0, embedding), (1, norm + model.lm_head.weight.numel())):
        layers = rank_layers(counts, rank_stages("1F1B", 2, 1, rank))
        params = rank_params(spec, 1, 1, layers, rank == 0, rank == 1, 2, (True, True))
        assert params.dense_total + params.expert_total == sum(layer_numel[i] for i in layers) + ends, rank



def test_forward_only_parameters_hold_no_fsdp2_gradient_or_adam_state():
    """DeepSeek Sparse Attention's indexer runs under no_grad: FSDP2 keeps no gradient or Adam state for it,
    DeepSpeed's flat partitions do (both measured in tests/families/test_family_runs.py)."""
    fields = dict(DENSE_FIRST_MOE, model_type="deepseek_v32", first_k_dense_replace=1, index_topk=8,
                  index_n_heads=2, index_head_dim=16)
    spec = model_spec_from_hf("dsa", fields)
    indexer = sum(p.numel() for name, p in meta_model(fields).named_parameters() if ".indexer." in name)
    assert indexer > 0 and spec.decoder_forward_only_params == indexer
    params = rank_params(spec, 1, 1, tuple(range(4)), True, True, 1, (True, True))
    fsdp2 = state_bytes(state_convention("fsdp", "fp32", 3), params, 3, 1, 1)
    assert (fsdp2["param"], fsdp2["grad"], fsdp2["moments"]) == (
        4 * spec.total_params, 4 * (spec.total_params - indexer), 8 * (spec.total_params - indexer))
    zero3 = state_bytes(state_convention("deepspeed", "fp32", 3), params, 3, 1, 1)
    assert (zero3["grad"], zero3["moments"]) == (4 * spec.total_params, 8 * spec.total_params)


# Korthikanti et al. 2022 on GPT-3 175B shapes (h = 12288, a = 96, s = 2048), 16-bit, dropout on.
H, A, S, T = 12288, 96, 2048, 8


def korthikanti(**kw):
    spec = model_spec_from_hf("gpt3", dict(model_type="gpt2", n_embd=H, n_layer=96, n_head=A, vocab_size=51200,
                                           n_positions=S, attn_implementation="eager"))
    args = dict(tp=1, sequence_parallel=False, loss_parallel=False, checkpointing="none", seq_len=S, cp=1)
    args.update(kw)
    return token_activations(spec, "megatron", "bf16", False, **args).layer


def test_korthikanti_per_layer_activations():
    assert korthikanti() == 34 * H + 5 * A * S  # eq. (1): sbh(34 + 5as/h)
    assert korthikanti(tp=T) == pytest.approx(10 * H + 24 * H / T + 5 * A * S / T)  # eq. (2), TP
    assert korthikanti(tp=T, sequence_parallel=True) == pytest.approx((34 * H + 5 * A * S) / T)  # eq. (4), TP+SP
    assert korthikanti(tp=T, sequence_parallel=True, checkpointing="selective") == pytest.approx(34 * H / T)
    assert korthikanti(tp=T, sequence_parallel=True, checkpointing="full") == pytest.approx(2 * H / T)


def test_flash_variant_has_no_quadratic_term():
    spec = model_spec_from_hf("llama", REAL_SHAPES["llama3_1_8b"])  # sdpa by default
    assert layer_activations(spec, "hf", 2, 1).quadratic == 0
    eager = model_spec_from_hf("llama", dict(REAL_SHAPES["llama3_1_8b"], attn_implementation="eager"))
    assert layer_activations(eager, "hf", 2, 1).quadratic == 4 * 32 + 2 * 32  # fp32 softmax + bf16 copy


def test_pipeline_microbatches_in_flight():
    assert inflight_microbatches("1F1B", 1, 1, 8, 0) == 1
    assert inflight_microbatches("GPipe", 4, 1, 8, 0) == 8
    assert [inflight_microbatches("1F1B", 4, 1, 8, r) for r in range(4)] == [4, 3, 2, 1]
    # Korthikanti et al. 2022, sec. 4.2.3: interleaving multiplies rank 0's memory by 1 + (p - 1) / (p·v)
    p, v = 4, 2
    assert inflight_microbatches("Interleaved1F1B", p, v, 8, 0) / p == 1 + (p - 1) / (p * v)
    # DualPipeV holds 2p+1 chunks of half a rank's layers (see split_backward_moments)
    assert inflight_microbatches("DualPipeV", 4, 2, 16, 0) == 4.5


def test_split_backward_moments_follow_torch_orders():
    # ZB-V, p=2, m=4, rank 0 (stages 0 and 3): F0 x3, then (F3 I3 W3) x2, then F0 I0 W0 F3 I3 W3 ...:
    # after the third F0 and first F3 it holds (3, 1) with that F3's loss, after the fourth F0 (4, 0).
    assert split_backward_moments("ZBVZeroBubble", 2, 2, 4, 0) == (((4, 0), 0), ((3, 1), 1))
    # rank 1 (stages 1 and 2): F1 F2 F1 F2, I2 W2, F1 ...: (2, 2), then (3, 1); the loss is on rank 0
    assert split_backward_moments("ZBVZeroBubble", 2, 2, 4, 1) == (((3, 1), 0), ((2, 2), 0))
    assert split_backward_moments("ZBVZeroBubble", 4, 2, 3, 0) == (((3, 0), 0), ((3, 1), 1))  # m caps
    # DualPipeV, p=2, rank 0: F0 F0 F0 F3 I3 W3 F3, then F0 overlapped with B3: (4, 1) with F3's loss
    assert split_backward_moments("DualPipeV", 2, 2, 4, 0) == (((4, 1), 1),)
    assert split_backward_moments("DualPipeV", 2, 2, 4, 1) == (((3, 2), 0),)
    # InterleavedZeroBubble, p=2, v=2, m=4 (rounds of 2): rank 1 warms up F1.0 F1.1, then per op F, I
    # and one op late W: F3.0 -> (2,1), F3.1 -> (2,2) with two losses before I3.1, F1.2 after W3.0 ...
    ranks = [split_backward_moments("InterleavedZeroBubble", 2, 2, 4, r) for r in (0, 1)]
    assert ranks[1][:4] == (((1, 0), 0), ((2, 0), 0), ((2, 1), 1), ((2, 2), 1))
    # every rank holds p micro-batches at most, where Interleaved1F1B's rank 0 holds 2.5
    assert [max(sum(c) for c, _ in moments) for moments in ranks] == [4, 4]
    assert inflight_microbatches("InterleavedZeroBubble", 4, 2, 8, 0) == 4


@settings(max_examples=300, deadline=None)
@given(schedule=st.sampled_from(STAGED_SCHEDULES), pp=st.integers(2, 8), virtual=st.integers(1, 3),
       microbatches=st.integers(1, 24), data=st.data())
def test_the_kept_moments_set_every_peak_the_replayed_ones_do(schedule, pp, virtual, microbatches, data):
    # distinct_moments keeps only moments no other holds as much of everywhere: under any non-negative bytes per
    # chunk of each local stage and per loss part, its peak is the peak over every replayed moment
    virtual = 2 if schedule in ("ZBVZeroBubble", "DualPipeV") else virtual
    rank = data.draw(st.integers(0, pp - 1))
    every = staged_moments(schedule, pp, virtual, microbatches, rank)
    kept = distinct_moments(schedule, pp, virtual, microbatches, rank)
    assert set(kept) <= set(every) and len(kept) <= len(set(every))
    weights = data.draw(st.lists(st.integers(0, 10**6), min_size=len(every[0][0]), max_size=len(every[0][0])))
    loss = data.draw(st.integers(0, 10**6))

    def peak(moments):
        return max(sum(n * w for n, w in zip(counts, weights)) + held * loss for counts, held in moments)
    assert peak(kept) == peak(every)


def test_split_backward_bytes_weigh_each_stage():
    # tiny Llama, 4 layers, fp32 on CPU, DualPipeV p=2: rank 0 holds 4 chunks of stage 0 (one layer,
    # embedding side) and 1 of stage 3 (one layer, final norm and lm_head input, plus its loss)
    fields = dict(REAL_SHAPES["tiny_llama"], num_hidden_layers=4)
    tok = token_activations(model_spec_from_hf("t", fields), "hf", "fp32", True, 1, False, False, "none", 64, 1)
    out = tok.outside
    assert (tok.layer, out.first_per_token, out.last_per_token, out.per_stage) == (4376, 8, 1804, 8192)
    assert out.loss_per_token == 4 * 256 + 8  # fp32 logits and int64 labels
    stage0 = 64 * (4376 + 8) + 8192  # 288,768
    stage3 = 64 * (4376 + 1804 - 1032) + 8192  # 337,664
    loss = 64 * 1032 + 4
    layout = LayoutConfig(pp=2, pp_virtual_stages=2, pp_schedule="DualPipeV", grad_accum=4, micro_batch=1, seq_len=64)
    assert rank_activation_bytes(tok, layout, 0, 2, True, True) == (4 * stage0 + stage3 + loss, 0)  # 1,558,788
    middle = 64 * 4376 + 8192
    assert rank_activation_bytes(tok, layout, 1, 2, False, False) == (5 * middle, 0)
    zbv = LayoutConfig(pp=2, pp_virtual_stages=2, pp_schedule="ZBVZeroBubble", grad_accum=4, micro_batch=1,
                       seq_len=64)
    assert rank_activation_bytes(tok, zbv, 0, 2, True, True)[0] == max(4 * stage0, 3 * stage0 + stage3 + loss)


def test_first_1f1b_stage_holds_the_whole_model_activations():
    # p micro-batches of L/p layers on rank 0 = one micro-batch of all L layers (Korthikanti sec. 4.2.3).
    fields = dict(REAL_SHAPES["tiny_llama"], num_hidden_layers=8)
    one = make_plan(run_config(hf_config=fields, engine=dict(name="nd"), zero_stage=0, dp_shard=1, pp=1,
                               cluster=dict(accelerators_per_node=1))).memory
    piped = make_plan(run_config(hf_config=fields, engine=dict(name="nd"), zero_stage=0, dp_shard=1, pp=4,
                                 grad_accum=8, cluster=dict(accelerators_per_node=4))).memory
    spec = model_spec_from_hf("t", fields)
    tok = token_activations(spec, "hf", "bf16", True, 1, False, False, "none", 64, 1)
    tokens, out = 2 * 64, tok.outside
    # rank 0 (4 in flight) lacks the loss-side tensors but holds the embedding-side ones 4 times
    difference = (tokens * out.last_per_token + out.last_constant) - 3 * (tokens * out.first_per_token + out.per_stage)
    assert piped.pp_rank == 0
    assert one.activation_bytes - piped.activation_bytes == pytest.approx(difference, abs=4)
    assert piped.activation_bytes > tokens * 8 * tok.layer


def _saved_tensor_bytes(fields, micro_batch, seq_len, dtype, checkpoint):
    """What the runtime's meter counts: storages saved for backward, de-duplicated, parameters excluded."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(**fields)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=fields.get("attn_implementation", "sdpa"))
    model = model.to(dtype).train()
    if checkpoint:
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(0, config.vocab_size, (micro_batch, seq_len))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=ids, labels=ids)
    return sum(nbytes for ptr, nbytes in saved.items() if ptr not in params)


MIXTRAL_TINY = dict(model_type="mixtral", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=256, num_local_experts=4,
                    num_experts_per_tok=2)
QWEN3_TINY = dict(model_type="qwen3", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=24, vocab_size=300)
GPT2_TINY = dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=128)
MEASURED_CASES = [
    (dict(REAL_SHAPES["tiny_llama"], attn_implementation=attn), 2, 64, precision, ckpt)
    for attn in ("sdpa", "eager") for precision in ("fp32", "bf16") for ckpt in ("none", "full")
] + [
    (MIXTRAL_TINY, 2, 64, "bf16", "none"),
    (dict(QWEN3_TINY, attn_implementation="eager"), 1, 32, "fp32", "none"),
    (dict(GPT2_TINY, attn_implementation="eager"), 3, 32, "bf16", "none"),  # dropout masks on CPU
]


@pytest.mark.parametrize("fields, micro_batch, seq_len, precision, ckpt", MEASURED_CASES)
def test_activations_equal_saved_tensors_of_transformers(fields, micro_batch, seq_len, precision, ckpt):
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    measured = _saved_tensor_bytes(fields, micro_batch, seq_len, dtype, ckpt == "full")
    cfg = run_config(hf_config=fields, dp_shard=1, zero_stage=0, micro_batch=micro_batch, seq_len=seq_len,
                     precision=precision, activation_checkpointing=ckpt, cluster=dict(accelerators_per_node=1))
    predicted = make_plan(cfg).memory.activation_bytes
    assert predicted == pytest.approx(measured, rel=0.005)


def test_memory_breakdown_adds_up():
    memory = make_plan(run_config(model="llama3_1_8b", engine=dict(name="fsdp"), zero_stage=3, dp_shard=8,
                                  seq_len=4096, activation_checkpointing="full",
                                  cluster=dict(accelerator="h100_sxm", accelerators_per_node=8,
                                               memory_per_accelerator_gib=None))).memory
    parts = (memory.param_bytes + memory.grad_bytes + memory.master_bytes + memory.moment_bytes
             + memory.optimizer_grad_bytes + memory.gathered_bytes + memory.accumulated_grad_bytes
             + memory.activation_bytes + memory.recompute_bytes + memory.bucket_bytes)
    assert memory.total_bytes == parts + memory.allowance_bytes and memory.bucket_bytes == 0  # FSDP: no bucket
    assert memory.allowance_bytes == int(0.10 * parts) + 2**30  # GPU default: 10% + 1 GiB
    assert memory.recompute_bytes > 0 and memory.gathered_bytes > 0


def test_memory_per_rank_takes_the_worse_pipeline_rank():
    spec = model_spec_from_hf("tiny", dict(REAL_SHAPES["tiny_llama"], num_hidden_layers=4))
    layout = LayoutConfig(dp_shard=1, pp=2, zero_stage=0, grad_accum=2, seq_len=64, micro_batch=1)
    memory = memory_per_rank(spec, layout, engine_config(name="nd"), "cpu")
    assert memory.pp_rank in (0, 1) and memory.total_bytes > 0


@pytest.mark.parametrize("precision, working", [("bf16", 2), ("fp32", 4)])
def test_fsdp2_keeps_a_pipeline_stage_gathered_for_the_whole_step(precision, working):
    """nd with pp > 1 does not reshard after forward: from the first forward to the last backward every unit of
    the rank's stages is gathered (the working copy of all its parameters), where without pipelining ZeRO-3
    holds the current and the prefetched unit."""
    spec = model_spec_from_hf("tiny_llama", dict(REAL_SHAPES["tiny_llama"], num_hidden_layers=4))
    piped = run_config(engine=dict(name="nd"), pp=2, dp_shard=2, zero_stage=3, grad_accum=2, precision=precision)
    memory = memory_per_rank(spec, piped.layout, piped.engine, "cpu")
    counts = stage_layer_counts(4, 2, 1, ())
    stages = rank_stages("1F1B", 2, 1, memory.pp_rank)
    held = rank_params(spec, 1, 1, rank_layers(counts, stages), 0 in stages, 1 in stages, 2, (True, True))
    assert memory.gathered_bytes == (held.dense_total + held.expert_total) * working
    # torch's pipelining defers the gradient reduce-scatter to the step's last backward: the full gradients
    # accumulate in fp32 (the reduce dtype under bf16)
    assert memory.accumulated_grad_bytes == (held.dense_total + held.expert_total) * 4
    flat = run_config(engine=dict(name="nd"), dp_shard=2, zero_stage=3, precision=precision)
    whole = rank_params(spec, 1, 1, (0, 1, 2, 3), True, True, 1, (True, True))
    unpiped = memory_per_rank(spec, flat.layout, flat.engine, "cpu")
    assert unpiped.gathered_bytes == 2 * whole.largest_unit * working and unpiped.accumulated_grad_bytes == 0


@pytest.mark.parametrize("precision, gathered", [("bf16", 106_752), ("fp32", 213_504)])
def test_pp2_fsdp2_first_rank_holds_the_measured_unsharded_stage(precision, gathered):
    # Measured on 4 gloo ranks (recipes=cpu_nd_pp2 layout=nd_pp2_fsdp2, 4 micro-batches), FSDP2's own state read
    # just before the step's gradient reduction: pipeline rank 0 (one layer and the embedding, 53,376
    # parameters) held 106,752 (bf16) / 213,504 (fp32) bytes of unsharded parameters, 213,504 of unsharded
    # gradients in both.
    cfg = run_config(engine=dict(name="nd"), hf_config=dict(REAL_SHAPES["tiny_llama"], num_hidden_layers=2), pp=2,
                     dp_shard=2, zero_stage=3, micro_batch=1, grad_accum=4, precision=precision,
                     cluster=dict(accelerators_per_node=4))
    memory = make_plan(cfg).memory
    assert (memory.pp_rank, memory.gathered_bytes, memory.accumulated_grad_bytes) == (0, gathered, 213_504)


def _deepspeed_llama(zero: int, precision: str = "bf16", accelerator: str = "h100_sxm"):
    cluster = dict(accelerator=accelerator, accelerators_per_node=8, memory_per_accelerator_gib=None)
    return make_plan(run_config(model="llama3_1_8b", engine=dict(name="deepspeed"), zero_stage=zero, dp_shard=8,
                                seq_len=2048, precision=precision, activation_checkpointing="full",
                                cluster=cluster)).memory


@pytest.mark.parametrize("zero, precision, buffers, dtype_bytes", [
    (0, "bf16", 0, 2),  # no ZeRO optimizer, no bucket
    (1, "bf16", 1, 2),  # overlap_comm off (DeepSpeed's default below stage 3)
    (2, "bf16", 2, 2),  # overlap_comm on a GPU: double buffered
    (2, "fp32", 2, 4),
    (3, "bf16", 1, 2),  # one bucket per communication dtype, overlap or not
])
def test_deepspeed_plans_its_reduction_buckets_at_their_full_size(zero, precision, buffers, dtype_bytes):
    memory = _deepspeed_llama(zero, precision)
    assert memory.bucket_bytes == buffers * DEEPSPEED_BUCKET_NUMEL * dtype_bytes


def test_zero3s_bucket_is_kept_for_the_run_and_takes_no_allowance_fraction_zero2s_are_freed_each_backward():
    zero3, zero2 = _deepspeed_llama(3), _deepspeed_llama(2)
    gpu_default = Allowance(fraction=0.10, fixed_bytes=2**30)
    for memory, preallocated in ((zero3, zero3.bucket_bytes), (zero2, 0)):
        predicted = memory.total_bytes - memory.allowance_bytes
        assert memory.allowance_bytes == allowance_bytes(gpu_default, predicted, preallocated)


def test_a_cpu_rank_counts_only_the_bucket_pages_its_gradients_touch():
    layout = LayoutConfig(dp_shard=2, zero_stage=3, precision="bf16")
    assert deepspeed_bucket_bytes(layout, "cpu", rank_numel=53_376) == 53_376 * 2
    assert deepspeed_bucket_bytes(layout, "h100_sxm", rank_numel=53_376) == DEEPSPEED_BUCKET_NUMEL * 2


LLAMA_3_2_1B = dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                    max_position_embeddings=131072, tie_word_embeddings=True)


def _zero3_gathered(model: str, hf_config=None, ckpt: str = "full", engine: str = "deepspeed"):
    cluster = dict(accelerator="h200", accelerators_per_node=1, memory_per_accelerator_gib=None)
    return make_plan(run_config(model=model, hf_config=hf_config, engine=dict(name=engine), zero_stage=3,
                                dp_shard=1, seq_len=1024, micro_batch=1, activation_checkpointing=ckpt,
                                precision="bf16", cluster=cluster)).memory.gathered_bytes


def test_deepspeed_zero3_holds_the_1b_models_last_three_layers_and_tied_table_gathered_into_the_backward():
    # Llama-3.2-1B (gpu-check's model): a layer is 60,821,504 elements, the tied table 262,668,288. Under full
    # recompute a layer's next use after its forward lies beyond 3 x 60.8M per later layer (forward, recompute,
    # backward) + 2 x 262.7M (the lm_head both ways): within 1e9 for the last three layers. The table itself is
    # reused by the lm_head after 16 layers (973M), the final norm within the lm_head's two uses. Beside them, the
    # gradient of the largest module (the table).
    layer, table, norm = 60_821_504, 262_668_288, 2048
    assert _zero3_gathered("llama3_2_1b", LLAMA_3_2_1B) == (3 * layer + table + norm + table) * 2  # 1,350 MiB
    # Without recompute a later layer costs 2 x 60.8M (forward, backward): the last three layers, and of the fourth
    # from the end the modules whose rest of the layer, run through twice, stays within 1e9 - 6 x 60.8M - 2 x
    # 262.7M = 109.6M: v_proj (54.5M after it) on, not its two norms, q_proj (4.2M) and k_proj (1.0M).
    fourth = layer - 2 * 2048 - 2048 * 2048 - 2048 * 512
    assert _zero3_gathered("llama3_2_1b", LLAMA_3_2_1B, ckpt="none") == (3 * layer + fourth + table + norm + table) * 2


@pytest.mark.parametrize("model", ["llama3_1_8b", "llama3_1_70b"])
def test_deepspeed_zero3_of_a_model_past_the_reuse_distance_holds_twice_its_largest_module(model):
    # the lm_head both ways (2 x 525M or 2 x 1,051M elements) already exceeds 1e9: no layer stays gathered
    spec = model_spec_from_hf(model, REAL_SHAPES[model])
    largest = spec.lm_head_params
    assert _zero3_gathered(model) == 2 * largest * 2 == _zero3_gathered(model, ckpt="none")


@pytest.mark.parametrize("engine", ["deepspeed", "fsdp", "nd"])
def test_memoised_states_are_those_of_the_layouts_own_checkpointing(engine):
    """rank_states is memoised by what the states depend on: checkpointing only where full recompute changes what
    DeepSpeed ZeRO-3 keeps gathered. Every mode, planned after the others, gives its states planned alone."""
    from harness.plan.planner import clear_caches

    def gathered(checkpointing):
        return _zero3_gathered("mistral_7b", ckpt=checkpointing, engine=engine)

    modes = ("none", "selective", "full")
    alone = {}
    for mode in modes:
        clear_caches()
        alone[mode] = gathered(mode)
    for order in (modes, modes[::-1]):
        clear_caches()
        assert {mode: gathered(mode) for mode in order} == alone
    assert (alone["full"] != alone["none"]) == (engine == "deepspeed"), alone


@pytest.mark.parametrize("fields", [
    dict(model_type="llama", hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
         num_key_value_heads=2, vocab_size=300, max_position_embeddings=256),
    dict(QWEN3_TINY, attn_implementation="eager"),
    MIXTRAL_TINY,  # routed experts run as grouped matmuls: recomputed, only the router's logits kept
])
def test_nd_selective_checkpointing_keeps_what_its_policy_saves(fields):
    """engine=nd's selective checkpointing (torch's op-level policy) keeps every matmul and attention output:
    what it keeps beyond full recomputation (both checkpointed, so the wrapper's own references cancel), measured
    from outside the model (held_activations.py), is what the plan says, and it keeps less than no checkpointing.
    The plan had taken Megatron's selective recomputation, whose kernels leave nothing to drop, and predicted the
    same memory as none (one Llama layer at 4,096 tokens keeps 44% less)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("held_activations.py")

    def measured(mode):
        out = subprocess.run([sys.executable, str(script), json.dumps(fields), mode, "2", "32"], check=True,
                             capture_output=True, text=True).stdout
        return int(out.split()[-1])

    def predicted(mode):
        cfg = run_config(hf_config=fields, engine=dict(name="nd"), dp_shard=1, zero_stage=0, micro_batch=2,
                         seq_len=32, precision="fp32", activation_checkpointing=mode,
                         cluster=dict(accelerators_per_node=1))
        return make_plan(cfg).memory.activation_bytes

    none, selective, full = (measured(mode) for mode in ("none", "selective", "full"))
    assert full < selective < none and predicted("selective") < predicted("none")
    assert predicted("selective") - predicted("full") == pytest.approx(selective - full, rel=0.01)
