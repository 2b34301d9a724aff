"""What each engine supports: one table the validator reads and the engines issue keeps current."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

from harness.plan.pipeline import SCHEDULES as ALL_SCHEDULES


@dataclass(frozen=True)
class EngineSupport:
    """Degrees, stages and offload targets one engine accepts; the reason strings end up in errors."""

    zero_stages: Tuple[int, ...]
    zero_reason: str
    tp: bool
    cp: bool
    ep: bool
    pp_schedules: Tuple[str, ...]  # empty: no pipeline parallelism
    pp_zero_stages: Tuple[int, ...]  # stages allowed together with pp > 1
    hybrid_zero_stages: Tuple[int, ...]  # stages allowed with dp_replicate > 1
    # zero stages at which each offload target works, per state
    offload_optimizer: Dict[str, Tuple[int, ...]]
    offload_params: Dict[str, Tuple[int, ...]]
    offload_together: bool  # parameters and optimizer offload only as one switch (FSDP's CPUOffload)
    # Tensor parallelism splits the vocabulary of (embedding, lm_head).
    tp_shards_vocab: Tuple[bool, bool]
    activation_profile: str  # see harness.plan.activations.PROFILES
    # Axes ("tp", "cp") the engine runs on GPU clusters only, and why (ends up in the error on CPU).
    gpu_only_axes: Tuple[str, ...] = ()
    gpu_only_reason: str = ""
    # ZeRO stages at which the engine builds the model without any rank holding all of it
    # (model.init=meta): on the meta device then materialised per rank, or partitioned as built.
    meta_init_stages: Tuple[int, ...] = ()
    # False: the harness never builds the model (an export whose framework builds its own, sharded as it goes)
    builds_model: bool = True
    # The attention the engine runs whatever the model config's attn_implementation says ("": transformers'
    # own, as attn_implementation picks), in attn_implementation's terms for the plan's time and memory.
    attention: str = ""
    # Engine options (field, value) tensor and context parallelism need, and why (ends up in the error).
    tp_cp_options: Tuple[Tuple[str, Any], ...] = ()
    tp_cp_reason: str = ""
    # ZeRO stages allowed together with tp > 1 (empty: any of zero_stages), and why.
    tp_zero_stages: Tuple[int, ...] = ()
    tp_zero_reason: str = ""
    # Why engine.compile=true is refused ("" where the engine compiles), and the FSDP versions it compiles under.
    compile_reason: str = ""
    compile_fsdp_versions: Tuple[int, ...] = (1, 2)
    # Whether context and pipeline parallelism compose (cp > 1 together with pp > 1).
    cp_with_pp: bool = True


# Why an engine cannot shard over part of the data ranks (dp_replicate > 1) at a sharded stage.
HYBRID_REASONS = {
    "deepspeed": "DeepSpeed 0.19 shards ZeRO over every data-parallel rank: MiCS, its hybrid sharding, is removed "
                 "(runtime/config.py, _REMOVED_ZERO_CONFIG_KEYS: mics_shard_size) and ZeRO++'s hpZ "
                 "(zero_hpz_partition_size) adds a secondary parameter copy without replicating the states; set "
                 "layout.dp_shard to every data rank, or use engine=fsdp or nd for hybrid sharding",
}

ENGINE_SUPPORT: Dict[str, EngineSupport] = {
    # DeepSpeed 0.19: ZeRO 0-3; PipelineEngine asserts stage < 2 and runs its own 1F1B; no context
    # parallelism or MoE in this harness; no hybrid sharding (HYBRID_REASONS); ZeRO-Offload moves the
    # optimizer to cpu at stage >= 1, ZeRO-Infinity moves parameters (stage 3) and NVMe (stage 3).
    # AutoTP (training mode, module_inject/auto_tp.py) makes the lm_head a column-parallel layer with
    # gathered output and keeps the embedding whole (measured with 0.19.8: embed_tokens (256, 64) and
    # lm_head (128, 64) on each of 2 TP ranks of the tiny Llama). ZeRO-3 builds the model partitioned
    # (transformers' zero.Init path).
    "deepspeed": EngineSupport(
        zero_stages=(0, 1, 2, 3), zero_reason="", tp=True, cp=False, ep=False,
        pp_schedules=("1F1B",), pp_zero_stages=(0, 1), hybrid_zero_stages=(0,),
        offload_optimizer={"cpu": (1, 2, 3), "nvme": (3,)}, offload_params={"cpu": (3,), "nvme": (3,)},
        offload_together=False, tp_shards_vocab=(False, True), activation_profile="hf",
        meta_init_stages=(3,), tp_zero_stages=(0, 1, 2),
        # DeepSpeed's AutoTP training tutorial: TP "with ZeRO Stage 0, 1, or 2"; at stage 3 (0.19.8, tiny
        # Llama, tp=2) the ranks of one job disagree on the data-parallel world and assert train_batch_size.
        tp_zero_reason="DeepSpeed's AutoTP trains with ZeRO stages 0-2 only"),
    # FSDP through Accelerate: 3 FULL_SHARD, 2 SHARD_GRAD_OP, 0 NO_SHARD (no optimizer-only level);
    # no pipeline; CPUOffload moves parameters, gradients and optimizer together, at FULL_SHARD.
    # Tensor and context parallelism through Accelerate's ParallelismConfig on GPU clusters only (it refuses
    # a MULTI_CPU state; context parallelism does not run on CPU). TP is transformers' own plan (5.23,
    # Llama: embed_tokens embedding_rowwise, lm_head colwise_gather_output: both split the vocabulary).
    "fsdp": EngineSupport(
        zero_stages=(0, 2, 3), zero_reason="FSDP has no optimizer-only sharding level",
        tp=True, cp=True, ep=False, pp_schedules=(), pp_zero_stages=(), hybrid_zero_stages=(0, 2, 3),
        offload_optimizer={"cpu": (3,)}, offload_params={"cpu": (3,)}, offload_together=True,
        tp_shards_vocab=(True, True), activation_profile="hf", gpu_only_axes=("tp", "cp"),
        gpu_only_reason="Accelerate's ParallelismConfig refuses a MULTI_CPU state; engine=nd runs tp on CPU",
        tp_cp_options=(("fsdp_version", 2),), tp_cp_reason="needs FSDP2",
        # Blocks are compiled before fully_shard wraps them; FSDP1 flattens parameters into FlatParameters that
        # a block compiled beforehand no longer reads (torch.compile with FSDP1 needs use_orig_params=True).
        compile_fsdp_versions=(2,)),
    # Torch-native: DTensor TP (+ sequence parallel, vocab-parallel embedding and lm_head as torchtitan
    # does), torch.distributed.pipelining schedules, FSDP2 on the data axis (3 reshard after forward,
    # 2 keep, 0 replicate).
    "nd": EngineSupport(
        zero_stages=(0, 2, 3), zero_reason="FSDP2 has no optimizer-only sharding level",
        tp=True, cp=True, ep=False, pp_schedules=ALL_SCHEDULES, pp_zero_stages=(0, 2, 3),
        hybrid_zero_stages=(0, 2, 3), offload_optimizer={"cpu": (3,)}, offload_params={"cpu": (3,)},
        offload_together=True, tp_shards_vocab=(True, True), activation_profile="hf", meta_init_stages=(0, 2, 3),
        # its step runs ring attention around one whole model's forward and backward (nd_session,
        # context_parallel_loss), not inside a pipeline schedule's stages
        cp_with_pp=False),
    # Megatron-LM command line (export only): zero_stage 1 is --use-distributed-optimizer; 1F1B and
    # interleaved 1F1B (--num-layers-per-virtual-pipeline-stage); experts via --expert-model-parallel-size.
    "megatron_lm": EngineSupport(
        zero_stages=(0, 1), zero_reason="the export maps zero_stage 1 to --use-distributed-optimizer only",
        tp=True, cp=True, ep=True, pp_schedules=("1F1B", "Interleaved1F1B"), pp_zero_stages=(0, 1),
        hybrid_zero_stages=(1,), offload_optimizer={}, offload_params={}, offload_together=False,
        tp_shards_vocab=(True, True), activation_profile="megatron", builds_model=False,
        # Megatron-LM's own attention layer: the export passes no --attention-backend, and its default (auto) lets
        # Transformer Engine pick a fused kernel (flash or cuDNN), timed at the SDPA rate as the dgxc rows are
        attention="sdpa",
        # Megatron-LM's arguments.py has no torch.compile switch: its fusions are hand-written kernels
        # (--bias-gelu-fusion, --bias-dropout-fusion, --masked-softmax-fusion, on by default).
        compile_reason="Megatron-LM's command line has no torch.compile option (its fused kernels are on by "
                       "default); use engine.compile=false"),
}


def unmet_parallel_options(engine: Any) -> Tuple[Tuple[str, Any], ...]:
    """The (option, value) pairs of an engine config that keep it from composing tp / cp (tp_cp_options)."""
    support = ENGINE_SUPPORT.get(engine.name)
    needs = support.tp_cp_options if support is not None else ()
    return tuple((option, getattr(engine, option)) for option, value in needs if getattr(engine, option) != value)


# torch 2.13's runtimes of the schedules that split a backward into its input- and weight-gradient halves refuse
# stage modules holding a torch.compile'd module (torch/distributed/pipelining/schedules.py,
# _check_torch_compile_compatibility, called by ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble and
# ScheduleDualPipeV): a compiled region's backward runs as one autograd node, which they cannot split.
COMPILE_REFUSING_SCHEDULES = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
# nd compiles each block after tensor parallelism and activation checkpointing; with tp > 1 and full
# recomputation the compiled block's checkpoint saves the tp DeviceMesh for backward, and torch 2.13's
# AOTAutograd raises "expected all tensors_saved_with_vc_check to be Tensors" on its first step (measured on the
# CPU stand-in of Llama-70B at tp2 x dp2, bf16 and fp8 alike; the same run without checkpointing trains).
# Selective checkpointing was not measured and stays admitted.
COMPILE_REFUSING_CHECKPOINTING = {"nd": ("full",)}


def compile_problem(engine: str, compile: bool, fsdp_version: int, pp: int = 1, pp_schedule: str = "1F1B",
                    tp: int = 1, checkpointing: str = "none") -> str:
    """Why engine.compile=true cannot run on this engine, pipeline schedule and tensor-parallel checkpointing
    ("" when it can, or when compile is off)."""
    support = ENGINE_SUPPORT.get(engine)
    if not compile or support is None:
        return ""
    if support.compile_reason:
        return f"engine.compile=true with engine={engine}: {support.compile_reason}"
    if fsdp_version not in support.compile_fsdp_versions:
        return (f"engine.compile=true with engine.fsdp_version={fsdp_version}: blocks are compiled before sharding, "
                "which FSDP1's flat parameters replace; use engine.fsdp_version=2")
    if pp > 1 and pp_schedule in COMPILE_REFUSING_SCHEDULES:
        return (f"engine.compile=true with layout.pp_schedule={pp_schedule}: torch's zero-bubble schedules split "
                "each backward into input and weight gradients and refuse compiled stage modules; use 1F1B or "
                "Interleaved1F1B, or engine.compile=false")
    if tp > 1 and checkpointing in COMPILE_REFUSING_CHECKPOINTING.get(engine, ()):
        return (f"engine.compile=true with tp={tp} and layout.activation_checkpointing={checkpointing} on "
                f"engine={engine}: the compiled block's recomputation saves the tensor-parallel DeviceMesh for "
                "backward, which torch's AOTAutograd refuses; use activation_checkpointing=none or selective, "
                "tp=1, or engine.compile=false")
    return ""
