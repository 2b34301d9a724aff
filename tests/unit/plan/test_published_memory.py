"""Memory against runs that happened: published Megatron layouts that ran on 80 GB H100s plan as fitting, and each
term of the breakdown against Megatron-LM's own rules (its code, derived here, not its figures)."""

from __future__ import annotations

import pytest

from harness.config.schema import LayoutConfig
from harness.engines.megatron_lm import megatron_flags
from harness.plan.activations import (TokenActivations, OutsideActivations, inflight_microbatches,
                                      interleaved_moments, rank_activation_bytes, token_activations)
from harness.plan.model_spec import model_spec_from_hf
from harness.plan.planner import GIB, make_plan
from plan_helpers import REAL_SHAPES, run_config

H100 = dict(name="h100_8x8", accelerators_per_node=8, accelerator="h100_sxm", memory_per_accelerator_gib=None)
# Megatron's pipeline split that counts the embedding and the loss as a layer each
# (account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split): 126 + 2 over 64 stages.
LLAMA_405B_SPLIT = [1] + [2] * 62 + [1]
# Megatron-Bridge perf_recipes/llama/h100/llama3.py, the 70B FP8 row's pipeline_model_parallel_layout
# "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL": 40 stages, the 36th holding 3 layers, the last one.
LLAMA_70B_FP8_SPLIT = [2] * 35 + [3, 2, 2, 2, 1]

# Each row: (model, nodes of 8 H100, layout, precision). All ran with sequence parallelism, the distributed
# optimizer (zero_stage 1), no activation recomputation and bf16 gradients: NeMo's scripts/performance/helpers.py
# (set_precision_configs) and Megatron-Bridge's perf_recipes/_common.py (_perf_precision, _benchmark_common) set
# grad_reduce_in_fp32=False for every performance run.
PUBLISHED = {
    # NVIDIA/NeMo scripts/performance/recommended_model_configs/model_configs_h100.csv,
    # "pre_train,llama31,405b,h100,bf16,1024,8192,8,8,2,1,8,1,512" (TP PP CP EP VP MBS GBS); the recipe
    # nemo/collections/llm/recipes/llama31_405b.py accounts for the embedding and loss in the pipeline split.
    "llama3.1-405b bf16 tp8 pp8 cp2 vp8, 1024 H100 (NeMo)": (
        "llama3_1_405b", 128, dict(tp=8, pp=8, cp=2, dp_shard=8, pp_virtual_stages=8, grad_accum=64,
                                   seq_len=8192, pp_stage_layers=LLAMA_405B_SPLIT), "bf16"),
    # Megatron-Bridge docs/performance-summary.md, 25.09 and 25.11 containers, DGX-H100: LLAMA3.1_405B FP8-CS,
    # 1024 GPUs, GBS 512, MBS 1, seq 8192, TP 8, PP 8, CP 2, VP 8, GA 64.
    "llama3.1-405b fp8 tp8 pp8 cp2 vp8, 1024 H100 (Megatron-Bridge)": (
        "llama3_1_405b", 128, dict(tp=8, pp=8, cp=2, dp_shard=8, pp_virtual_stages=8, grad_accum=64,
                                   seq_len=8192, pp_stage_layers=LLAMA_405B_SPLIT), "fp8"),
    # model_configs_h100.csv, "pre_train,llama3,70b,h100,bf16,64,8192,4,4,2,1,5,1,128".
    "llama3-70b bf16 tp4 pp4 cp2 vp5, 64 H100 (NeMo)": (
        "llama3_1_70b", 8, dict(tp=4, pp=4, cp=2, dp_shard=2, pp_virtual_stages=5, grad_accum=64, seq_len=8192),
        "bf16"),
    # Megatron-Bridge performance summary, 25.09 and 25.11, DGX-H100: LLAMA3_70B FP8-CS, 64 GPUs, GBS 128,
    # MBS 1, seq 8192, TP 4, PP 8, CP 1, VP 5, GA 64.
    "llama3-70b fp8 tp4 pp8 vp5, 64 H100 (Megatron-Bridge)": (
        "llama3_1_70b", 8, dict(tp=4, pp=8, dp_shard=2, pp_virtual_stages=5, grad_accum=64, seq_len=8192,
                                pp_stage_layers=LLAMA_70B_FP8_SPLIT), "fp8"),
}


def published(model, nodes, layout, precision, **engine):
    options = dict(dict(name="megatron_lm", sequence_parallel=True, grad_reduce_in_bf16=True), **engine)
    return run_config(model=model, engine=options, cluster=dict(H100, nodes=nodes), zero_stage=1,
                      pp_schedule="Interleaved1F1B", micro_batch=1, precision=precision, **layout)


@pytest.mark.parametrize("row", sorted(PUBLISHED))
def test_published_layouts_that_ran_on_80gb_plan_as_fitting(row):
    plan = make_plan(published(*PUBLISHED[row]), predict_time=False)
    assert not plan.errors, plan.errors
    assert plan.fits, f"{row}: predicted {plan.memory.total_bytes / GIB:.1f} GiB per rank"


def test_the_405b_layout_fits_with_megatrons_default_fp32_gradients_too():
    # Megatron-LM's own default keeps fp32 main gradients (2 + 4 + 12/d bytes a parameter): 40 GiB of states and
    # 34 GiB of activations on the fullest rank, Megatron's estimator's 74 GiB, with its head-room still under 80.
    memory = make_plan(published(*PUBLISHED["llama3.1-405b bf16 tp8 pp8 cp2 vp8, 1024 H100 (NeMo)"][:3], "bf16",
                                 grad_reduce_in_bf16=False), predict_time=False).memory
    assert 74 < (memory.total_bytes - memory.allowance_bytes) / GIB < 75
    assert memory.total_bytes < 80 * GIB
    # the head-room's 10% covers what the allocator hands out and takes back (the activations), not the states
    # Megatron holds in buffers allocated once
    assert memory.allowance_bytes == int(0.10 * (memory.activation_bytes + memory.recompute_bytes)) + GIB


# NVIDIA-NeMo/Megatron-Bridge skills/nemo-mbridge-perf-memory-tuning/SKILL.md, "Measured Results": Llama3 70B SFT
# on 32 H100 80GB, FP8 current scaling, MBS 1, GBS 32, seq 4096, VPP 5, peak memory in GB (its recipe,
# perf_recipes/llama/h100/llama3.py llama3_70b_sft_32gpu_h100_fp8cs_config: sequence parallel, distributed
# optimizer, bf16 gradients, no recomputation). (tp, pp, data-parallel ranks, measured GB)
MEASURED_PEAKS = [(4, 4, 2, 58.8), (4, 8, 1, 53.2), (8, 4, 1, 50.2)]


@pytest.mark.parametrize("tp, pp, dp, measured_gb", MEASURED_PEAKS)
def test_predicted_bytes_are_within_a_fifth_of_measured_megatron_peaks(tp, pp, dp, measured_gb):
    # What the model leaves out of those runs: FP8 model weights (fp8_param_gather: 1 byte a parameter where the
    # plan counts bf16's 2, ~4 GB at tp4 pp4), CUDA graphs of the MLPs and the TP-overlap buffers (static, beside
    # the activations); so the bytes before head-room may stand above or below the measured peak.
    cfg = run_config(model="llama3_1_70b", engine=dict(name="megatron_lm", sequence_parallel=True,
                                                       grad_reduce_in_bf16=True),
                     cluster=dict(H100, nodes=4), tp=tp, pp=pp, dp_shard=dp, pp_virtual_stages=5,
                     pp_schedule="Interleaved1F1B", zero_stage=1, micro_batch=1, grad_accum=32 // dp, seq_len=4096,
                     precision="fp8")
    memory = make_plan(cfg, predict_time=False).memory
    predicted_gb = (memory.total_bytes - memory.allowance_bytes) / 1e9
    assert predicted_gb == pytest.approx(measured_gb, rel=0.20)
    assert memory.total_bytes < 80 * GIB  # they ran


def test_an_obviously_oversized_layout_still_refuses():
    # 405B over 64 H100 without context parallelism, interleaving or recomputation: 16 layers' states (~114 GB)
    # alone exceed the device.
    plan = make_plan(run_config(model="llama3_1_405b", engine=dict(name="megatron_lm", sequence_parallel=True),
                                cluster=dict(H100, nodes=8), tp=8, pp=8, dp_shard=1, zero_stage=1, micro_batch=1,
                                grad_accum=8, seq_len=8192, pp_stage_layers=[15] + [16] * 6 + [15]),
                     predict_time=False)
    assert not plan.fits and plan.memory.total_bytes > 100 * GIB


@pytest.mark.parametrize("bf16_grads, grad_bytes", [(False, 4), (True, 2)])
def test_states_follow_megatrons_distributed_optimizer_over_dp_and_cp(bf16_grads, grad_bytes):
    # Megatron-LM theoretical_memory_usage.py and Megatron-Bridge's estimator: 6 + 12/d bytes a parameter with the
    # distributed optimizer (bf16 weights, fp32 main gradients, fp32 main weights and Adam moments sharded), d the
    # data-parallel x context-parallel ranks; --grad-reduce-in-bf16 makes the gradient 2 bytes.
    cfg = published("llama3_1_405b", 128, dict(tp=8, pp=8, cp=2, dp_shard=8, pp_virtual_stages=8, grad_accum=64,
                                               seq_len=8192, pp_stage_layers=LLAMA_405B_SPLIT), "bf16",
                    grad_reduce_in_bf16=bf16_grads)
    memory = make_plan(cfg, predict_time=False).memory
    params = memory.param_bytes // 2
    assert memory.grad_bytes == grad_bytes * params
    assert memory.master_bytes + memory.moment_bytes == pytest.approx(12 * params / (8 * 2), rel=1e-6)
    assert ("--grad-reduce-in-bf16" in megatron_flags(cfg)) == bf16_grads


def llama_layer_bytes_per_token(fields, tp):
    """One Llama layer under Megatron-LM with Transformer Engine, flash attention and sequence parallelism, bytes a
    token saves in bf16: both RMSNorms' inputs (2h each), the QKV and fc1 inputs (2h each: TE keeps the sequence
    shard and gathers it again in backward), Q (2h), K and V (2 x 2·kv·d), the fp32 softmax statistics (4 a head),
    the attention output the projection reads (2h), fc1's [gate|up] output (4f) and the SwiGLU product (2f); all
    divided by tp (Megatron-LM's estimator: sbh(18 + 4f/h)/t for its GPT layer, whose MLP differs)."""
    h, f, a, kv, d = (fields["hidden_size"], fields["intermediate_size"], fields["num_attention_heads"],
                      fields["num_key_value_heads"], fields["head_dim"])
    return (2 * 2 * h + 2 * 2 * h + 2 * h + 2 * 2 * kv * d + 4 * a + 2 * h + 4 * f + 2 * f) / tp


def test_megatron_llama_layer_saves_what_its_kernels_keep_divided_by_tp_and_cp():
    fields = REAL_SHAPES["llama3_1_405b"]
    spec = model_spec_from_hf("llama", fields)
    tok = token_activations(spec, "megatron", "bf16", False, 8, True, False, "none", 8192, 2)
    assert tok.layer == pytest.approx(llama_layer_bytes_per_token(fields, 8))
    # context parallelism: each rank keeps its seq/cp tokens
    layout = LayoutConfig(tp=8, cp=2, pp=1, micro_batch=1, seq_len=8192, dp_shard=1)
    assert rank_activation_bytes(tok, layout, 0, 16, False, False)[0] == int(4096 * 16 * tok.layer)
    # full recomputation keeps the layer input only, the sequence shard (2h/tp)
    full = token_activations(spec, "megatron", "bf16", False, 8, True, False, "full", 8192, 2)
    assert full.layer == 2 * fields["hidden_size"] / 8


def test_megatron_fp8_layer_saves_one_byte_gemm_inputs():
    # Transformer Engine under FP8 saves each Linear's input quantized (1 byte): the QKV and fc1 inputs (h each) and
    # the down projection's input (f) drop a byte an element; the output projection adds a 1-byte copy (h) of the
    # attention output the fused attention keeps in bf16.
    fields = REAL_SHAPES["llama3_1_405b"]
    h, f = fields["hidden_size"], fields["intermediate_size"]
    spec = model_spec_from_hf("llama", fields)
    fp8 = token_activations(spec, "megatron", "fp8", False, 8, True, False, "none", 8192, 2)
    assert fp8.layer == pytest.approx(llama_layer_bytes_per_token(fields, 8) - (2 * h - h + f) / 8)
    # transformers' modules (nd, fsdp) keep their own rule
    hf = [token_activations(spec, "hf", precision, False, 8, True, False, "none", 8192, 2).layer
          for precision in ("fp8", "bf16")]
    assert hf[0] == hf[1]


def unit_tokens(layer=1.0, first=0.0, last=0.0, loss=0.0) -> TokenActivations:
    """Per-token activations of one byte a layer (and optional outside-layer bytes): a rank's bytes then count
    layer-micro-batches."""
    return TokenActivations(layer, 0.0, OutsideActivations(first, last, 0, 0.0, loss))


def interleaved(p, v, m, split=()):
    return LayoutConfig(pp=p, pp_virtual_stages=v, pp_schedule="Interleaved1F1B", grad_accum=m, micro_batch=1,
                        seq_len=1, dp_shard=1, pp_stage_layers=list(split))


@pytest.mark.parametrize("p, v, m", [(8, 8, 64), (4, 5, 64), (4, 2, 8), (2, 2, 4)])
def test_interleaved_first_rank_holds_megatrons_in_flight_chunks(p, v, m):
    # Megatron-LM schedules.py: rank r warms up 2·(p-1-r) + (v-1)·p chunk forwards, then forward-before-backward;
    # with L layers evenly split, rank 0 holds L·(1 + (p-1)/(p·v)) layer-micro-batches, the interleaving penalty of
    # its theoretical_memory_usage.py.
    layers = p * v * 2
    for r in range(p):
        moments = interleaved_moments(p, v, m, r)
        assert max(sum(counts) for counts, _ in moments) == 2 * (p - 1 - r) + (v - 1) * p + 1
    held = rank_activation_bytes(unit_tokens(), interleaved(p, v, m), 0, layers // p, True, False)[0]
    assert held == pytest.approx(layers * (1 + (p - 1) / (p * v)))
    assert held == inflight_microbatches("Interleaved1F1B", p, v, m, 0) * layers // p


def test_interleaved_counts_a_heavier_first_stage_by_its_own_chunks():
    # p=2, v=2, m=4, stages [3, 1, 1, 1]: rank 0 runs F0 F0 F2 F2 | F0 B2 | F0 B2 | ...: after its fourth F0 it
    # holds all four micro-batches of the 3-layer stage and one of stage 2, 13 layer-micro-batches, where an even
    # spread of its 5 peak chunks over its 4 layers gives 10.
    layout = interleaved(2, 2, 4, [3, 1, 1, 1])
    assert interleaved_moments(2, 2, 4, 0)[:6] == (((1, 0), 0), ((2, 0), 0), ((2, 1), 0), ((2, 2), 0),
                                                    ((3, 2), 0), ((4, 1), 0))
    assert rank_activation_bytes(unit_tokens(), layout, 0, 4, True, False)[0] == 4 * 3 + 1


def test_interleaved_last_rank_holds_logits_of_its_last_stage_chunks_only():
    # The fp32 logits (and every loss-side tensor) live with the last stage's micro-batches, not with all the
    # chunks the last rank holds: rank p-1 warms up (v-1)·p chunks of its earlier stages before the first
    # last-stage forward, whose backward follows at once.
    p, v, m = 4, 2, 8
    tok = unit_tokens(last=1000.0, loss=900.0)
    held = rank_activation_bytes(tok, interleaved(p, v, m), p - 1, 4, False, True)[0]
    moments = interleaved_moments(p, v, m, p - 1)
    assert max(loss for _, loss in moments) == 1
    assert held == max(2 * sum(counts) + 1000 * counts[-1] for counts, _ in moments) == 2 * 5 + 1000
