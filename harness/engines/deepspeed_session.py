"""DeepSpeed on each rank: the engine built from ds_config.json (ZeRO 0-3, offload, AutoTP), or the PipelineEngine
over one StageModule per pipeline stage, and the bytes of state each rank holds."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List

import deepspeed
import torch
from deepspeed import comm as ds_dist
from deepspeed.pipe import LayerSpec, PipelineModule
from deepspeed.runtime.pipe.schedule import OptimizerStep
from transformers.integrations import HfDeepSpeedConfig

from harness.config.schema import RunConfig
from harness.engines.deepspeed import CONFIG_FILE, stage_layers
from harness.engines.materialize import release_unowned
from harness.engines.stage_module import StageModule
from harness.modeling.model import build_model
from harness.modeling.tensor_bytes import optimizer_state_bytes, sum_tensor_bytes


class DeepSpeedSession:
    """One DeepSpeed engine on one rank: a training step and the bytes of state it holds."""

    def __init__(self, engine, cfg: RunConfig):
        self.engine, self.cfg = engine, cfg
        self.model = engine.module
        tp = cfg.layout.tp
        # AutoTP: ranks of one tensor-parallel group are consecutive and must read the same batch.
        self.dp_rank, self.dp_size = ds_dist.get_rank() // tp, ds_dist.get_world_size() // tp

    def train_step(self, micro_batches, on_boundary=None):
        """One optimizer step; `on_boundary` runs after the last backward, before the optimizer step."""
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


def pipeline_module(cfg: RunConfig, model):
    """A PipelineModule of one StageModule per stage ("uniform" over pp items: stage s builds item s only);
    the loss is the model's own causal-LM loss (labels shifted inside, mean over labelled tokens)."""
    pp, vocab = cfg.layout.pp, model.config.vocab_size
    layers = stage_layers(cfg, model.config.num_hidden_layers)
    specs = [LayerSpec(StageModule, model, layers[s], s == 0, s == pp - 1) for s in range(pp)]

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
    if cfg.engine.compile:
        engine.compile(backend="inductor")  # torch.compile as the config's `compile` section sets it
    return DeepSpeedSession(engine, cfg)
