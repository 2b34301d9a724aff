"""The time model against a public throughput table: llm-foundry's MPT runs on H100 with FSDP.

Throughput (tokens/s per GPU) is convention-free, so no FLOP normalisation is needed to compare it; the
MFU column uses llm-foundry's convention (6N + 12·L·d·T, the full attention matrix, N with the tied
embedding), which is the harness's `flop_attention=full` with the lm_head: both are checked."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from harness.config.schema import BenchConfig, ClusterConfig, EngineConfig, LayoutConfig, ModelConfig, RunConfig
from harness.plan.planner import make_plan

TABLE = Path(__file__).resolve().parents[2] / "data" / "llm_foundry_h100_bf16.csv"


def rows():
    with TABLE.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def mpt_config(row) -> RunConfig:
    """MPT as GPT-2-shaped transformers config: learned positions, GELU MLP x4, tied embeddings, no dropout."""
    hf = dict(model_type="gpt2", n_embd=int(row["d_model"]), n_head=int(row["n_heads"]), n_layer=int(row["n_layers"]),
              n_positions=int(row["seq_len"]), vocab_size=50368, tie_word_embeddings=True,
              # MPT ran FlashAttention-2; torch SDPA runs the same kernels on H100 (and, unlike
              # "flash_attention_2", builds without the flash-attn package on this machine)
              attn_implementation="sdpa", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    gpus = int(row["gpus"])
    return RunConfig(
        model=ModelConfig(name=f"mpt-{row['model']}", hf_config=hf), engine=EngineConfig(name="fsdp"),
        layout=LayoutConfig(dp_shard=gpus, zero_stage=3, micro_batch=int(row["micro_batch"]),
                            grad_accum=int(row["grad_accum"]), seq_len=int(row["seq_len"]),
                            activation_checkpointing=row["checkpointing"], precision="bf16"),
        cluster=ClusterConfig(name="h100", nodes=max(1, gpus // 8), accelerators_per_node=min(8, gpus),
                              accelerator="h100_sxm", host_memory_gib=2048),
        bench=BenchConfig(flop_attention="full"))


def predictions():
    out = []
    for row in rows():
        plan = make_plan(mpt_config(row))
        gpus = int(row["gpus"])
        out.append((row, plan, plan.tokens_per_s / gpus / float(row["tokens_per_s_per_gpu"]) - 1))
    return out


def test_flop_conventions_agree_with_the_table():
    # the table's MFU / its throughput fixes its FLOPs per token; ours under flop_attention=full must match
    for row, plan, _ in predictions():
        theirs = float(row["mfu"]) * 989.5e12 / float(row["tokens_per_s_per_gpu"])
        assert plan.flops_per_token == pytest.approx(theirs, rel=0.03), row["model"]


def test_throughput_error_on_the_table(capsys):
    errors = []
    for row, plan, error in predictions():
        errors.append(abs(error))
        print(f"mpt-{row['model']} T={row['seq_len']} gpus={row['gpus']} ckpt={row['checkpointing']}: "
              f"{row['tokens_per_s_per_gpu']} measured, {plan.tokens_per_s / int(row['gpus']):.0f} predicted "
              f"tokens/s/GPU ({error:+.0%}); MFU {row['mfu']} vs {plan.predicted_mfu:.3f}")
    median, worst = statistics.median(errors), max(errors)
    print(f"median |error| {median:.0%}, max {worst:.0%}")
    # The model is optimistic on this table (it knows no kernel or framework inefficiency beyond the
    # matmul and attention efficiencies); these bounds record where it stands, not a target met.
    assert median <= 0.40 and worst <= 0.80
