"""nd on each rank: the device mesh, pipeline stages, DTensor tensor parallelism, checkpointing and FSDP2 built
from `nd_plan.json` (harness.engines.nd renders it), and the training step over them."""

from __future__ import annotations

import functools
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Dict, List

import torch
import torch.distributed as dist
import torch.distributed.tensor.parallel as tensor_parallel
from torch.distributed import pipelining
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    checkpoint_wrapper,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.experimental._attention import set_rotate_method
from torch.distributed.tensor.parallel import loss_parallel, parallelize_module
from torch.utils.checkpoint import (
    CheckpointPolicy,
    create_selective_checkpoint_contexts,
)

from harness.config.schema import RunConfig
from harness.engines import nd_plans, nd_tp
from harness.engines.compile_blocks import compile_modules
from harness.engines.float8 import convert_to_float8
from harness.engines.grad_norm import clip_grad_norm
from harness.engines.lm_loss import (
    causal_lm_loss,
    context_parallel_loss,
    shifted_labels,
)
from harness.engines.materialize import materialize, release_unowned
from harness.engines.nd import PLAN_FILE
from harness.engines.shards import local_shard, plain, sharded_state_bytes
from harness.engines.stage_module import StageModule
from harness.modeling.device import torch_device
from harness.plan.parallel_dims import ParallelDims
from harness.plan.pipeline import SINGLE_STAGE_SCHEDULES

# Builds nothing itself: the runtime builds the model, on the meta device when plan.json says model_init=meta
# (each rank then materialises its own shards after splitting and sharding).
construct = None


def _placement(text: str):
    if text == nd_plans.REPLICATE:
        return Replicate()
    if text.startswith("Shard(") and text.endswith(")"):
        return Shard(int(text[len("Shard(") : -1]))
    raise ValueError(f"unknown placement {text!r} in {PLAN_FILE}")


def _layouts(value: Any):
    if isinstance(value, str):
        return _placement(value)
    if isinstance(value, list):
        return tuple(None if v is None else _placement(v) for v in value)
    if isinstance(value, dict):
        return {k: _placement(v) for k, v in value.items()}
    return value


def build_style(spec: Dict[str, Any]):
    """A torch ParallelStyle from its `nd_plan.json` entry."""
    if spec["style"] == nd_tp.ND_GRAD_ALLREDUCE:
        return nd_tp.grad_allreduce_style()
    kwargs = {k: (_layouts(v) if k.endswith("layouts") else v) for k, v in spec.items() if k != "style"}
    return getattr(tensor_parallel, spec["style"])(**kwargs)


class LocalShards:
    """`session.model` for the runtime: `parameters()` yields the local tensors of this rank's weights
    (a DTensor has no storage of its own to compare saved tensors with)."""

    def __init__(self, params):
        self.params = params

    def parameters(self):
        return (local_shard(p) for p in self.params)


class NdSession:
    """One rank's stages, optimizer and schedule: a training step and the bytes of state it holds."""

    def __init__(self, plan: Dict[str, Any], mesh, stages, optimizer, schedule, stage_specs, device, cfg):
        self.plan, self.mesh, self.stages = plan, mesh, stages
        self.optimizer, self.schedule, self.stage_specs = optimizer, schedule, stage_specs
        self.device, self.cfg = device, cfg
        dims = ParallelDims.of(cfg.layout)
        self.dp_size = dims.dp
        self.dp_rank = dims.data_parallel_rank(mesh.get_rank())
        self.params = [p for stage in stages for p in stage.parameters()]
        # What the runtime's activation meter excludes as weights: this rank's local shards.
        self.model = LocalShards(self.params)
        # Ranks holding copies of one parameter shard: everything in this pipeline stage, over its shards.
        self.ranks_per_stage = dims.ranks_per_stage
        self.has_first = any(spec["embedding"] for spec in stage_specs)
        self.has_last = any(spec["head"] for spec in stage_specs)
        # The loss exists on the rank of the last stage (pp-1 under loop placement, 0 under V placement).
        self.last_stage_pp_rank = plan["pipeline"]["stages"][-1]["pp_rank"] if plan["pipeline"] else 0

    # -- one optimizer step ------------------------------------------------------------------------
    def _context(self) -> ExitStack:
        stack = ExitStack()
        if self.plan["tensor_parallel"]["loss_parallel"]:
            stack.enter_context(loss_parallel())
        if self.plan["autocast_bf16"]:
            stack.enter_context(torch.autocast(self.device.type, dtype=torch.bfloat16))
        return stack

    def train_step(self, micro_batches, on_boundary=None):
        batches = [tokens.to(self.device) for tokens in micro_batches]
        with self._context():
            if self.plan["context_parallel"] is not None:
                loss = self._accumulate_context_parallel(batches)
            elif self.schedule is None:
                loss = self._accumulate(batches)
            else:
                loss = self._pipeline(batches)
        self._align_grad_placements()
        if on_boundary is not None:
            on_boundary()
        clip = self.plan["optimizer"]["grad_clip"]
        if clip and clip > 0:
            self.clip_grad_norm(clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach().to(torch.float32).cpu()

    def _accumulate(self, batches):
        stage, losses = self.stages[0], []
        for tokens in batches:
            loss = causal_lm_loss(stage(tokens), shifted_labels(tokens))
            (loss / len(batches)).backward()
            losses.append(plain(loss).detach().float())
        return torch.stack(losses).mean()

    def _accumulate_context_parallel(self, batches):
        """Ring attention over the `cp` mesh dim (GPU only: rendered and validated on CPU, never run there)."""
        set_rotate_method(self.plan["context_parallel"]["rotate_method"])
        stage = self.stages[0]
        losses = [context_parallel_loss(stage, tokens, self.mesh["cp"], len(batches)) for tokens in batches]
        return torch.stack(losses).mean()

    def _pipeline(self, batches):
        """The step's micro-batches are the schedule's; the loss is broadcast from the last stage's rank."""
        tokens = torch.cat(batches)
        args = (tokens,) if self.has_first else ()
        losses: List[Any] = []
        if self.has_last:
            self.schedule.step(*args, target=shifted_labels(tokens), losses=losses)
            loss = torch.stack([plain(value).detach().float() for value in losses]).mean()
        else:
            self.schedule.step(*args)
            loss = torch.zeros((), dtype=torch.float32, device=self.device)
        dist.broadcast(loss, group=self.mesh.get_group("pp"), group_src=self.last_stage_pp_rank)
        return loss

    def _align_grad_placements(self) -> None:
        """Give each DTensor gradient its parameter's placements.

        DTensor's embedding backward leaves a vocab-parallel (Shard(0)) table with a Replicate gradient:
        keeping only the local rows (a slice, no communication) makes the gradient the size of the shard.
        """
        for param in self.params:
            grad = param.grad
            if isinstance(grad, DTensor) and tuple(grad.placements) != tuple(param.placements):
                param.grad = grad.redistribute(param.device_mesh, param.placements)

    def clip_grad_norm(self, max_norm: float) -> float:
        """Scale gradients to a global L2 norm of at most `max_norm` (torch's rule, over every stage)."""
        grads = [p.grad for p in self.params]
        return clip_grad_norm(grads, max_norm, ranks_per_model=self.ranks_per_stage, device=self.device)

    # -- measurement ------------------------------------------------------------------------------
    def state_bytes(self) -> Dict[str, int]:
        """Exact local bytes: DTensor parameters, gradients and Adam moments count their local shard only.

        Weights stay fp32 (under bf16 FSDP keeps them as the fp32 master and gathers bf16 copies for
        compute; without FSDP autocast computes in bf16), so there is no separate master copy.
        """
        return sharded_state_bytes(self.params, self.optimizer)


# ------------------------------------------------------------------------------------------ apply
def _build_mesh(plan: Dict[str, Any]):
    mesh_plan = plan["mesh"]
    return init_device_mesh(mesh_plan["device_type"], tuple(mesh_plan["shape"]),
                            mesh_dim_names=tuple(mesh_plan["dim_names"]))  # fmt: skip


def _data_mesh(mesh, data: Dict[str, Any]):
    """The mesh the data-parallel wrapper gets, flattening dims that act as one (see nd_plans)."""
    if "dp_shard_cp" in data["mesh_dims"]:
        mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    if data["mesh_dims"] == ["dp_replicate_shard_cp"]:
        return mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_replicate_shard_cp")
    dims = data["mesh_dims"]
    return mesh[dims[0]] if len(dims) == 1 else mesh[tuple(dims)]


def _set_head_counts(attention, tp: int) -> None:
    """Attention modules that keep head counts as attributes compute heads/tp of them on each rank.

    transformers 5 reshapes with -1 heads (nothing to change); the ratio num_key_value_groups is unchanged.
    """
    for name in ("num_heads", "num_attention_heads", "num_key_value_heads"):
        if isinstance(getattr(attention, name, None), int):
            setattr(attention, name, getattr(attention, name) // tp)


@functools.lru_cache(maxsize=None)
def _wait_collective():
    class WaitCollective(torch.autograd.Function):
        """The finished result of an async collective as a plain tensor (zero-copy; gradient passes through)."""
        @staticmethod
        def forward(ctx, tensor):
            return tensor.trigger_wait()

        @staticmethod
        def backward(ctx, grad):
            return grad

    return WaitCollective


def _waited(value):
    """Replace AsyncCollectiveTensor results (also inside a DTensor) by plain tensors.

    The TP styles redistribute with async_op=True; the op right after a TP module boundary waits anyway,
    so waiting at the boundary costs no overlap, and what autograd saves is then a tensor with real
    storage (the runtime's activation meter reads storages).
    """
    if isinstance(value, AsyncCollectiveTensor):
        return _wait_collective().apply(value)
    if isinstance(value, DTensor) and isinstance(value._local_tensor, AsyncCollectiveTensor):
        local = _wait_collective().apply(value.to_local())
        return DTensor.from_local(local, value.device_mesh, value.placements, run_check=False,
                                  shape=value.shape, stride=value.stride())  # fmt: skip
    if isinstance(value, tuple):
        return tuple(_waited(v) for v in value)
    return value


def _wait_at_boundaries(module) -> None:
    module.register_forward_pre_hook(
        lambda _, args, kwargs: (_waited(args), {k: _waited(v) for k, v in kwargs.items()}), with_kwargs=True
    )
    module.register_forward_hook(lambda _, args, output: _waited(output))


def _apply_tensor_parallel(stage, tp_mesh, tp_plan: Dict[str, Any]) -> None:
    layer_plan = {path: build_style(spec) for path, spec in tp_plan["layer_plan"].items()}
    for layer in stage.layers.values():
        _set_head_counts(layer.self_attn, tp_mesh.size())
        parallelize_module(layer, tp_mesh, layer_plan)
        for path in layer_plan:
            _wait_at_boundaries(layer.get_submodule(path))
    top = {path: build_style(spec) for path, spec in tp_plan["top_plan"].items() if getattr(stage, path) is not None}
    parallelize_module(stage, tp_mesh, top)
    for path in top:
        _wait_at_boundaries(stage.get_submodule(path))


def _selective_policy():
    """Keep matmul and attention outputs, recompute the cheap element-wise ops (norms, SiLU, rotary, adds)."""
    aten = torch.ops.aten
    save = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.linear.default}
    for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"):  # fmt: skip
        if hasattr(aten, name):
            save.add(getattr(aten, name).default)

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return lambda: create_selective_checkpoint_contexts(policy)


def _apply_checkpointing(stage, mode: str) -> None:
    if mode == "none":
        return

    kwargs = {"context_fn": _selective_policy()} if mode == "selective" else {}
    for key, layer in list(stage.layers.items()):
        stage.layers[key] = checkpoint_wrapper(layer, preserve_rng_state=False, **kwargs)


def _apply_data_parallel(stage, dp_mesh, data: Dict[str, Any], on_gpu: bool) -> None:
    """FSDP2 per decoder layer, then the stage root (the embedding, norm and head join the root's group)."""
    mp = MixedPrecisionPolicy()
    if data["mixed_precision"]:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if data["wrapper"] == "replicate":
        for layer in stage.layers.values():
            replicate(layer, mesh=dp_mesh, mp_policy=mp)
        replicate(stage, mesh=dp_mesh, mp_policy=mp)
        return
    offload = CPUOffloadPolicy(pin_memory=on_gpu) if data["offload"] == "cpu" else OffloadPolicy()
    kwargs = dict(mesh=dp_mesh, reshard_after_forward=data["reshard_after_forward"], mp_policy=mp,
                  offload_policy=offload)  # fmt: skip
    for layer in stage.layers.values():
        fully_shard(layer, **kwargs)
    fully_shard(stage, **kwargs)


def _stage_specs(plan: Dict[str, Any], num_layers: int, pp_rank: int) -> List[Dict[str, Any]]:
    if plan["pipeline"] is None:
        return [{"stage": 0, "pp_rank": 0, "layers": list(range(num_layers)), "embedding": True, "head": True}]
    return [spec for spec in plan["pipeline"]["stages"] if spec["pp_rank"] == pp_rank]


def _schedule(plan: Dict[str, Any], stages, specs, mesh, device):
    pipeline = plan["pipeline"]
    group = mesh.get_group("pp")
    pipeline_stages = [
        pipelining.PipelineStage(module, spec["stage"], pipeline["num_stages"], device, group=group)
        for module, spec in zip(stages, specs)
    ]
    name = pipeline["schedule"]
    cls = getattr(pipelining, f"Schedule{name}")
    n = pipeline["n_microbatches"]
    if name in SINGLE_STAGE_SCHEDULES:
        return cls(pipeline_stages[0], n_microbatches=n, loss_fn=causal_lm_loss, scale_grads=True)
    return cls(pipeline_stages, n_microbatches=n, loss_fn=causal_lm_loss, scale_grads=True)


def apply(cfg: RunConfig, run_dir: Path, model, kind) -> NdSession:
    plan = json.loads((Path(run_dir) / PLAN_FILE).read_text())
    if plan["context_parallel"] is not None and kind.type != "cuda":
        raise RuntimeError(f"layout.cp={cfg.layout.cp}: context parallelism runs on GPU only (device {kind.type})")
    if not dist.is_initialized():
        dist.init_process_group(backend=kind.backend)
    device = torch_device(kind)
    mesh = _build_mesh(plan)
    specs = _stage_specs(plan, model.config.num_hidden_layers, mesh.get_local_rank("pp"))
    tp_plan = plan["tensor_parallel"]
    seq_scale = tp_plan["size"] if tp_plan["sequence_parallel"] else 1
    stages = [StageModule(model, s["layers"], s["embedding"], s["head"], seq_scale) for s in specs]
    # Built on the meta device (model.init): shard first, then allocate and initialise the local shards.
    # Asked before release_unowned, which moves other stages' modules to meta.
    on_meta = all(param.is_meta for param in model.parameters())
    release_unowned(model, stages)
    data = plan["data_parallel"]
    dp_mesh = _data_mesh(mesh, data) if data["wrapper"] else None
    for stage in stages:
        if not on_meta:
            stage.to(device)
        if plan["float8"]:
            convert_to_float8(stage, plan["float8"])  # first, as torchtitan's converters run
        if tp_plan["size"] > 1:
            _apply_tensor_parallel(stage, mesh["tp"], tp_plan)
        _apply_checkpointing(stage, plan["activation_checkpointing"])
        if cfg.engine.compile:
            compile_modules(stage, list(stage.layers.values()))
        if dp_mesh is not None:
            _apply_data_parallel(stage, dp_mesh, data, kind.type == "cuda")
        if on_meta:
            # FSDP2's CPU offload keeps the sharded parameters in host memory.
            materialize(stage, model, "cpu" if data.get("offload") == "cpu" else device, cfg.bench.seed)
        stage.train()
    schedule = _schedule(plan, stages, specs, mesh, device) if plan["pipeline"] else None
    opt = plan["optimizer"]
    params = [p for stage in stages for p in stage.parameters()]
    optimizer = torch.optim.AdamW(params, lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"],
                                  weight_decay=opt["weight_decay"])  # fmt: skip
    return NdSession(plan, mesh, stages, optimizer, schedule, specs, device, cfg)
