"""The nd engine's layout as plain data (no torch): device mesh, TP plan per family, pipeline split, checks.

Everything here is JSON: `nd.render` writes it to `nd_plan.json`, `nd_session.apply` builds the torch objects from
that file, and the unit tests (and the planner) read the same functions without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from harness.config.schema import LayoutConfig, RunConfig
from harness.engines import nd_tp
from harness.engines.optimizer import adamw_settings
from harness.plan.model_spec import ModelSpec, model_spec_from_hf
from harness.plan.parallel_dims import MESH_DIMS, ParallelDims
from harness.plan.pipeline import SPLIT_BACKWARD, V_SCHEDULES, pipeline_problems, stage_layer_counts, stage_to_rank
from harness.plan.regime import autocast_over_fp32_weights, compute_precision, torchao_float8_config
from harness.plan.resharding import reshard_after_forward
from harness.plan.planner import spec_for
from harness.plan.validate import support_problems

# Families whose causal LM runs as nd's stage module does (harness.engines.stage_module: embed_tokens, the
# decoder layers given one rotary embedding, norm, lm_head), checked by CPU runs against one process.
STAGE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "olmo2", "phi3")
# Families whose forward does more than the stage module, and what.
STAGE_REFUSED = {
    "gemma": "scales the embeddings by sqrt(hidden_size) outside the embedding module",
    "gemma2": "scales the embeddings outside the embedding module and soft-caps the final logits",
    "gemma3_text": "gives local and global layers different rotary embeddings",
}

REPLICATE, SHARD_SEQ, SHARD_LAST = "Replicate()", "Shard(1)", "Shard(-1)"


# --------------------------------------------------------------------------------------------- mesh
def fsdp_shard_size(layout: LayoutConfig) -> int:
    """Ranks one parameter is sharded over: dp_shard x cp under FSDP (zero_stage 2/3), else 1.

    Context-parallel ranks hold the same weights, so FSDP shards over them too (torchtitan's dp_shard_cp);
    zero_stage 0 replicates over every data rank instead.
    """
    return ParallelDims.of(layout).dp_shard_cp if layout.zero_stage >= 2 else 1


def data_parallel_plan(layout: LayoutConfig) -> Optional[Dict[str, Any]]:
    """How the data axes hold the weights: FSDP2 `fully_shard` (zero_stage 2/3, HSDP when dp_replicate > 1)
    or FSDP2-style `replicate` (zero_stage 0); None when every data axis has size 1."""
    if ParallelDims.of(layout).data_ranks == 1:
        return None
    shard_dim = "dp_shard_cp" if layout.cp > 1 else "dp_shard"
    if layout.zero_stage >= 2:
        wrapper = "fully_shard"
        dims = (["dp_replicate"] if layout.dp_replicate > 1 else []) + [shard_dim]
    else:
        wrapper, dims = "replicate", ["dp_replicate_shard_cp"]
    offload = layout.offload_params if layout.offload_params != "none" else None
    return {
        "wrapper": wrapper,
        # Names of the mesh dims the wrapper is given (flattened from MESH_DIMS where they join several).
        "mesh_dims": dims,
        "shard_size": fsdp_shard_size(layout),
        "replicate_size": ParallelDims.of(layout).data_ranks // fsdp_shard_size(layout),
        # ZeRO-3 frees the gathered weights after forward, ZeRO-2 keeps them until backward; with pp > 1 they
        # stay gathered across the step's micro-batches (harness.plan.resharding).
        "reshard_after_forward": reshard_after_forward(layout),
        "units": ["each decoder layer", "each pipeline stage (root)"],
        "mixed_precision": ({"param_dtype": "bf16", "reduce_dtype": "fp32"}
                            if compute_precision(layout.precision) == "bf16" else None),
        # CPUOffloadPolicy: sharded parameters, gradients and the optimizer step on the host.
        "offload": offload,
    }


# ------------------------------------------------------------------------------------------ TP plans
def _style(style: str, **kwargs: Any) -> Dict[str, Any]:
    return {"style": style, **kwargs}


def layer_tp_plan(hf_config: Mapping[str, Any], sequence_parallel: bool) -> Dict[str, Dict[str, Any]]:
    """Megatron's plan for one decoder layer, keyed by module path inside the layer: transformers'
    `base_model_tp_plan` translated to torch styles, plus sequence parallelism (harness.engines.nd_tp).

    q/k/v (and gate/up) are column-parallel: each rank computes heads/num_tp of the heads (and a slice of the
    MLP) with no communication; o_proj and down_proj are row-parallel and all-reduce (or, with sequence
    parallelism, reduce-scatter to sequence shards). Column biases are sharded with their columns.
    A routed-expert block (Mixtral, Qwen3-MoE) is not split: with sequence parallelism its input is gathered
    and its output re-sharded, so every TP rank routes the same tokens and expert gradients agree.
    Raises, naming the family and the missing plan or style, where nd cannot split the family.
    """
    return nd_tp.layer_plan(hf_config, sequence_parallel)


def top_tp_plan(sequence_parallel: bool, loss_parallel: bool) -> Dict[str, Dict[str, Any]]:
    """Embedding (vocab-parallel rows), final norm and LM head (vocab-parallel columns), keyed by stage path.

    With loss parallelism the logits stay sharded over the vocabulary and cross-entropy is computed on the
    shards (`loss_parallel()`), so the full [tokens, vocab] logits are never gathered.
    """
    seq = sequence_parallel
    return {
        "embed_tokens": _style("RowwiseParallel", input_layouts=REPLICATE,
                               output_layouts=SHARD_SEQ if seq else REPLICATE),
        **({"norm": _style("SequenceParallel")} if seq else {}),
        "lm_head": _style(
            "ColwiseParallel",
            input_layouts=SHARD_SEQ if seq else REPLICATE,
            output_layouts=SHARD_LAST if loss_parallel else REPLICATE,
            use_local_output=not loss_parallel,
        ),
    }


def tp_attention_heads(spec: ModelSpec, tp: int) -> Dict[str, int]:
    """Heads each TP rank computes: the attention modules are told these counts."""
    return {"num_attention_heads": spec.num_heads // tp, "num_key_value_heads": spec.num_kv_heads // tp}


# ------------------------------------------------------------------------------------------ pipeline
def pipeline_plan(num_layers: int, layout: LayoutConfig) -> Dict[str, Any]:
    """Stages in global order with their layers and pipeline rank (harness.plan.pipeline's split and placement)."""
    counts = stage_layer_counts(num_layers, layout.pp, layout.pp_virtual_stages, layout.pp_stage_layers)
    stages = len(counts)
    out, first = [], 0
    for index, count in enumerate(counts):
        out.append({
            "stage": index,
            "pp_rank": stage_to_rank(index, layout.pp, layout.pp_schedule),
            "layers": list(range(first, first + count)),
            "embedding": index == 0,
            "head": index == stages - 1,
        })  # fmt: skip
        first += count
    return {
        "schedule": layout.pp_schedule,
        "num_stages": stages,
        "virtual_stages_per_rank": layout.pp_virtual_stages,
        "placement": "v" if layout.pp_schedule in V_SCHEDULES else "loop",
        # The step's grad_accum micro-batches are the schedule's micro-batches.
        "n_microbatches": layout.grad_accum,
        "microbatch_rows": layout.micro_batch,
        "stages": out,
    }


# -------------------------------------------------------------------------------------- whole plan
def nd_plan(cfg: RunConfig) -> Dict[str, Any]:
    """The content of `nd_plan.json` (validated first: an invalid layout raises, naming every problem)."""
    errors, _ = check(cfg)
    if errors:
        raise ValueError("nd cannot run this layout:\n  - " + "\n  - ".join(errors))
    layout, engine = cfg.layout, cfg.engine
    spec = spec_for(cfg.model)
    sp = engine.sequence_parallel and layout.tp > 1
    lp = engine.loss_parallel and layout.tp > 1
    data = data_parallel_plan(layout)
    dims = ParallelDims.of(layout)
    return {
        "engine": "nd",
        "model_type": spec.model_type,
        "mesh": {"dim_names": list(MESH_DIMS), "shape": dims.mesh_shape(), "world_size": dims.world_size,
                 "device_type": "cpu" if cfg.cluster.accelerator == "cpu" else "cuda"},
        # Ranks with one data-parallel rank read the same batch; the wrapper says how weights are held.
        "data_parallel": {"size": dims.dp, "batch_dims": ["dp_replicate", "dp_shard"],
                          **(data or {"wrapper": None})},
        "tensor_parallel": {
            "size": layout.tp,
            "sequence_parallel": sp,
            "loss_parallel": lp,
            "heads_per_rank": tp_attention_heads(spec, layout.tp),
            "layer_plan": layer_tp_plan(cfg.model.hf_config, sp) if layout.tp > 1 else {},
            "top_plan": top_tp_plan(sp, lp) if layout.tp > 1 else {},
        },
        "pipeline": pipeline_plan(spec.num_layers, layout) if layout.pp > 1 else None,
        "context_parallel": context_parallel_plan(layout) if layout.cp > 1 else None,
        "activation_checkpointing": layout.activation_checkpointing,
        "precision": layout.precision,
        # Without a data-parallel wrapper there is no mixed-precision policy: bf16 runs under autocast.
        "autocast_bf16": autocast_over_fp32_weights("nd", layout),
        # layout.precision=fp8: torchao float8 linears (harness.engines.float8), else None.
        "float8": torchao_float8_config() if layout.precision == "fp8" else None,
        "optimizer": {"type": "AdamW", **adamw_settings(cfg.bench), "grad_clip": cfg.bench.grad_clip},
    }  # fmt: skip


def context_parallel_plan(layout: LayoutConfig) -> Dict[str, Any]:
    """Ring attention over the `cp` mesh dim (GPU only: there is no CPU sharding rule for SDPA)."""
    return {
        "size": layout.cp,
        "gpu_only": True,
        # Tokens, labels and rotary positions are split along the sequence; load balancing gives each
        # rank chunk i and 2*cp-1-i so causal work is even, hence seq_len % (2*cp) == 0.
        "buffers": ["input_ids", "labels", "position_ids"],
        "buffer_seq_dims": [1, 1, 1],
        "rotate_method": "allgather",
        "load_balance": True,
    }


# -------------------------------------------------------------------------------------------- checks
def _pipeline_problems(spec: ModelSpec, layout: LayoutConfig) -> List[str]:
    errors, _ = pipeline_problems(layout.pp, layout.pp_virtual_stages, layout.grad_accum, layout.pp_schedule,
                                  layout.pp_stage_layers, spec.num_layers)
    errors = list(errors)
    if layout.pp > 1 and layout.pp_schedule in SPLIT_BACKWARD and layout.activation_checkpointing == "selective":
        # the input pass and the weight pass each run backward over the layer; torch's selective checkpointing
        # allows one ("Trying to backward an extra time ... under selective activation checkpoint", a CPU run)
        errors.append(f"activation_checkpointing='selective' with pp_schedule={layout.pp_schedule}: its split "
                      "backward runs each layer's backward twice, which torch's selective checkpointing refuses "
                      "(use full, or a schedule without a split backward: 1F1B, Interleaved1F1B)")
    return errors


def _tp_problems(spec: ModelSpec, layout: LayoutConfig, cfg: RunConfig) -> List[str]:
    tp, problems = layout.tp, []
    if tp == 1:
        return problems
    if spec.num_heads % tp:
        problems.append(f"tp={tp} must divide num_attention_heads={spec.num_heads}")
    if spec.num_kv_heads % tp:
        problems.append(f"tp={tp} must divide num_key_value_heads={spec.num_kv_heads} "
                        f"(nd does not replicate kv heads)")
    if not spec.is_moe and spec.ffn_size % tp:
        problems.append(f"tp={tp} must divide intermediate_size={spec.ffn_size}")
    if cfg.engine.sequence_parallel and layout.seq_len % tp:
        problems.append(f"engine.sequence_parallel needs tp={tp} to divide layout.seq_len={layout.seq_len}")
    return problems


def family_problems(spec: ModelSpec) -> List[str]:
    """The model families engine=nd's stage module cannot run, whatever the layout."""
    if spec.model_type in STAGE_REFUSED:
        return [f"model.hf_config.model_type={spec.model_type!r}: engine=nd's stage module runs embed_tokens, "
                f"the decoder layers, norm and lm_head; this family {STAGE_REFUSED[spec.model_type]}"]
    if spec.model_type not in STAGE_FAMILIES:
        return [f"model.hf_config.model_type={spec.model_type!r}: engine=nd runs {', '.join(STAGE_FAMILIES)} "
                f"(families whose forward its stage module reproduces, checked against one process)"]
    return []


def _model_problems(spec: ModelSpec, cfg: RunConfig) -> List[str]:
    layout, problems = cfg.layout, []
    family = family_problems(spec)
    if family:
        return family
    if layout.tp > 1:
        problems += nd_tp.tp_plan_problems(cfg.model.hf_config)
    if spec.tied_embeddings and (layout.tp > 1 or layout.pp > 1):
        problems.append(f"tie_word_embeddings=true with tp={layout.tp}, pp={layout.pp}: engine=nd splits the "
                        f"embedding and the LM head separately (untie them or use tp=pp=1)")
    if spec.attn_implementation == "eager":
        problems.append("attn_implementation=eager: engine=nd stages pass no attention mask, and eager attention "
                        "without one is not causal (use sdpa or flash_attention_2)")
    hf = cfg.model.hf_config
    window = hf.get("sliding_window")
    if spec.model_type == "qwen2" and not hf.get("use_sliding_window", False):
        window = None
    if window is not None and int(window) < layout.seq_len:
        problems.append(f"sliding_window={window} < layout.seq_len={layout.seq_len}: nd stages pass no attention "
                        f"mask (causal SDPA), which would attend past the window")
    return problems


def _data_parallel_problems(layout: LayoutConfig) -> List[str]:
    """FSDP2 offloads only across a data axis; zero stages and offload targets are the support table's."""
    offloaded = "cpu" in (layout.offload_optimizer, layout.offload_params)
    if offloaded and ParallelDims.of(layout).data_ranks == 1:
        return ["layout.offload_*=cpu needs a data axis (dp_replicate*dp_shard*cp > 1) for FSDP2 to offload"]
    return []


def check(cfg: RunConfig) -> Tuple[List[str], List[str]]:
    """(errors, warnings) for running this config with engine=nd; each names the field, value and rule."""
    layout, engine = cfg.layout, cfg.engine
    spec = spec_for(cfg.model)
    errors = support_problems(cfg) + _model_problems(spec, cfg)  # the table's: no ep, cp on GPU only, ...
    warnings: List[str] = []
    errors += ParallelDims.of(layout).world_problems(cfg.cluster.nodes, cfg.cluster.accelerators_per_node)[0]
    if layout.precision == "fp16":
        errors.append("layout.precision=fp16: engine=nd trains bf16 or fp32 (fp16 needs a loss scaler)")
    errors += _data_parallel_problems(layout)
    if layout.cp > 1 and layout.seq_len % (2 * layout.cp):
        errors.append(f"layout.cp={layout.cp} needs seq_len={layout.seq_len} divisible by 2*cp={2 * layout.cp} "
                      f"(load-balanced causal chunks)")
    errors += _tp_problems(spec, layout, cfg) + _pipeline_problems(spec, layout)
    if layout.tp == 1 and engine.sequence_parallel:
        warnings.append("engine.sequence_parallel has no effect with tp=1")
    if layout.tp == 1 and engine.loss_parallel:
        warnings.append("engine.loss_parallel has no effect with tp=1")
    if layout.pp == 1 and layout.pp_schedule != "1F1B":
        warnings.append(f"layout.pp_schedule={layout.pp_schedule} has no effect with pp=1")
    return errors, warnings


# ------------------------------------------------------------------------------------ state bytes
@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor: where it lives (stage part), its global shape, its TP placement."""

    part: str  # "embedding", "layer", "head" (final norm and LM head)
    name: str
    shape: Tuple[int, ...]
    tp_dim: Optional[int]  # dim sharded over tp, or None (replicated over tp)


def _tp_dim(style: Optional[Dict[str, Any]], name: str) -> Optional[int]:
    """The dim nd's style splits: a column-parallel weight and bias their rows (output features), a
    row-parallel weight its columns (its bias stays whole); anything else is replicated."""
    kind = style and style["style"]
    if kind == "ColwiseParallel":
        return 0
    if kind == "RowwiseParallel" and not name.endswith(".bias"):
        return 1
    return None


def _shape_tensors(hf_config: Mapping[str, Any], tp: int) -> Tuple[List[List[ParamTensor]], List[int],
                                                                   List[ParamTensor], List[ParamTensor]]:
    """(tensors per decoder layer kind, kind of each layer, embedding tables, final norm and head) as
    transformers allocates them, each with the dim nd's TP plan splits."""
    from harness.config.model_shape import model_shape

    shape = model_shape(hf_config)
    plan = layer_tp_plan(hf_config, False) if tp > 1 else {}
    kinds = [[ParamTensor("layer", row[0], tuple(row[1]), _tp_dim(plan.get(row[0].rsplit(".", 1)[0]), row[0]))
              for row in rows] for rows in shape["layer_kinds"]]  # fmt: skip
    # The token table and an untied lm_head are vocab-parallel (dim 0); the final norm is replicated.
    first = [ParamTensor("embedding", row[0], tuple(row[1]), row[2]) for row in shape["first"]]
    last = [ParamTensor("head", row[0], tuple(row[1]), row[2]) for row in shape["last"]]
    return kinds, list(shape["layer_pattern"]), first, last


def _chunk(n: int, parts: int, index: int) -> int:
    """Rows of chunk `index` when `n` rows are split like torch.chunk (DTensor Shard and FSDP2 both do)."""
    size = -(-n // parts)
    return max(0, min(size, n - index * size))


def local_numel(tensor: ParamTensor, tp: int, tp_rank: int, fsdp: int, fsdp_rank: int) -> int:
    """Elements of `tensor` one rank holds: TP shard (torch.chunk on tp_dim), then FSDP2 shard on dim 0."""
    shape = list(tensor.shape)
    if tensor.tp_dim is not None and tp > 1:
        shape[tensor.tp_dim] = _chunk(shape[tensor.tp_dim], tp, tp_rank)
    if fsdp > 1:
        shape[0] = _chunk(shape[0], fsdp, fsdp_rank)
    numel = 1
    for size in shape:
        numel *= size
    return numel


def rank_param_numel(hf_config: Mapping[str, Any], layout: LayoutConfig, rank: int) -> int:
    """Parameter elements `rank` holds under this layout (the exact prediction `state_bytes` is tested against)."""
    spec = model_spec_from_hf("model", hf_config)
    c = ParallelDims.of(layout).coordinates(rank)
    fsdp_rank = c["dp_shard"] * layout.cp + c["cp"]
    tp_rank = c["tp"]
    if layout.pp > 1:
        stages = [s for s in pipeline_plan(spec.num_layers, layout)["stages"] if s["pp_rank"] == c["pp"]]
    else:
        stages = [{"layers": list(range(spec.num_layers)), "embedding": True, "head": True}]
    kinds, pattern, embedding, head = _shape_tensors(hf_config, layout.tp)
    shard = fsdp_shard_size(layout)
    total = 0
    for stage in stages:
        tensors = [t for i in stage["layers"] for t in kinds[pattern[i]]]
        tensors += embedding if stage["embedding"] else []
        tensors += head if stage["head"] else []
        total += sum(local_numel(t, layout.tp, tp_rank, shard, fsdp_rank) for t in tensors)
    return total


def predicted_state_bytes(hf_config: Mapping[str, Any], layout: LayoutConfig, rank: int) -> Dict[str, int]:
    """fp32 weights (FSDP's sharded weights are the fp32 master under bf16), fp32 grads, two fp32 Adam moments."""
    numel = rank_param_numel(hf_config, layout, rank)
    return {"param_bytes": 4 * numel, "grad_bytes": 4 * numel, "optimizer_bytes": 8 * numel}
