"""The time model beside public A100 tables of software stacks it does not model (printed, never calibrated
on, never a test): what `make_plan` predicts for their layouts on the nearest harness engine.

1. NVIDIA/NeMo-Megatron-Launcher README at 3579cdb3 (2022-09-07), "Training Performance Results": GPT-3 5B on 1-32
   and GPT-3 175B on 8-128 DGX A100 80GB nodes, tokens/s of the whole job. Layouts from the same commit's
   conf/training/gpt3/5b.yaml (TP 1, PP 1, micro-batch 2, GBS 2048, sequence 2048, no recompute: method block with 0
   layers) and 175b.yaml (TP 8, PP 8, sequence parallel, selective recompute, micro-batch 2, GBS 2048); both
   distributed_fused_adam, bf16, dropout 0.1. That stack (apex, no flash attention) is not the harness's Megatron-LM
   export (Transformer Engine layers, flash attention, which the plan keeps whatever attn_implementation says, and
   dropout fused into its kernels): the rows print as the export.
2. Dao-AILab/flash-attention training/README.md (table from 4a6eaa9f, 2022-11-29), "Training speed": GPT3-125M to
   2.7B on one node of 8 x A100 80GB, tokens/s of the node. Layouts from training/configs/experiment/pile/ (per-GPU
   batch for 80 GB: 32, 32, 16, 8, 4; global batch 256, 256, 256, 512, 512 sequences of 2048; no recompute; DDP
   with ZeRO-1; FlashAttention v1 then, with fused MLP and dropout-add-LayerNorm). That trainer is none of the
   harness's engines: the rows print as megatron_lm (fused elementwise work) and as fsdp (unfused), with
   cluster.attention_kernel=flash_attention_1.

3. Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B", sec. 2.4: 60.1, 50.2 and
   44.4 s an iteration at a global batch of 1,920 sequences of 2,048 on 280, 350 and 420 DGX A100 nodes (Selene);
   TP8 x PP35 (105 layers, hidden 20,480, 128 heads), micro-batch 1, full activation checkpointing, no sequence
   parallelism (Megatron-DeepSpeed of 2021). Printed as the harness's Megatron-LM export without sequence parallelism.

4. InternLM/xtuner docs/zh_cn/acceleration/benchmark.rst (xtuner 0.1.x, 2024), "速度基准": Llama2-7B on 8 and
   Llama2-70B on 32 A100-SXM4-80GB, TGS (tokens per GPU per second), the rows without sequence parallelism (sp1:
   8k and 32k for 7B, 8k for 70B). Layouts from xtuner/configs/llama_speed_benchmark/ (batch_size 1, packed to the
   sequence length, accumulative_counts 1; full attention over the packed sequence, as the page's TFLOPs column
   counts it, though use_varlen_attn differs between the configs' versions) and the framework's defaults (activation
   checkpointing on, FlashAttention-2, bf16); DeepSpeed ZeRO-3 is the stage its long-sequence guide uses, which
   the page does not state; nor does it state the 70B run's network across its 4 nodes (printed on the profile's
   8 x 200 Gb/s HDR a node). Printed as the harness's deepspeed engine.
5. huggingface/blog deepspeed-to-fsdp-and-back.md (2024), Table 3 ("Ballpark throughput comparisons"): IBM
   Granite-7B (Llama-2-7B shapes) on 4 A100, FSDP full shard and DeepSpeed ZeRO-3, tokens/s per device and step
   time. "Batch size of 8"; tokens/s x step time = 32,8xx for both = 8 sequences of 4,096 a device a step (no
   accumulation); the 40 / 80 GB, the attention kernel and checkpointing are not stated: printed on 80 GB with
   FlashAttention-2 and full checkpointing, the one setting under which the layout fits.

FlagPerf's 2024 Megatron-core Llama-3 rows on A800 and H100 are not printed here: they are a calibration
table (tests/data/flagperf_megatron_bf16.csv).

Usage: .venv/bin/python tools/a100_cross_check.py (part of `make bench`)
"""

from harness.config.schema import (DEFAULT_ATTENTION_KERNEL, BenchConfig, ClusterConfig, LauncherConfig, LayoutConfig,
                                   ModelConfig, RunConfig, engine_config)
from harness.plan.planner import make_plan

# (model, hidden, heads, layers, gpus, tp, pp, recompute, micro-batch, GBS, measured tokens/s of the job)
NEMO = [("gpt3-5b", 4096, 32, 24, 8 * n, 1, 1, "none", 2, 2048, t)
        for n, t in zip((1, 2, 4, 8, 16, 32), (40345, 79815, 161754, 312774, 659481, 1159288))]
NEMO += [("gpt3-175b", 12288, 96, 96, 8 * n, 8, 8, "selective", 2, 2048, t)
         for n, t in zip((8, 16, 32, 64, 128), (7500, 14950, 29537, 58211, 109684))]
MTNLG = [("mt-nlg-530b", 20480, 128, 105, 8 * n, 8, 35, "full", 1, 1920, 1920 * 2048 / t)
         for n, t in zip((280, 350, 420), (60.1, 50.2, 44.4))]
# (model, gpus, micro-batch, seq_len, engine, measured tokens/s per GPU)
XTUNER = [("llama2-7b", 8, 1, 8192, "deepspeed", 3028.3), ("llama2-7b", 8, 1, 32768, "deepspeed", 2234.2),
          ("llama2-70b", 32, 1, 8192, "deepspeed", 216.8)]
HF_BLOG = [("granite-7b", 4, 8, 4096, "fsdp", 3158.7), ("granite-7b", 4, 8, 4096, "deepspeed", 3094.5)]
LLAMA2 = {"llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                            num_key_value_heads=32),
          "llama2-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                             num_key_value_heads=8)}
LLAMA2["granite-7b"] = LLAMA2["llama2-7b"]
FLASH = [("gpt3-125m", 768, 12, 12, 8, 1, 1, "none", 32, 256, 1310e3),
         ("gpt3-355m", 1024, 16, 24, 8, 1, 1, "none", 32, 256, 503e3),
         ("gpt3-760m", 1536, 16, 24, 8, 1, 1, "none", 16, 256, 245e3),
         ("gpt3-1.3b", 2048, 16, 24, 8, 1, 1, "none", 8, 512, 169e3),
         ("gpt3-2.7b", 2560, 20, 32, 8, 1, 1, "none", 4, 512, 85e3)]


def a100_nodes(gpus: int, kernel=DEFAULT_ATTENTION_KERNEL):
    """(cluster, launcher) of a run over whole nodes of 8 A100 80GB (fewer GPUs: one node), under Slurm past one."""
    cluster = ClusterConfig(name="a100_sxm", nodes=max(1, gpus // 8), accelerators_per_node=min(8, gpus),
                            accelerator="a100_sxm", host_memory_gib=2048, attention_kernel=kernel)
    launcher = LauncherConfig(backend="slurm", exclusive=True, time_limit="02:00:00") if gpus > 8 else LauncherConfig()
    return cluster, launcher


def config(row, engine: str, kernel: str, vocab: int, sequence_parallel: bool = True) -> RunConfig:
    name, hidden, heads, layers, gpus, tp, pp, recompute, micro, gbs, _ = row
    hf = dict(model_type="gpt2", n_embd=hidden, n_head=heads, n_layer=layers, n_positions=2048, vocab_size=vocab,
              tie_word_embeddings=True, activation_function="gelu", attn_implementation="sdpa",
              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    dp = gpus // (tp * pp)
    layout = LayoutConfig(name=None, dp_shard=dp, tp=tp, pp=pp, zero_stage=1 if engine == "megatron_lm" else 2,
                          micro_batch=micro, grad_accum=gbs // (micro * dp), seq_len=2048,
                          activation_checkpointing=recompute, precision="bf16")
    cluster, launcher = a100_nodes(gpus, kernel)
    eng = (engine_config("megatron_lm", sequence_parallel=sequence_parallel and tp > 1) if engine == "megatron_lm"
           else engine_config("fsdp", fsdp_version=2))
    return RunConfig(model=ModelConfig(name=name, hf_config=hf), engine=eng, layout=layout, cluster=cluster,
                     launcher=launcher, bench=BenchConfig(flop_attention="full", flop_include_lm_head=True))


def zero3_config(row) -> RunConfig:
    """A Llama-2-shaped ZeRO-3 / FULL_SHARD run over whole nodes of A100 80GB, full checkpointing, FlashAttention-2
    (SDPA's kernel: the harness's default), DeepSpeed's fused Adam or FSDP through Accelerate."""
    name, gpus, micro, seq_len, engine, _ = row
    hf = dict(model_type="llama", vocab_size=32000, max_position_embeddings=seq_len, rms_norm_eps=1e-5,
              tie_word_embeddings=False, attn_implementation="sdpa", **LLAMA2[name])
    layout = LayoutConfig(name=None, dp_shard=gpus, zero_stage=3, micro_batch=micro, grad_accum=1, seq_len=seq_len,
                          activation_checkpointing="full", precision="bf16")
    cluster, launcher = a100_nodes(gpus)
    eng = engine_config("deepspeed", compiled_ops=True) if engine == "deepspeed" else engine_config("fsdp")
    return RunConfig(model=ModelConfig(name=name, hf_config=hf), engine=eng, layout=layout, cluster=cluster,
                     launcher=launcher, bench=BenchConfig())


def report_zero3(title: str, rows) -> None:
    print(f"\n{title}")
    for row in rows:
        plan = make_plan(zero3_config(row))
        predicted = plan.tokens_per_s / plan.world_size
        print(f"  {row[0]:10} {row[4]:9} gpus={row[1]:<3} T={row[3]:<6} measured {row[-1]:8.0f}  predicted "
              f"{predicted:8.0f}  {predicted / row[-1] - 1:+6.1%}  fits {'yes' if plan.fits else 'no'}")


def report(title: str, rows, engine: str, kernel: str, vocab: int, sequence_parallel: bool = True) -> None:
    print(f"\n{title}")
    for row in rows:
        plan = make_plan(config(row, engine, kernel, vocab, sequence_parallel))
        measured = row[-1] / row[4]
        predicted = plan.tokens_per_s / plan.world_size
        print(f"  {row[0]:10} gpus={row[4]:<5} measured {measured:8.0f}  predicted {predicted:8.0f}  "
              f"{predicted / measured - 1:+6.1%}  predicted MFU {plan.predicted_mfu:.2f}")


if __name__ == "__main__":
    report("NeMo-Megatron-Launcher 2022, DGX A100 80GB, as the harness's Megatron-LM export (tokens/s per GPU)",
           NEMO, "megatron_lm", "flash_attention_2", 50257)
    report("Megatron-Turing NLG 530B 2021, DGX A100, as the Megatron-LM export without sequence parallelism",
           MTNLG, "megatron_lm", "flash_attention_2", 50272, sequence_parallel=False)
    for engine in ("megatron_lm", "fsdp"):
        report(f"flash-attention's GPT3 trainer, 8 x A100 80GB, FlashAttention v1, as {engine}",
               FLASH, engine, "flash_attention_1", 50264)
    report_zero3("XTuner 2024, A100-SXM4-80GB, sequence parallelism 1, as the harness's DeepSpeed ZeRO-3 (tokens/s "
                 "per GPU)", XTUNER)
    report_zero3("Hugging Face blog 2024, Granite-7B on 4 A100, FSDP and DeepSpeed ZeRO-3 as the harness's engines",
                 HF_BLOG)
