"""DeepSpeed, launch side: ds_config.json for ZeRO 0-3, CPU/NVMe offload, AutoTP and PipelineModule stages from the
layout (`render`) and the layouts it refuses (`check`); the engine on each rank is harness.engines.deepspeed_session."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Tuple

from harness.config.schema import RunConfig
from harness.engines.optimizer import adamw_settings
from harness.engines.rendered import RenderedRun, render_launch
from harness.plan.conventions import DEEPSPEED_BUCKET_NUMEL, deepspeed_overlap_comm
from harness.plan.model_spec import param_tensors
from harness.plan.parallel_dims import ParallelDims
from harness.plan.pipeline import stage_layer_counts, stage_layer_indices
from harness.plan.planner import spec_for
from harness.rundir import DS_CONFIG_FILE, write_text

CONFIG_FILE = DS_CONFIG_FILE
# Top-level keys this renderer writes; DeepSpeed silently ignores unknown ones, so we check ourselves.
KNOWN_TOP_LEVEL_KEYS = frozenset(
    {
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "gradient_clipping", "bf16", "fp16", "zero_optimization", "optimizer", "tensor_parallel",
        "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
        "aio", "compile",
    }
)  # fmt: skip
# DeepSpeed's async I/O settings for NVMe offload (its defaults, deepspeed/runtime/swap_tensor/constants.py,
# written out so that the run directory says what was used). DeepSpeed 0.19.8 swaps a tensor only when it
# holds at least max(1 MiB, block_size) bytes; smaller ones stay in host memory.
AIO_CONFIG = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
              "overlap_events": True, "use_gds": False}
# Swap buffers per rank: for parameters read back from NVMe (DeepSpeed's default count) and for one optimizer
# sub-group's tensors (fp32 partition, gradient, two Adam moments).
NVME_PARAM_BUFFERS = 5
NVME_OPTIMIZER_BUFFERS = 4
# engine.compile: DeepSpeed's `compile` section (deepspeed/compile/config.py, CompileConfig) with DeepCompile off,
# so engine.compile() runs plain torch.compile (inductor) over the whole module, ZeRO's hooks staying eager.
# DeepCompile's own ZeRO passes are a different engine, which this harness does not plan.
COMPILE_SECTION = {"deepcompile": False}


def ranks_in_batch_check(cfg: RunConfig) -> int:
    """Ranks DeepSpeed's batch check counts: train_batch_size = micro_batch x grad_accum x this.

    Under pipeline parallelism deepspeed.initialize takes the PipelineModule's grid as its mpu and counts
    data-parallel ranks only (the stages of one pipeline share a batch). Without an mpu it counts every
    rank, AutoTP ranks included, although the ranks of one TP group share their batch.
    """
    if cfg.layout.pp > 1:
        return ParallelDims.of(cfg.layout).dp
    return ParallelDims.of(cfg.layout).dp * cfg.layout.tp


def zero_section(cfg: RunConfig) -> Dict[str, Any]:
    """The `zero_optimization` section: stage, offload targets and the NVMe swap settings."""
    layout = cfg.layout
    zero: Dict[str, Any] = {"stage": layout.zero_stage}
    if layout.zero_stage >= 1:
        # the bucket the plan counts (harness.plan.memory.deepspeed_bucket_bytes), written out
        zero["reduce_bucket_size"] = DEEPSPEED_BUCKET_NUMEL
    if layout.zero_stage >= 2:
        zero.update(contiguous_gradients=True,
                    overlap_comm=deepspeed_overlap_comm(layout.zero_stage, cfg.cluster.accelerator))
    on_gpu = cfg.cluster.accelerator != "cpu"
    for key, target in (("offload_optimizer", layout.offload_optimizer), ("offload_param", layout.offload_params)):
        if target != "none":
            zero[key] = {"device": target, "pin_memory": on_gpu}
            if target == "nvme":
                zero[key]["nvme_path"] = layout.nvme_path
    if layout.offload_params == "nvme":
        # max_in_cpu 0: with DeepSpeed's default (1e9 elements) every partition that fits is read back into
        # host memory when the optimizer is built, and NVMe holds nothing between steps. A swap buffer holds
        # one parameter partition: sized to the largest, not DeepSpeed's 1e8 elements (x 5, page-locked).
        zero["offload_param"].update(max_in_cpu=0, buffer_count=NVME_PARAM_BUFFERS,
                                     buffer_size=largest_param_partition(cfg))
        # No prefetch: DeepSpeed 0.19.8's NVMe prefetch re-reads a partition the optimizer step has just
        # written back while it still holds a swap buffer ("param N already assigned swap buffer id M" in the
        # second step's forward).
        zero["stage3_prefetch_bucket_size"] = 0
    if layout.offload_optimizer == "nvme":
        # Plain swap-in, step, swap-out per sub-group (no tile pipelining).
        zero["offload_optimizer"].update(buffer_count=NVME_OPTIMIZER_BUFFERS, pipeline_read=False,
                                         pipeline_write=False)
        # One optimizer sub-group per parameter. DeepSpeed 0.19.8 reads a swapped gradient (O_DIRECT) straight
        # into the sub-group's flat gradient at the parameter's offset; at an offset that is not I/O-aligned the
        # read silently leaves stale data (wrong updates, no error). In its own sub-group a parameter starts at
        # offset 0, and each parameter's optimizer states go to NVMe iff its fp32 partition reaches 1 MiB.
        zero["sub_group_size"] = 1
    return zero


def ds_config(cfg: RunConfig) -> Dict[str, Any]:
    """A concrete DeepSpeed config (no "auto" values: DeepSpeed's own validator cannot evaluate them)."""
    layout, bench, engine = cfg.layout, cfg.bench, cfg.engine
    zero = zero_section(cfg)
    optimizer_params = adamw_settings(bench)
    if not engine.compiled_ops:
        optimizer_params["torch_adam"] = True  # plain torch AdamW: no JIT-compiled FusedAdam / CPUAdam
    config: Dict[str, Any] = {
        # Under pipeline parallelism the accumulation steps are the pipeline's micro-batches.
        "train_batch_size": layout.micro_batch * layout.grad_accum * ranks_in_batch_check(cfg),
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": layout.grad_accum,
        "gradient_clipping": bench.grad_clip,
        "bf16": {"enabled": layout.precision == "bf16"},
        "fp16": {"enabled": layout.precision == "fp16", "loss_scale": 0, "initial_scale_power": 16},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": optimizer_params},
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }
    if layout.offload_optimizer != "none" and not engine.compiled_ops:
        # Offloaded states stepped by torch's AdamW on the host instead of the JIT-built DeepSpeedCPUAdam.
        config["zero_force_ds_cpu_optimizer"] = False
    if layout.tp > 1:
        config["tensor_parallel"] = {"autotp_size": layout.tp}
    if "nvme" in (layout.offload_optimizer, layout.offload_params):
        config["aio"] = dict(AIO_CONFIG)
    if engine.compile:
        config["compile"] = dict(COMPILE_SECTION)
    unknown = set(config) - KNOWN_TOP_LEVEL_KEYS
    assert not unknown, f"renderer wrote unknown DeepSpeed keys {sorted(unknown)}"
    return config


def largest_param_partition(cfg: RunConfig) -> int:
    """Elements of the largest parameter partition a rank holds at ZeRO-3: ceil(numel / dp) of the largest
    tensor (an upper bound under AutoTP, which splits some tensors first)."""
    spec = spec_for(cfg.model)
    _, first, last = param_tensors(spec)
    layers = (tensor for kind in spec.layer_kinds for tensor in kind)
    largest = max(math.prod(tensor.shape) for tensor in (*layers, *first, *last))
    return -(-largest // ParallelDims.of(cfg.layout).dp)


def model_problems(cfg: RunConfig) -> List[str]:
    """None: engine=deepspeed wraps whatever transformers builds."""
    return []


def check(cfg: RunConfig) -> Tuple[List[str], List[str]]:
    """(errors, warnings) for engine=deepspeed beyond the planner's support table (which already limits
    pp > 1 to ZeRO 0-1 and DeepSpeed's own 1F1B schedule)."""
    errors = pipeline_problems(cfg) if cfg.layout.pp > 1 else []
    if cfg.layout.activation_checkpointing == "selective":
        # deepspeed_session.apply checkpoints whole decoder layers (transformers' gradient checkpointing) or
        # nothing: a selective plan would predict a recompute and a saving the run never has.
        errors.append("layout.activation_checkpointing='selective': engine=deepspeed checkpoints whole decoder "
                      "layers (none or full)")
    return errors, []


def pipeline_problems(cfg: RunConfig) -> List[str]:
    """What runs wrong or unpredicted with pp > 1. Each stage holds the model's own modules, recomputes rotary
    positions and passes no attention mask: tied tables, learned positions, AutoTP inside a stage and a
    kernel that is causal only with a mask are out; so is bf16 at ZeRO-0, whose optimizer wrapper differs."""
    layout, problems = cfg.layout, []
    spec = spec_for(cfg.model)
    if layout.tp > 1:
        problems.append(f"layout.tp={layout.tp} with pp={layout.pp}: engine=deepspeed builds its PipelineModule "
                        "without AutoTP (use tp=1, or engine=nd for tp x pp)")
    if spec.tied_embeddings:
        problems.append(f"tie_word_embeddings=true with pp={layout.pp}: engine=deepspeed places the embedding and "
                        "the LM head on different stages as separate modules (untie them or use pp=1)")
    if spec.learned_positions:
        problems.append(f"model_type={spec.model_type} with pp={layout.pp}: engine=deepspeed's stages recompute "
                        "rotary positions; a learned position table is not split across stages")
    if layout.precision == "bf16" and layout.zero_stage == 0:
        # BF16_Optimizer (0.19.8, runtime/bf16_optimizer.py) partitions the fp32 master over the data-parallel
        # group, and keeps a flat bf16 gradient-accumulation copy beside each .grad (measured on 2 CPU ranks).
        problems.append(f"precision=bf16 zero_stage=0 with pp={layout.pp}: DeepSpeed's PipelineEngine steps bf16 "
                        "through its BF16_Optimizer, which shards optimizer states like ZeRO-1 and keeps a second "
                        "gradient buffer (use zero_stage=1)")
    if spec.attn_implementation == "eager":
        problems.append(f"attn_implementation=eager with pp={layout.pp}: engine=deepspeed's stages pass no "
                        "attention mask, and eager attention without one is not causal (use sdpa)")
    if cfg.engine.compile:
        # PipelineEngine runs its stages' layers one by one from its own schedule; engine.compile() would wrap
        # only the PipelineModule's forward, which the schedule does not call.
        problems.append(f"engine.compile=true with pp={layout.pp}: engine=deepspeed compiles the whole module, "
                        "which its PipelineEngine never calls as one (use pp=1, or engine=nd for compiled stages)")
    return problems


def render(cfg: RunConfig, run_dir: Path) -> RenderedRun:
    run_dir = Path(run_dir)
    write_text(run_dir / CONFIG_FILE, json.dumps(ds_config(cfg), indent=2) + "\n")
    env = {"DS_ACCELERATOR": "cpu"} if cfg.cluster.accelerator == "cpu" else {}
    return render_launch(cfg, run_dir, cfg.engine.launcher, [CONFIG_FILE], env=env)


def stage_layers(cfg: RunConfig, num_layers: int) -> List[List[int]]:
    """Decoder-layer indices of each stage: the planner's split (harness.plan.pipeline), so the bytes it
    predicts for a stage are the bytes that stage holds."""
    return stage_layer_indices(stage_layer_counts(num_layers, cfg.layout.pp, 1, cfg.layout.pp_stage_layers))
