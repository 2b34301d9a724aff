"""Published GPU training runs as harness configs: one CSV per public table under tests/data/ (each file's header
names its source and its conventions), one mapping per table onto a RunConfig, and the one error measure the
tests, the bench and calibration share.

Only `make_plan` is asked about a run: nothing here launches. A table's tokens/s per GPU is convention-free; where
it also gives model FLOPs (an MFU or TFLOP/s column), `table_flops_per_token` is the FLOPs per token that column
implies, and each mapping sets the harness's FLOP convention (BenchConfig.flop_attention, flop_include_lm_head) to
the table's, so that the plan's flops_per_token can be checked against it."""

from __future__ import annotations

import csv
import re
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from harness.config.schema import (DEFAULT_ATTENTION_KERNEL, AttentionKernel, BackwardPrefetch, BenchConfig, ClusterConfig,
                                   LauncherConfig, LayoutConfig, ModelConfig, RunConfig, engine_config)
from harness.plan.planner import Plan, make_plan

DATA = Path(__file__).resolve().parents[1] / "data"
Row = Mapping[str, str]


@dataclass(frozen=True)
class PublishedRun:
    """One row of a public table: the harness config of its layout and what the table measured."""

    table: str
    label: str
    engine: str
    config: RunConfig
    tokens_per_s_per_gpu: float
    source: str
    # FLOPs per token the table's own MFU / TFLOP/s column implies under its peak (None: the table gives none)
    table_flops_per_token: Optional[float] = None
    # the config whose FLOPs that column counts, where it differs from `config` (a vocabulary the run did not use)
    flop_config: Optional[RunConfig] = None
    # a table whose MFU counts 6 x its model's nominal size (FlagPerf: "7B" as 7e9) instead of its FLOPs: that size
    table_nominal_params: Optional[float] = None


def read_rows(path: Path) -> List[Dict[str, str]]:
    """A table's rows (its `#` header lines are the source and conventions, not data)."""
    with path.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def source_of(path: Path) -> str:
    """The first header line of a table: where it comes from."""
    with path.open() as f:
        return f.readline().lstrip("# ").strip()


def _launcher(gpus: int) -> LauncherConfig:
    """Whole nodes under Slurm when the run spans several (as launcher=slurm_gpu), else a local launch."""
    return LauncherConfig(backend="slurm", exclusive=True, time_limit="02:00:00") if gpus > 8 else LauncherConfig()


def _cluster(gpus: int, accelerator: str, inter_node_gbps: float = 0.0,
             attention_kernel: AttentionKernel = DEFAULT_ATTENTION_KERNEL) -> ClusterConfig:
    """Whole nodes of 8 GPUs (fewer GPUs: one node holding them all). inter_node_gbps 0 keeps the hardware
    profile's fabric (harness.plan.hardware: 8 x 400 Gbps on H100 nodes, 8 x 200 Gbps on A100 nodes)."""
    return ClusterConfig(name=accelerator, nodes=max(1, gpus // 8), accelerators_per_node=min(8, gpus),
                         accelerator=accelerator, host_memory_gib=2048, inter_node_gbps=inter_node_gbps,
                         attention_kernel=attention_kernel)


# ------------------------------------------------------------------------------------------ llm-foundry (fsdp)
# llm-foundry's MPT runs: MFU over the dense BF16 peak, 6N + 12·L·d·T per token (the full attention matrix, N
# with the tied embedding) = the harness's flop_attention=full with the lm_head.
_FOUNDRY_CONVENTION = dict(flop_attention="full", flop_include_lm_head=True)
_FOUNDRY_ZERO = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}
# The attention kernel each table ran (mosaicml/llm-foundry, scripts/train/benchmarking/; each CSV's header).
# The H100, A100 80GB and A100 40GB tables were measured with submit_benchmarks.py, whose --attn_impl defaults to
# "triton" at the commits that wrote them (300cc5c58, 2023-05: the A100 tables; b2a43a147, 2023-10: all three),
# sweep.sh passing none: MPT's Triton port of FlashAttention v1, beside flash-attn 1.0.3 / 1.0.9 (setup.py's gpu
# extra then); the README keeps "TODO: Update tables with torch 2.0". The large-scale H100 table (5e85bd62d,
# 2024-01) was measured by sweep.py with flash-attn 2.4.2 installed (pip_install ".[gpu-flash2]"): attn_impl
# flash (FlashAttention-2's variable-length kernel behind flash-attn's unpad / pad, MPT's flash_attn_fn) for 1b, 3b,
# 7b and 70b, attn_impl triton for 13b and 30b.
_FOUNDRY_TRITON = AttentionKernel.flash_attention_1_triton
_FOUNDRY_LARGE_TRITON = ("13b", "30b")


def _foundry_large_kernel(row: Row) -> AttentionKernel:
    """The large-scale table's kernel by model (sweep.py's --attn_impl per model yaml)."""
    return _FOUNDRY_TRITON if row["model"] in _FOUNDRY_LARGE_TRITON else AttentionKernel.flash_attention_2_unpadded


# Composer's FSDP as the llm-foundry runs had it: FSDP1 (FullyShardedDataParallel). Its backward prefetch: Composer's
# default BACKWARD_POST (composer/trainer/dist_strategy.py, fsdp_config 'backward_prefetch' defaulting to
# 'BACKWARD_POST' from v0.12 to v0.21) where nothing set it: the H100 and A100 tables (sweep.sh and the pretrain
# yamls set no prefetch at b2a43a147 and 300cc5c58); the large-scale table's sweep.py (5e85bd62d) passes
# --fsdp_config_backward_prefetch BACKWARD_PRE. Mixed precision: DEFAULT and PURE both gather bf16 parameters in
# every Composer those commits pin (composer v0.14's "update fsdp mixed precision"), the harness's bf16.
_COMPOSER_DEFAULT_PREFETCH = BackwardPrefetch.BACKWARD_POST
_FOUNDRY_LARGE_PREFETCH = BackwardPrefetch.BACKWARD_PRE


def mpt_config(row: Row, accelerator: str = "h100_sxm", inter_node_gbps: float = 0.0,
               attention_kernel: AttentionKernel = DEFAULT_ATTENTION_KERNEL,
               prefetch: BackwardPrefetch = _COMPOSER_DEFAULT_PREFETCH) -> RunConfig:
    """MPT as GPT-2-shaped transformers config: learned positions, GELU MLP x4, tied embeddings, no dropout;
    Composer FSDP as the harness's Accelerate FSDP1 with the table's sharding (FULL_SHARD when the table has no
    sharding column) and the run's backward prefetch."""
    hf = dict(model_type="gpt2", n_embd=int(row["d_model"]), n_head=int(row["n_heads"]), n_layer=int(row["n_layers"]),
              n_positions=int(row["seq_len"]), vocab_size=50368, tie_word_embeddings=True,
              # MPT's MLP is nn.GELU(approximate="none"), one kernel: not GPT-2's python tanh-GELU ("gelu_new"),
              # whose intermediate tensors transformers would save (llm-foundry, mpt/modeling_mpt ffn.py)
              activation_function="gelu",
              # a fused kernel whose rate the cluster's attention_kernel sets (the table's kernel: _FOUNDRY_TRITON);
              # "sdpa" builds without the flash-attn package on this machine
              attn_implementation="sdpa", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    gpus = int(row["gpus"])
    return RunConfig(
        model=ModelConfig(name=f"mpt-{row['model']}", hf_config=hf),
        engine=engine_config("fsdp", fsdp_version=1, backward_prefetch=prefetch),
        layout=LayoutConfig(dp_shard=gpus, zero_stage=_FOUNDRY_ZERO[row.get("sharding") or "FULL_SHARD"],
                            micro_batch=int(row["micro_batch"]), grad_accum=int(row["grad_accum"]),
                            seq_len=int(row["seq_len"]), activation_checkpointing=row["checkpointing"],
                            precision="bf16"),
        cluster=_cluster(gpus, accelerator, inter_node_gbps, attention_kernel), launcher=_launcher(gpus),
        bench=BenchConfig(**_FOUNDRY_CONVENTION))


def _foundry(accelerator: str, peak: float, inter_node_gbps: float = 0.0,
             kernel: Callable[[Row], AttentionKernel] = lambda row: _FOUNDRY_TRITON,
             prefetch: BackwardPrefetch = _COMPOSER_DEFAULT_PREFETCH) -> Callable[[Row], Tuple]:
    def mapping(row: Row) -> Tuple:
        label = (f"mpt-{row['model']} T={row['seq_len']} gpus={row['gpus']} mb={row['micro_batch']} "
                 f"ckpt={row['checkpointing']}{' ' + row['sharding'] if row.get('sharding') else ''}")
        measured = float(row["tokens_per_s_per_gpu"])
        # MPT's N counts the learned position table (seq_len x d_model: the NumParams column grows with the
        # sequence), whose 6·N FLOPs no matmul performs; the harness counts none
        flops = float(row["mfu"]) * peak / measured - 6 * int(row["seq_len"]) * int(row["d_model"])
        return label, mpt_config(row, accelerator, inter_node_gbps, kernel(row), prefetch), measured, flops, None
    return mapping


# ------------------------------------------------------------------------------------- fms-fsdp (fsdp)
# Llama-2 shapes from the HF config (meta-llama/Llama-2-7b-hf). MFU: 6N + 12·L·h·T with N every parameter, the
# harness's flop_attention=full with the lm_head.
_LLAMA2 = {"llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                             num_key_value_heads=32)}
_FMS_PEAK = {"a100_sxm": 312e12, "h100_sxm": 989e12}


def fms_config(row: Row) -> RunConfig:
    """IBM's FSDP runs (HSDP: shard within a node, replicate across nodes) as the harness's Accelerate FSDP with
    ZeRO-3 sharding over dp_shard and torch.compile. The runs were FSDP1 + compile, a pair the harness refuses
    (it compiles blocks before sharding, which FSDP1's flat parameters replace): FSDP2 stands in, the same
    per-block gathers and reduce-scatters."""
    if row["model"] not in _LLAMA2 or row["sharding"] != "HSDP":
        raise ValueError(f"fms-fsdp table: model={row['model']!r} sharding={row['sharding']!r} has no mapping here")
    hf = dict(model_type="llama", vocab_size=32000, max_position_embeddings=int(row["seq_len"]), rms_norm_eps=1e-5,
              tie_word_embeddings=False, attn_implementation="sdpa", **_LLAMA2[row["model"]])
    gpus = int(row["gpus"])
    layout = LayoutConfig(name=None, dp_shard=min(8, gpus), dp_replicate=max(1, gpus // 8), zero_stage=3,
                          micro_batch=int(row["micro_batch"]), grad_accum=int(row["grad_accum"]),
                          seq_len=int(row["seq_len"]), activation_checkpointing=row["checkpointing"],
                          precision="bf16")
    return RunConfig(model=ModelConfig(name=row["model"], hf_config=hf),
                     engine=engine_config("fsdp", fsdp_version=2, compile=row["compile"] == "true"), layout=layout,
                     cluster=_cluster(gpus, row["accelerator"], float(row["inter_node_gbps"])),
                     launcher=_launcher(gpus), bench=BenchConfig(flop_attention="full", flop_include_lm_head=True))


def _fms(row: Row) -> Tuple:
    label = f"{row['model']} {row['accelerator']} gpus={row['gpus']} {row['sharding']} mb={row['micro_batch']}"
    measured = float(row["tokens_per_s_per_gpu"])
    return label, fms_config(row), measured, float(row["mfu"]) * _FMS_PEAK[row["accelerator"]] / measured, None


# ------------------------------------------------------------------------------- dgxc-benchmarking (megatron)
# Llama 3.1 shapes from the HF configs (meta-llama/Llama-3.1-{8B,70B,405B}); layers, query groups and vocabulary
# come from the row (the 405b proxies run fewer layers; NeMo's 24.12 405b yaml runs 16 query groups and the GPT-2
# tokenizer).
_LLAMA31 = {
    "llama3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8),
    "llama3.1-70b": dict(hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8),
    "llama3.1-405b": dict(hidden_size=16384, intermediate_size=53248, num_attention_heads=128, num_key_value_heads=8),
}
# The README's MFU lines: flop_attention=full (12·L·h·s per token) with the LM head, over 989 TFLOP/s.
_DGXC_CONVENTION = dict(flop_attention="full", flop_include_lm_head=True)
_DGXC_PEAK = 989e12


def _megatron_model(row: Row, vocab: int) -> ModelConfig:
    if row["model"] in _LLAMA31:
        hf = dict(model_type="llama", num_hidden_layers=int(row["layers"]), vocab_size=vocab,
                  max_position_embeddings=int(row["seq_len"]), rope_theta=500000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, attn_implementation="sdpa",
                  **{**_LLAMA31[row["model"]], "num_key_value_heads": int(row["query_groups"])})
    elif row["model"] == "gpt3-175b":
        hf = dict(model_type="gpt2", n_embd=12288, n_head=96, n_layer=int(row["layers"]),
                  n_positions=int(row["seq_len"]), vocab_size=vocab, tie_word_embeddings=True,
                  attn_implementation="sdpa", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    else:
        raise ValueError(f"dgxc table: model={row['model']!r} has no shape here")
    return ModelConfig(name=row["model"], hf_config=hf)


def stage_layers(row: Row) -> List[int]:
    """Decoder layers per model chunk in Megatron's global order (empty: an even split). `embedding_loss` is
    NeMo's account_for_embedding_in_pipeline_split + account_for_loss_in_pipeline_split: the embedding and the
    loss each take one layer's place, so the first and the last chunk hold one decoder layer fewer."""
    chunks = int(row["pp"]) * int(row["vp"])
    if row["split"] == "even" or int(row["pp"]) == 1:
        return []
    total = int(row["layers"]) + 2
    if row["split"] != "embedding_loss" or total % chunks:
        raise ValueError(f"dgxc table: split={row['split']!r} with {row['layers']} layers over {chunks} chunks")
    layers = [total // chunks] * chunks
    layers[0] -= 1
    layers[-1] -= 1
    return layers


def dgxc_config(row: Row, vocab: Optional[int] = None, bf16_grads: bool = False) -> RunConfig:
    """A NeMo / Megatron-core run as the harness's Megatron-LM export: the distributed optimizer (ZeRO-1 with
    overlapped gradient reduce and parameter gather), sequence parallel as the row says, interleaved 1F1B with
    the row's virtual stages and layer split, no recompute. `vocab` replaces the row's (the MFU check counts
    mfu_vocab). `bf16_grads`: gradients reduced and kept in bf16 (NeMo 1's optim.grad_sync_dtype: bf16)."""
    gpus, tp, pp, cp, vp = (int(row[k]) for k in ("gpus", "tp", "pp", "cp", "vp"))
    dp = gpus // (tp * pp * cp)
    gbs, mbs = int(row["gbs"]), int(row["mbs"])
    if gbs % (mbs * dp):
        raise ValueError(f"dgxc table: gbs={gbs} is not a multiple of mbs={mbs} x dp={dp} ({row['model']})")
    layout = LayoutConfig(name=None, dp_shard=dp, tp=tp, pp=pp, cp=cp, zero_stage=1, micro_batch=mbs,
                          grad_accum=gbs // (mbs * dp), seq_len=int(row["seq_len"]),
                          pp_schedule="Interleaved1F1B" if vp > 1 else "1F1B", pp_virtual_stages=vp,
                          pp_stage_layers=stage_layers(row), activation_checkpointing=row["checkpointing"],
                          precision="bf16")
    return RunConfig(model=_megatron_model(row, vocab or int(row["vocab"])),
                     engine=engine_config("megatron_lm", sequence_parallel=row["sequence_parallel"] == "true",
                                          grad_reduce_in_bf16=bf16_grads),
                     layout=layout, cluster=_cluster(gpus, "h100_sxm"), launcher=_launcher(gpus),
                     bench=BenchConfig(**_DGXC_CONVENTION))


def _dgxc_mapping(bf16_grads: bool) -> Callable[[Row], Tuple]:
    """The dgxc rows of one release, both with 2-byte gradients: v25.02's NeMo 1 yamls set optim.grad_sync_dtype:
    bf16; v25.04.01's llama3.1/pretrain_llama31.py builds NeMo 2.0's recipes with performance_mode=True, whose
    pretrain_performance_optimizations sets grad_reduce_in_fp32=False (NVIDIA/NeMo
    nemo/collections/llm/recipes/llama3_8b.py, llama3_70b.py, llama31_405b.py)."""
    def mapping(row: Row) -> Tuple:
        label = f"{row['model']} L={row['layers']} gpus={row['gpus']} gbs={row['gbs']}"
        measured = float(row["tokens_per_s"]) / int(row["gpus"])
        # the 405b runs used the GPT-2 tokenizer, but the README's MFU counts Llama's vocabulary (mfu_vocab)
        flop_config = (dgxc_config(row, vocab=int(row["mfu_vocab"]), bf16_grads=bf16_grads)
                       if row["mfu_vocab"] != row["vocab"] else None)
        config = dgxc_config(row, bf16_grads=bf16_grads)
        return label, config, measured, float(row["mfu"]) * _DGXC_PEAK / measured, flop_config
    return mapping


# ------------------------------------------------------------------------------------ NeMo AutoModel (nd)
# The row's TFLOP/s per GPU over its tokens/s per GPU: 6 * non-embedding parameters + LM head + causal attention,
# the harness's flop_attention=causal with the lm_head.
_AUTOMODEL_CONVENTION = dict(flop_attention="causal", flop_include_lm_head=True)


def automodel_config(row: Row) -> RunConfig:
    """NeMo AutoModel's FSDP2 x CP pretraining as the harness's torch-native `nd` engine with torch.compile."""
    if row["model"] != "llama3.1-70b":
        raise ValueError(f"automodel table: model={row['model']!r} has no shape here")
    hf = dict(model_type="llama", num_hidden_layers=80, vocab_size=128256, max_position_embeddings=int(row["seq_len"]),
              rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, attn_implementation="sdpa",
              **_LLAMA31["llama3.1-70b"])
    gpus = int(row["gpus"])
    layout = LayoutConfig(name=None, dp_shard=int(row["dp_shard"]), tp=int(row["tp"]), cp=int(row["cp"]),
                          zero_stage=3, micro_batch=int(row["local_batch"]), grad_accum=int(row["grad_accum"]),
                          seq_len=int(row["seq_len"]), activation_checkpointing=row["checkpointing"],
                          precision="bf16")
    return RunConfig(model=ModelConfig(name=row["model"], hf_config=hf),
                     engine=engine_config("nd", compile=row["compile"] == "true"), layout=layout,
                     cluster=_cluster(gpus, "h100_sxm"), launcher=_launcher(gpus),
                     bench=BenchConfig(**_AUTOMODEL_CONVENTION))


def _automodel(row: Row) -> Tuple:
    label = f"{row['model']} gpus={row['gpus']} gbs={row['gbs']}"
    measured = float(row["tokens_per_s_per_gpu"])
    return label, automodel_config(row), measured, float(row["model_tflops_per_gpu"]) * 1e12 / measured, None


# ------------------------------------------------------------------------------- FlagPerf (deepspeed)
# The tables' models (the CSV's header: the benchmarks' config.json; ChatGLM3-6B's shapes as a Qwen2 decoder)
_FLAGPERF_MODELS = {
    "llama2-7b": dict(model_type="llama", vocab_size=32000, max_position_embeddings=4096, **_LLAMA2["llama2-7b"]),
    "chatglm3-6b": dict(model_type="qwen2", vocab_size=65024, max_position_embeddings=8192, hidden_size=4096,
                        intermediate_size=13696, num_hidden_layers=28, num_attention_heads=32, num_key_value_heads=2),
}


def flagperf_deepspeed_config(row: Row) -> RunConfig:
    """FlagPerf's DeepSpeed ZeRO-3 runs on one node of A800 / H800 / H100 as the harness's deepspeed engine: the
    chip's compute profile with its NVLink bus bandwidth and the attention kernel from the row (the CSV's header
    derives them), and DeepSpeed's fused Adam (ds_config's AdamW: compiled_ops)."""
    hf = dict(rms_norm_eps=1e-5, tie_word_embeddings=False, attn_implementation="sdpa",
              **_FLAGPERF_MODELS[row["model"]])
    gpus = int(row["gpus"])
    layout = LayoutConfig(name=None, dp_shard=gpus, zero_stage=3, micro_batch=int(row["micro_batch"]),
                          grad_accum=int(row["grad_accum"]), seq_len=int(row["seq_len"]),
                          activation_checkpointing="none", precision="bf16")
    cluster = replace(_cluster(gpus, row["accelerator"], attention_kernel=AttentionKernel(row["attention_kernel"])),
                      intra_node_gbps=float(row["nvlink_bus_gbps"]))
    return RunConfig(model=ModelConfig(name=row["model"], hf_config=hf),
                     engine=engine_config("deepspeed", compiled_ops=True), layout=layout, cluster=cluster,
                     launcher=_launcher(gpus), bench=BenchConfig())


# The MFU column: token/p/s x 6 x a rounded size over the chip's peak (run_pretraining.py): the nominal "7B" / "6B",
# not FLOPs per token.
_FLAGPERF_PEAK = {"a100_sxm": 312e12, "h100_sxm": 989e12}


def _flagperf_nominal(row: Row, measured: float) -> float:
    """The nominal parameter count a FlagPerf row's MFU column counts: MFU x peak / (6 x token/p/s)."""
    return float(row["mfu"]) * _FLAGPERF_PEAK[row["accelerator"]] / measured / 6


def _flagperf_deepspeed(row: Row) -> Tuple:
    label = (f"{row['model']} {row['chip']} gpus={row['gpus']} T={row['seq_len']} mb={row['micro_batch']} "
             f"ga={row['grad_accum']}")
    measured = float(row["tokens_per_s_per_gpu"])
    nominal = _flagperf_nominal(row, measured)
    return label, flagperf_deepspeed_config(row), measured, None, None, nominal


# ------------------------------------------------------------------------------- FlagPerf (megatron)
# The same site's Megatron-core runs (the CSV's header), mapped as the dgxc rows are: Llama 3's shapes are Llama 3.1's
_FLAGPERF_MEGATRON_SHAPES = {"llama3-8b": "llama3.1-8b", "llama3-70b": "llama3.1-70b"}


def flagperf_megatron_config(row: Row) -> RunConfig:
    """FlagPerf's Megatron-LM runs as the harness's export (dgxc_config: the distributed optimizer, sequence parallel
    where tp > 1, no recompute) with fp32 main gradients, tied embeddings, and the row's chip and NVLink."""
    config = dgxc_config({**row, "model": _FLAGPERF_MEGATRON_SHAPES[row["model"]]})
    model = ModelConfig(name=row["model"], hf_config={**config.model.hf_config, "tie_word_embeddings": True})
    gpus, nvlink = int(row["gpus"]), float(row["nvlink_bus_gbps"])
    cluster = _cluster(gpus, row["accelerator"])
    return replace(config, model=model, cluster=replace(cluster, intra_node_gbps=nvlink) if nvlink else cluster,
                   bench=BenchConfig())


def _flagperf_megatron(row: Row) -> Tuple:
    label = f"{row['model']} {row['chip']} gpus={row['gpus']} tp={row['tp']} pp={row['pp']}"
    measured = float(row["tokens_per_s_per_gpu"])
    nominal = _flagperf_nominal(row, measured)
    return label, flagperf_megatron_config(row), measured, None, None, nominal


# ----------------------------------------------------------------------------------------------- tables
@dataclass(frozen=True)
class Table:
    """A public table: its CSV, the engine its runs map onto, and the mapping of one row onto (label, config,
    measured tokens/s per GPU, the table's FLOPs per token or None, the config those FLOPs count or None[, the
    nominal parameter count its MFU counts instead of FLOPs])."""

    path: Path
    engine: str
    mapping: Callable[[Row], Tuple]


TABLES: Dict[str, Table] = {
    "llm_foundry_h100": Table(DATA / "llm_foundry_h100_bf16.csv", "fsdp", _foundry("h100_sxm", 989.5e12)),
    "llm_foundry_h100_large": Table(DATA / "llm_foundry_h100_large_bf16.csv", "fsdp",
                                    _foundry("h100_sxm", 989.5e12, kernel=_foundry_large_kernel,
                                             prefetch=_FOUNDRY_LARGE_PREFETCH)),
    # the tables' fabric: 1600 Gbps per node of 8 = 200 Gbps per GPU
    "llm_foundry_a100_80gb": Table(DATA / "llm_foundry_a100_80gb_bf16.csv", "fsdp", _foundry("a100_sxm", 312e12, 200)),
    "llm_foundry_a100_40gb": Table(DATA / "llm_foundry_a100_40gb_bf16.csv", "fsdp",
                                   _foundry("a100_sxm_40gb", 312e12, 200)),
    "fms_fsdp": Table(DATA / "fms_fsdp_bf16.csv", "fsdp", _fms),
    "dgxc_h100": Table(DATA / "dgxc_h100_bf16.csv", "megatron_lm", _dgxc_mapping(bf16_grads=True)),
    "dgxc_h100_nemo2": Table(DATA / "dgxc_h100_nemo2_bf16.csv", "megatron_lm", _dgxc_mapping(bf16_grads=True)),
    "automodel_h100": Table(DATA / "automodel_h100_bf16.csv", "nd", _automodel),
    "flagperf_deepspeed": Table(DATA / "flagperf_deepspeed_bf16.csv", "deepspeed", _flagperf_deepspeed),
    "flagperf_megatron": Table(DATA / "flagperf_megatron_bf16.csv", "megatron_lm", _flagperf_megatron),
}


def published_runs(table: Optional[str] = None) -> List[PublishedRun]:
    """Every row of one table (or of every table), mapped onto harness configs."""
    if table is not None and table not in TABLES:
        raise ValueError(f"table={table!r}: the published tables are {', '.join(TABLES)}")
    return [run for name in ([table] if table else list(TABLES)) for run in _mapped(name, TABLES[name].path)]


def _mapped(table: str, path: Path) -> List[PublishedRun]:
    """The rows of the CSV at `path`, mapped as `table`'s rows are."""
    spec, source = TABLES[table], source_of(path)
    runs = []
    for row in read_rows(path):
        label, config, measured, flops, flop_config, *nominal = spec.mapping(row)
        runs.append(PublishedRun(table, label, spec.engine, config, measured, source, flops, flop_config, *nominal))
    return runs


# A table's earlier campaign by the same source, superseded by the pinned version: the layouts measured in both
# show how far two measurements of one layout differ, the data's own noise beside the model's error
REPEATS: Dict[str, Path] = {"llm_foundry_a100_80gb": DATA / "llm_foundry_a100_80gb_2023_05_bf16.csv"}


def layout_key(run: PublishedRun) -> Tuple[str, str, int]:
    """What names a row's layout within its table: the label and the micro-batches per step."""
    return run.table, run.label, run.config.layout.grad_accum


def repeated_layouts(table: str) -> List[Tuple[PublishedRun, PublishedRun]]:
    """(row, the earlier campaign's row) for each of the table's layouts that its REPEATS campaign measured too. A row
    the pinned version carried over (the same tokens/s: llm-foundry's 70b A100 rows) is one measurement, not two."""
    earlier = {layout_key(run): run for run in _mapped(table, REPEATS[table])}
    return [(run, earlier[layout_key(run)]) for run in published_runs(table) if layout_key(run) in earlier
            and run.tokens_per_s_per_gpu != earlier[layout_key(run)].tokens_per_s_per_gpu]


def predicted_tokens_per_s_per_gpu(run: PublishedRun, plan: Optional[Plan] = None) -> float:
    """What the time model predicts for the run's layout: make_plan's tokens/s over the world size (`plan`:
    the run's plan when the caller already made it)."""
    plan = make_plan(run.config) if plan is None else plan
    if plan.tokens_per_s is None:
        raise ValueError(f"{run.table}: {run.label}: no prediction ({'; '.join(plan.errors) or 'no time'})")
    return plan.tokens_per_s / plan.world_size


def prediction_error(run: PublishedRun, plan: Optional[Plan] = None) -> float:
    """Predicted / measured tokens per second per GPU - 1: positive when the model is optimistic."""
    return predicted_tokens_per_s_per_gpu(run, plan) / run.tokens_per_s_per_gpu - 1


def gpus_of(run: PublishedRun) -> int:
    """The GPUs the row ran on."""
    return run.config.cluster.nodes * run.config.cluster.accelerators_per_node


def label_without_gpus(run: PublishedRun) -> str:
    """The row's label less its GPU count and global batch: what rows of one layout at several scales share."""
    return re.sub(r" (gpus|gbs)=\d+", "", run.label)


def weak_scaling_groups(runs: List[PublishedRun]) -> List[List[PublishedRun]]:
    """Rows of one table that differ only in their GPU count (with it the data-parallel size and the global batch),
    each group sorted by GPU count; groups of one GPU count are left out."""
    groups: Dict[Tuple[str, str, str], List[PublishedRun]] = defaultdict(list)
    for run in runs:
        layout = {k: v for k, v in asdict(run.config.layout).items() if k not in ("name", "dp_shard", "dp_replicate")}
        groups[(run.table, label_without_gpus(run), repr(sorted(layout.items())))].append(run)
    return [sorted(group, key=gpus_of) for group in groups.values() if len({gpus_of(run) for run in group}) > 1]


# A table measured at the same site and on the same chips as another one whose engine the model matches elsewhere:
# (table, its reference table). FlagPerf ran its DeepSpeed and its Megatron-core benchmarks on the same DGX A800 nodes
# and on Hopper nodes (H100; one DeepSpeed row on H800, an H100's compute): each CSV's header. NVIDIA's own
# Megatron-core runs of the same Llama 3 models on H100 (dgxc_h100*.csv) are within a few percent of the model,
# FlagPerf's are not.
SAME_SITE = {"flagperf_deepspeed": "flagperf_megatron"}


def beyond_site(table: str) -> List[Tuple[PublishedRun, float, float]]:
    """(row, its error, what it misses beyond its site) for each row of a SAME_SITE table. Beyond its site: (1 +
    error) / (1 + m) - 1, m the median error of the reference table's rows on the row's accelerator profile, so that
    what both engines miss at that site (its machines, its software stack) is taken out and what is left is the
    engine's own."""
    reference: Dict[str, List[float]] = defaultdict(list)
    for run in published_runs(SAME_SITE[table]):
        reference[run.config.cluster.accelerator].append(prediction_error(run))
    rows = []
    for run in published_runs(table):
        site = reference.get(run.config.cluster.accelerator)
        if not site:
            raise ValueError(f"{table}: {run.label}: {SAME_SITE[table]} has no row on {run.config.cluster.accelerator}")
        error = prediction_error(run)
        rows.append((run, error, (1 + error) / (1 + statistics.median(site)) - 1))
    return rows
