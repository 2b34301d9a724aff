"""CPU stand-in of a GPU recipe: the overrides that shrink only what a CPU cluster forces.

The stand-in keeps the recipe's engine, launcher, parallel axes, pipeline schedule and virtual stages,
uneven stage split, ZeRO stage, offload, activation checkpointing and precision (bf16 runs on CPU), and
runs through the same Slurm job template on the local cluster of slurm/local (2 nodes of 4 CPUs and
8 GiB: slurm/local/slurm.conf.in). What CPU cannot execute is named in `not_executed`, never dropped
silently. Pure: no torch, no Hydra, no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

# The local Slurm cluster of slurm/local/up.sh: two virtual nodes, 4 CPUs each (one rank per CPU).
STANDIN_NODES, CPUS_PER_NODE = 2, 4
MAX_RANKS = STANDIN_NODES * CPUS_PER_NODE
# Tiny shapes: head_dim 8 is even (RoPE rotates pairs), vocab 256 divides by every stand-in tp. bf16
# matmuls without native CPU instructions run ~15x slower than fp32 (a 6.7M-parameter model at head_dim 16
# took 2 s per 64-token forward and backward on one core), so the widths stay at the smallest that splits.
HEAD_DIM, VOCAB, SEQ_LEN, STEPS = 8, 256, 64, 2
AXES = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")


@dataclass(frozen=True)
class Standin:
    """A recipe's stand-in: the overrides after the recipe's, what it runs and what it cannot."""

    recipe: str
    overrides: List[str]
    degrees: Dict[str, int]
    nodes: int
    ranks_per_node: int
    not_executed: List[str] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node


def standin_degree(degree: int) -> int:
    """An axis the recipe uses (> 1) keeps the smallest degree that still splits: 2; unused axes stay 1."""
    return 2 if degree > 1 else 1


def standin_degrees(layout: Any, engine: str) -> Tuple[Dict[str, int], List[str]]:
    """Every axis at its smallest splitting degree; the axes a library refuses on CPU are named."""
    degrees = {axis: standin_degree(getattr(layout, axis)) for axis in AXES}
    missing = []
    if degrees["cp"] > 1 and engine != "megatron_lm":
        # The cp ranks shard parameters with the data axis (FSDP over dp_shard x cp): they stay as
        # dp_shard ranks, so the world and the sharding are kept; ring attention itself is CUDA-only.
        degrees["cp"], degrees["dp_shard"] = 1, degrees["dp_shard"] * 2
        missing.append(f"cp={layout.cp} context-parallel ring attention (torch has no CPU sharding rule for "
                       "SDPA); its ranks run as FSDP data-parallel shards")
    if degrees["tp"] > 1 and engine == "fsdp":
        degrees["tp"] = 1
        missing.append(f"tp={layout.tp} through Accelerate's ParallelismConfig (Accelerate refuses a MULTI_CPU "
                       "state); the FSDP data axis runs")
    return degrees, missing


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


def tiny_model(hf_config: Dict[str, Any], degrees: Dict[str, int], layers: int) -> Dict[str, Any]:
    """Same family and module classes, tiny widths: the GQA ratio kept, kv heads divisible by tp,
    experts >= ep (and more than are active per token, so routing still chooses)."""
    tiny = dict(hf_config)
    heads, kv_heads = hf_config.get("num_attention_heads", 4), hf_config.get("num_key_value_heads")
    ratio = heads // kv_heads if kv_heads else 1
    kv = max(1, degrees["tp"])
    tiny.update(num_hidden_layers=layers, num_attention_heads=kv * ratio, hidden_size=kv * ratio * HEAD_DIM,
                intermediate_size=2 * kv * ratio * HEAD_DIM, vocab_size=VOCAB)
    if kv_heads:
        tiny["num_key_value_heads"] = kv
    if "head_dim" in hf_config:
        tiny["head_dim"] = HEAD_DIM
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


def precision_of(precision: str) -> Tuple[str, List[str]]:
    if precision == "fp16":
        return "fp32", ["precision=fp16 (CPU kernels have no fp16 training path); runs fp32"]
    return precision, []


def common_not_executed(cluster_accelerator: str) -> List[str]:
    """What no CPU run executes, whatever the layout."""
    return ["NCCL collectives (gloo carries the same collectives on CPU)",
            f"CUDA memory statistics (state and activation bytes are measured exactly; the "
            f"{cluster_accelerator} allocator's reserved and peak figures are not)"]


def standin_banner(of: str, not_executed: List[str]) -> str:
    """The lines a stand-in run prints (console and launch log): whose stand-in, and what it cannot run."""
    return "\n".join([f"[standin] CPU stand-in of {of}; not executed on the stand-in:",
                      *[f"[standin]   - {item}" for item in not_executed]])


def make_standin(recipe: str, cfg: Any) -> Standin:
    """The stand-in of a composed recipe `cfg` (a RunConfig)."""
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
        "layout.name": f"{layout.name}-standin",
    }
    model = tiny_model(cfg.model.hf_config, degrees, layers_needed(layout, degrees, split))
    overrides = [
        "cluster=local_slurm", "launcher=slurm_local",
        f"cluster.nodes={nodes}", f"cluster.accelerators_per_node={per_node}",
        f"model.name={cfg.model.name}_standin", "model.hub_id=null",
        *[f"model.hf_config.{key}={json.dumps(value)}" for key, value in sorted(model.items())
          if value != cfg.model.hf_config.get(key)],
        *[f"{key}={json.dumps(value)}" for key, value in layout_overrides.items()],
        "bench.warmup_steps=2", f"bench.steps={STEPS}",
        f"sweep_name={cfg.sweep_name}-standin",
    ]
    not_executed = [*missing, *precision_missing, *common_not_executed(cfg.cluster.accelerator)]
    if getattr(cfg.engine, "compiled_ops", False):
        # DeepSpeed JIT-builds its CPU Adam on first use: minutes of compiling on every fresh machine.
        overrides.append("engine.compiled_ops=false")
        not_executed.append("DeepSpeed's compiled CPU Adam (a JIT build of minutes); torch's AdamW steps the same "
                            "offloaded optimizer states")
    if engine == "megatron_lm":
        not_executed.insert(0, "Megatron-LM training (export only: its generated script runs as far as "
                               "Megatron's own argument and config validation)")
    overrides += [f"standin.of={recipe}", f"standin.not_executed={json.dumps(not_executed)}"]
    return Standin(recipe, overrides, degrees, nodes, per_node, not_executed)
