"""CPU stand-in of a GPU recipe: the overrides that shrink only what a CPU cluster forces.

The stand-in keeps the recipe's engine, launcher, parallel axes, pipeline schedule and virtual stages,
uneven stage split, ZeRO stage, offload, activation checkpointing and precision (bf16 runs on CPU), and
runs through the same Slurm job template on the local cluster of slurm/local (2 nodes of 4 CPUs and
8 GiB: slurm/local/slurm.conf.in). What CPU cannot execute is named in `not_executed`, never dropped
silently. It builds the model the way the recipe resolves `model.init` (on the meta device where the
recipe does, `auto` decided at the recipe's own size). Every field where its resolved config departs from
the recipe's is either a shrink field (SHRINK_FIELDS) or named by one of its `gaps`, and
tests/unit/config/test_standin_fidelity.py holds every GPU recipe to that. Pure: no torch, no Hydra, no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Dict, List, Mapping, Tuple

from harness.config.schema import FP8_DIM_MULTIPLE

# The local Slurm cluster of slurm/local/up.sh: two virtual nodes, 4 CPUs each (one rank per CPU).
STANDIN_NODES, CPUS_PER_NODE = 2, 4
MAX_RANKS = STANDIN_NODES * CPUS_PER_NODE
# Tiny shapes: head_dim 8 is even (RoPE rotates pairs), vocab 256 divides by every stand-in tp. bf16
# matmuls without native CPU instructions run ~15x slower than fp32 (a 6.7M-parameter model at head_dim 16
# took 2 s per 64-token forward and backward on one core), so the widths stay at the smallest that splits.
HEAD_DIM, VOCAB, SEQ_LEN, STEPS, WARMUP_STEPS = 8, 256, 64, 2, 2
AXES = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")
# The hf_config keys tiny_model shrinks (widths, depth, vocabulary, expert count).
TINY_KEYS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size",
             "head_dim", "vocab_size", "num_local_experts", "num_experts", "moe_intermediate_size")
# What a stand-in shrinks by construction, as patterns over the dotted keys of a resolved config (the
# RunConfig with model.init resolved): the size a CPU cluster forces, nothing the engine decides. Any other
# field that differs from the recipe's must be named by one of the stand-in's gaps (its not_executed list).
# - cluster.*, launcher.*: the local Slurm cluster (slurm/local) and its launcher. What the engines render
#   differently for its `cpu` accelerator (the stand-in rendered as it is and with the recipe's accelerator,
#   tests/unit/config/test_standin_fidelity.py) must be named too.
# - the parallel degrees: the smallest degree that still splits (standin_degree). A degree is a shrink
#   only while the axis keeps splitting (or stays unsplit): an axis that stops or starts splitting is a gap.
# - the batch (seq_len, micro_batch, grad_accum), the uneven stage split, the model's widths and depth
#   (TINY_KEYS), the steps, and the names and the stand-in record itself.
DEGREE_FIELDS = tuple(f"layout.{axis}" for axis in AXES)
SHRINK_FIELDS = (
    "cluster.*", "launcher.*", *DEGREE_FIELDS,
    "layout.pp_stage_layers", "layout.seq_len", "layout.micro_batch", "layout.grad_accum", "layout.name",
    "model.name", "model.hub_id", *[f"model.hf_config.{key}" for key in TINY_KEYS],
    "bench.warmup_steps", "bench.warmup_max_steps", "bench.steps", "sweep_name", "standin.*",
)


@dataclass(frozen=True)
class Gap:
    """One thing the stand-in does not execute: why (`text`, printed and recorded with the metrics) and the
    keys of the resolved config where that shows (`fields`; none where it shows only at run time)."""

    text: str
    fields: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Standin:
    """A recipe's stand-in: the overrides after the recipe's, what it runs and what it cannot."""

    recipe: str
    overrides: List[str]
    degrees: Dict[str, int]
    nodes: int
    ranks_per_node: int
    gaps: List[Gap] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def not_executed(self) -> List[str]:
        return [gap.text for gap in self.gaps]


def standin_degree(degree: int) -> int:
    """An axis the recipe uses (> 1) keeps the smallest degree that still splits: 2; unused axes stay 1."""
    return 2 if degree > 1 else 1


def standin_degrees(layout: Any, engine: str) -> Tuple[Dict[str, int], List[Gap]]:
    """Every axis at its smallest splitting degree; the axes a library refuses on CPU are named."""
    degrees = {axis: standin_degree(getattr(layout, axis)) for axis in AXES}
    missing = []
    if degrees["cp"] > 1 and engine != "megatron_lm":
        # The cp ranks shard parameters with the data axis (FSDP over dp_shard x cp): they stay as
        # dp_shard ranks, so the world and the sharding are kept; ring attention itself is CUDA-only.
        degrees["cp"], degrees["dp_shard"] = 1, degrees["dp_shard"] * 2
        missing.append(Gap(f"cp={layout.cp} context-parallel ring attention (torch has no CPU sharding rule for "
                           "SDPA); its ranks run as FSDP data-parallel shards", ("layout.cp", "layout.dp_shard")))
    if degrees["tp"] > 1 and engine == "fsdp":
        degrees["tp"] = 1
        missing.append(Gap(f"tp={layout.tp} through Accelerate's ParallelismConfig (Accelerate refuses a "
                           "MULTI_CPU state); the FSDP data axis runs", ("layout.tp",)))
    return degrees, missing


def standin_layout_name(degrees: Dict[str, int], recipe_layout: str) -> str:
    """The degrees the stand-in runs, then the layout it stands in for: `tp2_pp2_dp2-standin-of-nd_tp8_pp4`
    (one rank: `1rank-standin-of-...`). Short axis names as in run labels (harness.config.naming)."""
    short = {"dp_replicate": "rep", "dp_shard": "dp"}
    split = [f"{short.get(axis, axis)}{degrees[axis]}" for axis in ("tp", "pp", "cp", "ep", "dp_replicate",
                                                                      "dp_shard") if degrees[axis] > 1]
    return f"{'_'.join(split) or '1rank'}-standin-of-{recipe_layout}"


def world_of(degrees: Dict[str, int]) -> int:
    """Ranks the degrees occupy; expert parallelism lives inside the data axis (no extra ranks)."""
    return degrees["dp_replicate"] * degrees["dp_shard"] * degrees["tp"] * degrees["pp"] * degrees["cp"]


def placement(world: int, recipe_nodes: int) -> Tuple[int, int]:
    """(nodes, ranks per node): multi-node recipes stay multi-node (both virtual nodes) when the world splits."""
    if world > MAX_RANKS:
        raise ValueError(f"stand-in world {world} > {MAX_RANKS} ranks of the local cluster")
    nodes = STANDIN_NODES if recipe_nodes > 1 and world % STANDIN_NODES == 0 else 1
    if world // nodes > CPUS_PER_NODE:
        nodes = STANDIN_NODES
    return nodes, world // nodes


def stage_layers(recipe_split: List[int], stages: int) -> List[int]:
    """An uneven split stays uneven: stand-in stage i keeps recipe stage i's surplus over the lightest
    stage, on top of one layer (e.g. [7, 8, ..., 8, 7] over 2 stages -> [1, 2])."""
    if not recipe_split:
        return []
    lightest = min(recipe_split)
    return [1 + count - lightest for count in recipe_split[:stages]]


def standin_head_dim(precision: str) -> int:
    """HEAD_DIM, or under FP8 the GEMM multiple FP8 needs (FP8_DIM_MULTIPLE): a tiny model keeps one kv head
    per tp rank, so each rank's k / v projection is one head wide and the head must take FP8's multiple."""
    return FP8_DIM_MULTIPLE if precision == "fp8" else HEAD_DIM


def tiny_model(hf_config: Dict[str, Any], degrees: Dict[str, int], layers: int,
               head_dim: int = HEAD_DIM) -> Dict[str, Any]:
    """Same family and module classes, tiny widths: the GQA ratio kept, kv heads divisible by tp,
    experts >= ep (and more than are active per token, so routing still chooses)."""
    tiny = dict(hf_config)
    heads, kv_heads = hf_config.get("num_attention_heads", 4), hf_config.get("num_key_value_heads")
    ratio = heads // kv_heads if kv_heads else 1
    kv = max(1, degrees["tp"])
    tiny.update(num_hidden_layers=layers, num_attention_heads=kv * ratio, hidden_size=kv * ratio * head_dim,
                intermediate_size=2 * kv * ratio * head_dim, vocab_size=VOCAB)
    if kv_heads:
        tiny["num_key_value_heads"] = kv
    if "head_dim" in hf_config:
        tiny["head_dim"] = head_dim
    for key in ("num_local_experts", "num_experts"):  # Mixtral's and Qwen-MoE's names for the expert count
        if hf_config.get(key):
            tiny[key] = max(2 * degrees["ep"], hf_config.get("num_experts_per_tok", 1) + 1)
    if "moe_intermediate_size" in hf_config:
        tiny["moe_intermediate_size"] = tiny["intermediate_size"]
    return tiny


def layers_needed(layout: Any, degrees: Dict[str, int], split: List[int]) -> int:
    """At least one layer per pipeline stage (pp x virtual stages), two without a pipeline."""
    if split:
        return sum(split)
    return max(2, degrees["pp"] * layout.pp_virtual_stages)


def pipeline_micro_batches(schedule: str, pp: int) -> int:
    """The fewest micro-batches torch.distributed.pipelining accepts: one per rank (1F1B, one whole
    interleaved round), one per stage for DualPipeV (harness/plan/pipeline.py holds the rules)."""
    return 2 * pp if schedule == "DualPipeV" else pp


def precision_of(precision: str) -> Tuple[str, List[Gap]]:
    if precision == "fp16":
        return "fp32", [Gap("precision=fp16 (CPU kernels have no fp16 training path); runs fp32",
                            ("layout.precision",))]
    if precision == "fp8":
        # torchao 0.18's tensorwise recipe calls torch._scaled_mm for the three GEMMs of each converted
        # linear; on a CPU torch 2.13 runs them through oneDNN's reference matmul (ONEDNN_VERBOSE:
        # `matmul,ref:any` on f8_e4m3 operands) or its own emulation, equal to an fp32 product of the FP8
        # values (tests/integration/test_fp8.py measures both).
        return precision, [Gap("FP8 tensor-core GEMMs: torchao's float8 linears run (casts, dynamic scales, FP8 "
                               "tensors), and torch's CPU _scaled_mm multiplies the FP8 values at fp32 precision, "
                               "so FP8's GEMM speed-up is not executed")]
    return precision, []


def common_not_executed(cluster_accelerator: str) -> List[Gap]:
    """What no CPU run executes, whatever the layout: the device, as the engines render it (nd's mesh,
    DeepSpeed's accelerator), and its allocator."""
    return [Gap("NCCL collectives on CUDA devices (ranks compute on the CPU and gloo carries the same "
                "collectives)", ("nd_plan.json:mesh.device_type", "env.DS_ACCELERATOR")),
            Gap(f"CUDA memory statistics (state and activation bytes are measured exactly; the "
                f"{cluster_accelerator} allocator's reserved and peak figures are not)")]


def engine_not_executed(cfg: Any, model_init: str) -> List[Gap]:
    """What an engine does otherwise on a CPU accelerator: in the files it renders (harness/engines) and at
    run time, and the options a CPU stand-in turns off itself."""
    layout, engine = cfg.layout, cfg.engine
    gaps = []
    if engine.name == "nd" and model_init == "meta":
        # torch.distributed.tensor._random: the offset-based tracker exists for CUDA-like meshes only
        # (is_rng_supported_mesh); harness/engines/materialize.py seeds every rank alike either way.
        gaps.append(Gap("DTensor's offset-based RNG tracker in the sharded random init (CUDA meshes only: on a "
                        "CPU mesh each shard draws the same local stream, so shards repeat values; allocation "
                        "and initialisation of the local shards run)"))
    if engine.name == "deepspeed" and layout.zero_stage >= 2:
        # deepspeed/accelerator/cpu_accelerator.py: Stream() is None, stream() a no-op context.
        gaps.append(Gap("DeepSpeed overlap_comm (the gradient reduction on a side CUDA stream during backward; "
                        "the CPU accelerator has no streams: it reduces in line)",
                        ("ds_config.json:zero_optimization.overlap_comm",)))
    offloaded = [key for key, target in (("offload_optimizer", layout.offload_optimizer),
                                         ("offload_param", layout.offload_params)) if target != "none"]
    if offloaded and engine.name == "deepspeed":
        gaps.append(Gap("page-locked (pinned) host buffers of the offloaded states, DeepSpeed pin_memory "
                        "(nothing is page-locked without a CUDA device)",
                        tuple(f"ds_config.json:zero_optimization.{key}.pin_memory" for key in offloaded)))
    elif offloaded:
        gaps.append(Gap("page-locked (pinned) host buffers of the offloaded states, FSDP2 CPUOffloadPolicy "
                        "pin_memory (nothing is page-locked without a CUDA device)"))
    if getattr(engine, "compiled_ops", False):
        gaps.append(Gap("DeepSpeed's compiled CPU Adam (a JIT build of minutes); torch's AdamW steps the same "
                        "offloaded optimizer states", ("engine.compiled_ops",)))
    return gaps


def standin_banner(of: str, not_executed: List[str]) -> str:
    """The lines a stand-in run prints (console and launch log): whose stand-in, and what it cannot run."""
    return "\n".join([f"[standin] CPU stand-in of {of}; not executed on the stand-in:",
                      *[f"[standin]   - {item}" for item in not_executed]])


def make_standin(recipe: str, cfg: Any, model_init: str) -> Standin:
    """The stand-in of a composed recipe `cfg` (a RunConfig) whose model.init resolves to `model_init`
    (`full` or `meta`, decided at the recipe's size: a tiny model would resolve `auto` to `full`)."""
    layout, engine = cfg.layout, cfg.engine.name
    degrees, missing = standin_degrees(layout, engine)
    world = world_of(degrees)
    nodes, per_node = placement(world, cfg.cluster.nodes)
    split = stage_layers(list(layout.pp_stage_layers), degrees["pp"] * layout.pp_virtual_stages)
    precision, precision_missing = precision_of(layout.precision)
    pipelined = degrees["pp"] > 1
    layout_overrides = {
        **{f"layout.{axis}": value for axis, value in degrees.items()},
        "layout.pp_stage_layers": split,
        "layout.precision": precision,
        "layout.seq_len": SEQ_LEN,
        "layout.micro_batch": min(layout.micro_batch, 2),
        "layout.grad_accum": pipeline_micro_batches(layout.pp_schedule, degrees["pp"]) if pipelined
        else min(layout.grad_accum, 2),
        "layout.name": standin_layout_name(degrees, layout.name),
    }
    model = tiny_model(cfg.model.hf_config, degrees, layers_needed(layout, degrees, split), standin_head_dim(precision))
    overrides = [
        "cluster=local_slurm", "launcher=slurm_local",
        f"cluster.nodes={nodes}", f"cluster.accelerators_per_node={per_node}",
        f"model.name={cfg.model.name}_standin", "model.hub_id=null", f"model.init={model_init}",
        *[f"model.hf_config.{key}={json.dumps(value)}" for key, value in sorted(model.items())
          if value != cfg.model.hf_config.get(key)],
        *[f"{key}={json.dumps(value)}" for key, value in layout_overrides.items()],
        # two warm-up steps, not more until step time is steady: a stand-in proves the layout runs and trains like
        # one process; its CPU timings stand for nothing on the GPU
        f"bench.warmup_steps={WARMUP_STEPS}", f"bench.warmup_max_steps={WARMUP_STEPS}", f"bench.steps={STEPS}",
        f"sweep_name={cfg.sweep_name}-standin",
    ]
    if getattr(cfg.engine, "compiled_ops", False):
        # DeepSpeed JIT-builds its CPU Adam on first use: minutes of compiling on every fresh machine.
        overrides.append("engine.compiled_ops=false")
    gaps = [*missing, *precision_missing, *engine_not_executed(cfg, model_init),
            *common_not_executed(cfg.cluster.accelerator)]
    if engine == "megatron_lm":
        gaps.insert(0, Gap("Megatron-LM training (export only: its generated script runs as far as "
                           "Megatron's own argument and config validation)"))
    overrides += [f"standin.of={recipe}", f"standin.not_executed={json.dumps([gap.text for gap in gaps])}"]
    return Standin(recipe, overrides, degrees, nodes, per_node, gaps)


def is_shrink(key: str, recipe_value: Any, standin_value: Any) -> bool:
    """A difference SHRINK_FIELDS allows: a degree while the axis keeps (not) splitting, any other field
    matching one of the patterns."""
    if key in DEGREE_FIELDS:
        return isinstance(recipe_value, int) and isinstance(standin_value, int) and \
            (recipe_value > 1) == (standin_value > 1)
    return any(fnmatchcase(key, pattern) for pattern in SHRINK_FIELDS)


def unlisted_differences(recipe: Mapping[str, Any], standin: Mapping[str, Any], gaps: List[Gap]) -> List[str]:
    """The keys of two flat resolved configs that differ and that neither SHRINK_FIELDS nor a gap names,
    as `key: recipe value -> stand-in value` lines."""
    named = {name for gap in gaps for name in gap.fields}
    missing = object()
    return [f"{key}: {recipe.get(key)!r} -> {standin.get(key)!r}" for key in sorted({*recipe, *standin})
            if recipe.get(key, missing) != standin.get(key, missing) and key not in named
            and not is_shrink(key, recipe.get(key), standin.get(key))]


def unfounded_gaps(recipe: Mapping[str, Any], standin: Mapping[str, Any], gaps: List[Gap]) -> List[str]:
    """The fields gaps name where the two resolved configs agree: not_executed must not list what runs.
    A gap's field absent from both (another engine's file) is not a claim about this recipe."""
    missing = object()
    return [name for gap in gaps for name in gap.fields if (name in recipe or name in standin)
            and recipe.get(name, missing) == standin.get(name, missing)]
