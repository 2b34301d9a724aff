"""DeepSpeed: ZeRO 0-3, CPU/NVMe offload, AutoTP and PipelineModule stages from the layout (`render`), and the
engine (`apply`)."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Tuple

from harness.config.schema import RunConfig
from harness.engines.rendered import RenderedRun, render_launch
from harness.plan.model_spec import model_spec_from_hf, param_tensors
from harness.plan.parallel_dims import ParallelDims
from harness.plan.pipeline import stage_layer_counts, stage_layer_indices
from harness.rundir import DS_CONFIG_FILE, write_text

CONFIG_FILE = DS_CONFIG_FILE
# Top-level keys this renderer writes; DeepSpeed silently ignores unknown ones, so we check ourselves.
KNOWN_TOP_LEVEL_KEYS = frozenset(
    {
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "gradient_clipping", "bf16", "fp16", "zero_optimization", "optimizer", "tensor_parallel",
        "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
        "aio",
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
    if layout.zero_stage >= 2:
        zero.update(contiguous_gradients=True, overlap_comm=cfg.cluster.accelerator != "cpu")
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
    optimizer_params = {
        "lr": bench.lr,
        "betas": [0.9, 0.95],
        "eps": 1e-8,
        "weight_decay": bench.weight_decay,
    }
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
    unknown = set(config) - KNOWN_TOP_LEVEL_KEYS
    assert not unknown, f"renderer wrote unknown DeepSpeed keys {sorted(unknown)}"
    return config


def largest_param_partition(cfg: RunConfig) -> int:
    """Elements of the largest parameter partition a rank holds at ZeRO-3: ceil(numel / dp) of the largest
    tensor (an upper bound under AutoTP, which splits some tensors first)."""
    layer, first, last = param_tensors(model_spec_from_hf(cfg.model.name, cfg.model.hf_config))
    largest = max(math.prod(tensor.shape) for tensor in (*layer, *first, *last))
    return -(-largest // ParallelDims.of(cfg.layout).dp)


def check(cfg: RunConfig) -> Tuple[List[str], List[str]]:
    """(errors, warnings) for engine=deepspeed beyond the planner's support table (which already limits
    pp > 1 to ZeRO 0-1 and DeepSpeed's own 1F1B schedule)."""
    return (pipeline_problems(cfg) if cfg.layout.pp > 1 else []), []


def pipeline_problems(cfg: RunConfig) -> List[str]:
    """What runs wrong or unpredicted with pp > 1. Each stage holds the model's own modules, recomputes rotary
    positions and passes no attention mask: tied tables, learned positions, AutoTP inside a stage and a
    kernel that is causal only with a mask are out; so is bf16 at ZeRO-0, whose optimizer wrapper differs."""
    layout, problems = cfg.layout, []
    spec = model_spec_from_hf(cfg.model.name, cfg.model.hf_config)
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
    return problems


def render(cfg: RunConfig, run_dir: Path) -> RenderedRun:
    run_dir = Path(run_dir)
    write_text(run_dir / CONFIG_FILE, json.dumps(ds_config(cfg), indent=2) + "\n")
    env = {"DS_ACCELERATOR": "cpu"} if cfg.cluster.accelerator == "cpu" else {}
    return render_launch(cfg, run_dir, cfg.engine.launcher, [CONFIG_FILE], env=env)


class DeepSpeedSession:
    """One DeepSpeed engine on one rank: a training step and the bytes of state it holds."""

    def __init__(self, engine, cfg: RunConfig):
        import deepspeed.comm as dist

        self.engine, self.cfg = engine, cfg
        self.model = engine.module
        tp = cfg.layout.tp
        # AutoTP: ranks of one tensor-parallel group are consecutive and must read the same batch.
        self.dp_rank, self.dp_size = dist.get_rank() // tp, dist.get_world_size() // tp

    def train_step(self, micro_batches, on_boundary=None):
        """One optimizer step; `on_boundary` runs after the last backward, before the optimizer step."""
        import torch

        batches = list(micro_batches)
        losses = []
        for index, tokens in enumerate(batches):
            tokens = tokens.to(self.engine.device)
            loss = self.engine(input_ids=tokens, labels=tokens).loss
            self.engine.backward(loss)
            if on_boundary is not None and index == len(batches) - 1:
                on_boundary()
            self.engine.step()
            losses.append(loss.detach().float())
        return torch.stack(losses).mean()

    def state_bytes(self) -> Dict[str, int]:
        return deepspeed_state_bytes(self.engine)


def deepspeed_state_bytes(engine) -> Dict[str, int]:
    """Bytes this rank holds once gradients are reduced and before the optimizer steps (device / host).

    Parameters: the compute-dtype weights (ZeRO-3: the local partition). Gradients: what the optimizer
    will consume (ZeRO-0: every param.grad; ZeRO-1/2: the reduced partition; ZeRO-3: the flat partition
    buffer). Optimizer: Adam moments plus the fp32 master partition DeepSpeed keeps beside the weights.
    """
    from harness.runtime.meter import optimizer_state_bytes, sum_tensor_bytes

    params = list(engine.module.parameters())
    stage = engine.zero_optimization_stage()
    optimizer = engine.optimizer
    base = getattr(optimizer, "optimizer", optimizer)
    if stage == 3:
        # A partition offloaded to NVMe is counted in nvme_bytes; swapped out, its ds_tensor points at a
        # 1-element placeholder that is no state.
        param_bytes = sum_tensor_bytes(
            p.ds_tensor for p in params if getattr(p.ds_tensor, "final_location", None) != "nvme"
        )
        grad_bytes = sum_tensor_bytes([optimizer.grad_partitions_flat_buffer])
        master_bytes = sum_tensor_bytes(optimizer.fp32_partitioned_groups_flat)
    else:
        param_bytes = sum_tensor_bytes(params)
        if stage == 0:
            grad_bytes = sum_tensor_bytes(p.grad for p in params)
        elif getattr(optimizer, "cpu_offload", False):
            # Offloaded: reduced gradients land straight in the fp32 host partition's .grad.
            grad_bytes = sum_tensor_bytes(p.grad for p in optimizer.single_partition_of_fp32_groups)
        else:
            grad_bytes = sum_tensor_bytes(g for group in optimizer.averaged_gradients.values() for g in group)
        own = {p.data_ptr() for p in params}
        master_bytes = sum_tensor_bytes(
            p for group in base.param_groups for p in group["params"] if p.data_ptr() not in own
        )
    state = {
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "optimizer_bytes": optimizer_state_bytes(base) + master_bytes,
        "host_bytes": 0,
        "nvme_bytes": nvme_swap_bytes(engine, params),
    }
    # Offloaded states live in host memory: counted there, not on the device, wherever torch says the
    # tensor is (on a CPU-only machine both are the same memory).
    offloaded = []
    if getattr(optimizer, "cpu_offload", False) or getattr(optimizer, "offload_optimizer", False):
        offloaded += ["grad_bytes", "optimizer_bytes"]
    if getattr(optimizer, "offload_param", False):
        offloaded.append("param_bytes")
    for key in offloaded:
        state["host_bytes"] += state[key]
        state[key] = 0
    return state


class PipelineSession:
    """One rank of DeepSpeed's PipelineEngine: its stage, its 1F1B schedule, the bytes of state it holds.

    Stage-major ranks (DeepSpeed's PipeDataParallelTopology): the ranks of one stage are data parallel, and
    the stages of one pipeline read the same batch.
    """

    def __init__(self, engine, cfg: RunConfig):
        from deepspeed.runtime.pipe.schedule import OptimizerStep

        self.engine, self.cfg = engine, cfg
        self.model = engine.module  # this rank's stage: the weights the activation meter leaves out
        self.dp_rank, self.dp_size = engine.grid.data_parallel_id, engine.grid.data_parallel_size
        self._on_boundary = None
        # train_batch runs the whole schedule, optimizer step included; the boundary hook goes in front of
        # that step, after the last backward and the gradient reductions (an instance-level instruction map).
        step = type(engine)._INSTRUCTION_MAP[OptimizerStep]
        engine._INSTRUCTION_MAP = {**type(engine)._INSTRUCTION_MAP, OptimizerStep: self._step_after_boundary(step)}

    def _step_after_boundary(self, step):
        def run(engine, **kwargs):
            if self._on_boundary is not None:
                self._on_boundary()
            return step(engine, **kwargs)

        return run

    def train_step(self, micro_batches, on_boundary=None):
        """One optimizer step over the step's micro-batches (the pipeline's); the loss is this data-parallel
        rank's mean, computed on the last stage and broadcast along the pipeline by DeepSpeed."""
        batches = [(tokens, tokens) for tokens in micro_batches]  # (first stage's input, last stage's labels)
        if len(batches) != self.engine.micro_batches:
            raise ValueError(f"{len(batches)} micro-batches for a pipeline of {self.engine.micro_batches}")
        self._on_boundary = on_boundary
        try:
            self.engine.train_batch(data_iter=iter(batches))
        finally:
            self._on_boundary = None
        # train_batch returns the mean over data-parallel ranks; dp_group_loss is this rank's own.
        return self.engine.dp_group_loss.detach().float().cpu()

    def state_bytes(self) -> Dict[str, int]:
        return deepspeed_state_bytes(self.engine)


@functools.lru_cache(maxsize=None)
def pipe_stage_class():
    """The stage module type (built lazily: importing this engine for `render` needs no torch)."""
    import torch

    class PipeStage(torch.nn.Module):
        """One pipeline stage of a Hugging Face decoder-only LM, made of the model's own modules: the
        embedding (first stage), decoder layers, the final norm and LM head (last stage).

        As the model's own forward does, the stage computes rotary embeddings once for its layers, from
        positions 0..seq-1, and passes no attention mask (SDPA is causal by itself): stages exchange
        nothing but hidden states.
        """

        def __init__(self, model, layers: List[int], first: bool, last: bool):
            super().__init__()
            inner = model.model
            self.embed_tokens = inner.embed_tokens if first else None
            self.layers = torch.nn.ModuleList(inner.layers[i] for i in layers)
            self.norm = inner.norm if last else None
            self.lm_head = model.lm_head if last else None
            self.rotary_emb = inner.rotary_emb

        def forward(self, x):
            if self.embed_tokens is not None:
                x = self.embed_tokens(x)
            positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
            rotary = self.rotary_emb(x, positions)
            for layer in self.layers:
                x = layer(x, position_embeddings=rotary, attention_mask=None, position_ids=positions)
            if self.lm_head is not None:
                x = self.lm_head(self.norm(x))
            return x

    return PipeStage


def stage_layers(cfg: RunConfig, num_layers: int) -> List[List[int]]:
    """Decoder-layer indices of each stage: the planner's split (harness.plan.pipeline), so the bytes it
    predicts for a stage are the bytes that stage holds."""
    return stage_layer_indices(stage_layer_counts(num_layers, cfg.layout.pp, 1, cfg.layout.pp_stage_layers))


def pipeline_module(cfg: RunConfig, model):
    """A PipelineModule of one PipeStage per stage ("uniform" over pp items: stage s builds item s only);
    the loss is the model's own causal-LM loss (labels shifted inside, mean over labelled tokens)."""
    from deepspeed.pipe import LayerSpec, PipelineModule

    pp, vocab = cfg.layout.pp, model.config.vocab_size
    layers = stage_layers(cfg, model.config.num_hidden_layers)
    specs = [LayerSpec(pipe_stage_class(), model, layers[s], s == 0, s == pp - 1) for s in range(pp)]

    def causal_lm_loss(logits, labels):
        return model.loss_function(logits=logits, labels=labels, vocab_size=vocab)

    return PipelineModule(layers=specs, num_stages=pp, loss_fn=causal_lm_loss, partition_method="uniform")


def count_every_stage_in_grad_norm(pipe) -> None:
    """Make ZeRO-0's gradient clipping see every stage.

    deepspeed.runtime.utils.clip_grad_norm_ (0.19.8, the ZeRO-0 fp32 path) sums squared norms over the
    pipeline's model-parallel group but counts a parameter only on that group's rank 0 (the first stage)
    unless the parameter is marked model-parallel; unmarked, the clip norm leaves out every later stage
    (measured: losses leave the single-process ones once clipping acts). With tp = 1 the mark changes
    nothing else: its other readers test it together with the tensor-parallel rank, 0 on every rank.
    """
    for param in pipe.parameters():
        param.model_parallel = True


def _init_deepspeed(cfg: RunConfig, kind) -> None:
    import deepspeed

    if not cfg.engine.compiled_ops:
        # Skip the JIT-built shared-memory collective op: gloo does the work without a compile.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend=kind.backend)


# transformers holds the HfDeepSpeedConfig through a weak reference: it must outlive construction.
_HF_DEEPSPEED_CONFIG: List[Any] = []


def construct(cfg: RunConfig, run_dir: Path, kind):
    """The model built partitioned (model.init=meta at ZeRO-3): with an HfDeepSpeedConfig alive,
    transformers wraps from_config in deepspeed.zero.Init (modeling_utils, is_deepspeed_zero3_enabled), so
    each parameter is partitioned as soon as its module is built and no rank ever holds all of them.
    transformers initialises each module gathered (its ZeRO-3 path): a proper init, but drawn in a different
    order than a full build, so losses do not equal the full-build reference."""
    from transformers.integrations import HfDeepSpeedConfig

    from harness.runtime.model import build_model

    _init_deepspeed(cfg, kind)
    config = json.loads((Path(run_dir) / CONFIG_FILE).read_text())
    _HF_DEEPSPEED_CONFIG[:] = [HfDeepSpeedConfig(config)]
    model = build_model(cfg.model.hf_config, cfg.bench.seed)
    # zero.Init tags every parameter it partitions; a full build here would defeat model.init=meta.
    whole = [name for name, param in model.named_parameters() if not hasattr(param, "ds_id")]
    if whole:
        raise RuntimeError(f"model.init=meta: {len(whole)} parameters were built whole, not by zero.Init "
                           f"(first: {whole[0]})")
    return model


def nvme_swap_bytes(engine, params) -> int:
    """Bytes of this rank's NVMe swap files: one per swapped parameter partition (its own folder), and per
    swapped optimizer sub-group its fp32 partition, Adam moments and gradient fragments, each I/O-aligned
    (deepspeed/runtime/swap_tensor). Only files the swappers hold count: a reused nvme_path may keep others."""
    import os

    paths = set()
    param_swapper = next((p.nvme_swapper for p in params if getattr(p, "nvme_swapper", None) is not None), None)
    if param_swapper is not None:
        paths.update(param_swapper.id_to_path.values())
    optimizer_swapper = getattr(engine.optimizer, "optimizer_swapper", None)
    if optimizer_swapper is not None:
        for info in optimizer_swapper.swap_params_info.values():
            paths.update(t.swap_path for t in info.tensors)
            paths.update(g.path for g in info.swapped_gradients.values())
    return sum(os.path.getsize(p) for p in paths if os.path.exists(p))


def apply(cfg: RunConfig, run_dir: Path, model, kind):
    import deepspeed

    from harness.engines.materialize import release_unowned

    _init_deepspeed(cfg, kind)
    config = json.loads((Path(run_dir) / CONFIG_FILE).read_text())
    if cfg.layout.activation_checkpointing == "full":
        # Each decoder layer recomputes itself, with or without a pipeline around it.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.layout.pp > 1:
        pipe = pipeline_module(cfg, model)
        release_unowned(model, [pipe])
        count_every_stage_in_grad_norm(pipe)
        engine, _, _, _ = deepspeed.initialize(model=pipe, model_parameters=pipe.parameters(), config=config)
        return PipelineSession(engine, cfg)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return DeepSpeedSession(engine, cfg)
