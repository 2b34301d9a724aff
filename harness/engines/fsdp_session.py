"""FSDP on each rank: FSDP2 or FSDP1 applied with torch, as the environment `accelerate launch` made from
accelerate.yaml says (read back through Accelerate's own `FullyShardedDataParallelPlugin` and
`ParallelismConfig`; see harness.engines.fsdp for why the sharding is not Accelerate's `prepare`)."""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Tuple

import torch
import torch.distributed as dist
from accelerate.big_modeling import _attach_context_parallel_hooks
from accelerate.parallelism_config import ParallelismConfig
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffload,
    CPUOffloadPolicy,
    FullyShardedDataParallel,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardingStrategy,
    fully_shard,
)
from torch.distributed.tensor.experimental._attention import set_rotate_method
from transformers.distributed import DistributedConfig
from transformers.distributed.tensor_parallel import apply_tensor_parallelism

from harness.config.schema import RunConfig
from harness.engines.compile_blocks import compile_modules, is_compiled
from harness.engines.float8 import convert_to_float8
from harness.engines.fsdp import CONFIG_FILE
from harness.engines.grad_norm import clip_grad_norm
from harness.engines.lm_loss import context_parallel_loss
from harness.engines.optimizer import ADAMW_BETAS, ADAMW_EPS
from harness.engines.shards import sharded_state_bytes
from harness.modeling.device import torch_device
from harness.plan.regime import torchao_float8_config

# Builds nothing itself: the runtime builds the model (whole on every rank).
construct = None


@dataclass(frozen=True)
class LaunchedSettings:
    """accelerate.yaml as the launcher handed it to this rank, parsed by Accelerate's own classes."""

    plugin: Any  # accelerate.utils.FullyShardedDataParallelPlugin
    precision: str  # ACCELERATE_MIXED_PRECISION: "bf16", "fp16" or "no"
    replicate: int  # FSDP2 mesh; FSDP1 shards over the whole world
    shard: int
    parallelism: Any = None  # FSDP2: accelerate.parallelism_config.ParallelismConfig (tp, cp, cp handler)

    @property
    def version(self) -> int:
        return self.plugin.fsdp_version

    @property
    def tp(self) -> int:
        return self.parallelism.tp_size if self.parallelism is not None else 1

    @property
    def cp(self) -> int:
        return self.parallelism.cp_size if self.parallelism is not None else 1

    @property
    def multi_dim(self) -> bool:
        """Tensor or context parallelism: Accelerate's N-D mesh instead of the data-parallel one."""
        return self.tp > 1 or self.cp > 1

    @property
    def offload(self) -> bool:
        offload = self.plugin.cpu_offload  # FSDP2: an OffloadPolicy; FSDP1: a CPUOffload
        return isinstance(offload, CPUOffloadPolicy) or (isinstance(offload, CPUOffload) and offload.offload_params)


def launched_settings(world_size: int) -> LaunchedSettings:
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        raise RuntimeError(
            "engine=fsdp reads its settings from the environment `accelerate launch --config_file "
            f"{CONFIG_FILE}` sets, and ACCELERATE_USE_FSDP is not 'true' here (started by another launcher?)"
        )
    plugin = FullyShardedDataParallelPlugin()
    parallelism = None
    if plugin.fsdp_version == 2:
        parallelism = ParallelismConfig()
        replicate, shard = parallelism.dp_replicate_size, parallelism.dp_shard_size
        size = parallelism.total_size
    else:
        replicate, shard = 1, world_size
        size = world_size
    if size != world_size:
        raise RuntimeError(f"accelerate.yaml gives a {parallelism} mesh of {size} ranks for {world_size} ranks")
    return LaunchedSettings(plugin, os.environ.get("ACCELERATE_MIXED_PRECISION", "no"), replicate, shard, parallelism)


def compute_dtype(precision: str):
    # fp8: float8 linears (converted before sharding) inside the bf16 policy.
    return {"bf16": torch.bfloat16, "fp8": torch.bfloat16, "fp16": torch.float16}.get(precision)


# Precision policy (both versions): the parameters FSDP keeps sharded are fp32 and are the optimizer's
# master weights (no separate copy); each unit all-gathers them cast to bf16 for forward and backward;
# gradients are reduced and kept in fp32 (reduce_dtype fp32, as torchtitan's default: a bf16 sum over
# many ranks loses low bits). No output cast: the HF loss is computed from fp32-upcast logits and
# stays fp32 (Accelerate's own policy for mixed_precision=bf16 sets output_dtype and reduce_dtype to
# bf16: the model then returns its loss in bf16, checked). Buffers (rotary inv_freq) stay fp32.
# State bytes follow: 4 (param) + 4 (grad) + 8 (Adam moments) bytes per parameter, sharded.
def fsdp2_mixed_precision(precision: str):
    dtype = compute_dtype(precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def fsdp1_mixed_precision(precision: str):
    dtype = compute_dtype(precision)
    if dtype is None:
        return None
    return MixedPrecision(param_dtype=dtype, reduce_dtype=torch.float32, buffer_dtype=None)


def offload_policy(plugin, kind):
    """The plugin's CPU offload; host memory is pinned only where a GPU copies from it."""
    if isinstance(plugin.cpu_offload, CPUOffloadPolicy) and kind.type == "cpu":
        return CPUOffloadPolicy(pin_memory=False)
    return plugin.cpu_offload


def wrap_policy(plugin, model):
    """`module -> bool` for the layer classes named in fsdp_transformer_layer_cls_to_wrap (Accelerate's
    own lookup, which raises when the model has no such class)."""
    return fsdp2_prepare_auto_wrap_policy(plugin, model)


def checkpoint_layers(model, is_layer) -> None:
    """Full activation checkpointing: each decoder layer keeps only its input for the backward."""
    wrapper = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, check_fn=is_layer)


def apply_fsdp2(model, settings: LaunchedSettings, kind, compile_blocks: bool = False):
    """fully_shard each decoder layer, then the root (embedding, final norm, lm_head), on a
    (replicate, shard) mesh: 1-D FSDP when nothing replicates, 2-D HSDP otherwise. With tensor or
    context parallelism, on Accelerate's N-D mesh instead (returned; None otherwise)."""
    plugin = settings.plugin
    is_layer = wrap_policy(plugin, model)
    mesh = None
    if settings.multi_dim:
        mesh = settings.parallelism.build_device_mesh(kind.type)
        if settings.tp > 1:
            apply_tensor_parallel(model, mesh["tp"], settings.tp)  # module names before checkpoint wrappers
        if settings.cp > 1:
            attach_context_parallel_hooks(model)
        fsdp_mesh = mesh[fsdp_mesh_dims(settings.parallelism)]
    else:
        fsdp_mesh = data_parallel_mesh(settings, kind)
    if plugin.activation_checkpointing:
        checkpoint_layers(model, is_layer)  # before sharding, as Accelerate does for FSDP2
    if compile_blocks:
        # Each block as checkpointing left it (the wrapper, else the layer); fully_shard then wraps the compiled one.
        compile_modules(model, outermost(model, lambda m: isinstance(m, CheckpointWrapper) or is_layer(m)))
        is_layer = functools.partial(_compiled_or, is_layer)
    options = dict(
        mesh=fsdp_mesh,
        mp_policy=fsdp2_mixed_precision(settings.precision),
        offload_policy=offload_policy(plugin, kind),
    )
    for layer in outermost(model, is_layer):
        fully_shard(layer, reshard_after_forward=plugin.reshard_after_forward, **options)
    fully_shard(model, **options)  # root: torch keeps it gathered after forward (used first in backward)
    return model, mesh


def _compiled_or(is_layer, module) -> bool:
    return is_compiled(module) or is_layer(module)


def data_parallel_mesh(settings: LaunchedSettings, kind):
    if settings.replicate > 1:
        shape, names = (settings.replicate, settings.shard), ("dp_replicate", "dp_shard")
    else:
        shape, names = (settings.shard,), ("dp_shard",)
    return init_device_mesh(kind.type, shape, mesh_dim_names=names)


def fsdp_mesh_dims(parallelism) -> Tuple[str, ...]:
    """The dims fully_shard runs over, as Accelerate's fsdp2_prepare_model picks them: dp_shard x cp
    flattened (context-parallel ranks shard the weights too), under dp_replicate when it replicates."""
    return tuple(parallelism.fsdp_dim_names)


def tensor_parallel_plan(model, tp: int) -> Dict[str, str]:
    """transformers' own plan for this model, the one `from_pretrained(tp_plan="auto")` applies, resolved
    to module and parameter names (Llama: q/k/v/gate/up colwise, o/down rowwise, embedding rowwise,
    lm_head colwise with gathered output)."""
    tp_plan, _, _ = model._resolve_parallel_plans(DistributedConfig(tp_size=tp, tp_plan="auto"))
    return tp_plan


def apply_tensor_parallel(model, tp_mesh, tp: int) -> None:
    """Shard in place on the `tp` mesh dim. Every rank built the same seeded weights, so each keeps its
    own slice (src_data_rank=None in transformers' styles: no broadcast)."""
    apply_tensor_parallelism(model, tp_mesh, tensor_parallel_plan(model, tp))


def attach_context_parallel_hooks(model) -> None:
    """Accelerate's own hooks (Accelerator._prepare_cp): attention runs causal without a mask, which ring
    attention needs; models with sliding-window layers are refused there."""
    _attach_context_parallel_hooks(model)


def outermost(model, is_layer) -> List[Any]:
    """Matching modules not nested in another match (a CheckpointWrapper, not also the layer inside)."""
    chosen, inside = [], set()
    for module in model.modules():  # parents come before their children
        if id(module) not in inside and is_layer(module):
            chosen.append(module)
            inside.update(id(sub) for sub in module.modules())
    return chosen


def apply_fsdp1(model, settings: LaunchedSettings, kind):
    plugin = settings.plugin
    plugin.set_auto_wrap_policy(model)  # class names -> transformer_auto_wrap_policy partial
    is_layer = wrap_policy(plugin, model)
    wrapped = FullyShardedDataParallel(
        model,
        sharding_strategy=plugin.sharding_strategy,
        auto_wrap_policy=plugin.auto_wrap_policy,
        cpu_offload=plugin.cpu_offload,
        mixed_precision=fsdp1_mixed_precision(settings.precision),
        backward_prefetch=plugin.backward_prefetch,
        forward_prefetch=plugin.forward_prefetch,
        limit_all_gathers=plugin.limit_all_gathers,
        use_orig_params=plugin.use_orig_params,
        sync_module_states=plugin.sync_module_states,
        device_id=torch_device(kind),  # explicit: FSDP1 refuses to guess a CPU device
    )
    if plugin.activation_checkpointing:
        checkpoint_layers(wrapped, is_layer)  # after wrapping, as Accelerate does for FSDP1
    return wrapped


class FsdpSession:
    """One FSDP-wrapped model and its AdamW on one rank: a training step and the bytes it holds."""

    def __init__(self, model, optimizer, settings: LaunchedSettings, cfg: RunConfig, kind, mesh=None):
        self.model, self.optimizer, self.settings, self.cfg, self.mesh = model, optimizer, settings, cfg, mesh
        self.device = torch_device(kind)
        if mesh is None:  # data parallelism is the only axis: every rank reads its own batch
            self.dp_rank, self.dp_size = dist.get_rank(), dist.get_world_size()
        else:
            self.dp_rank, self.dp_size = data_parallel_coordinate(mesh, settings.parallelism)

    def _gradient_sync(self, last: bool):
        """Skip the cross-replica part of the gradient reduction on all but the last micro-batch.

        FSDP2 with a replicate axis (HSDP, or NO_SHARD as a shard group of one) still reduce-scatters
        every micro-batch, so gradients stay sharded as the plan predicts, and all-reduces across replicas
        once. FSDP1 NO_SHARD holds full gradients anyway, so `no_sync` costs no memory there. Sharded
        FSDP1 strategies reduce every micro-batch (no_sync would keep unsharded gradients).
        """
        if self.settings.version == 2:
            if self.settings.replicate > 1:
                self.model.set_requires_all_reduce(last)
            return contextlib.nullcontext()
        if self.settings.plugin.sharding_strategy == ShardingStrategy.NO_SHARD and not last:
            return self.model.no_sync()
        return contextlib.nullcontext()

    def _clip_gradients(self) -> None:
        max_norm = self.cfg.bench.grad_clip
        if not max_norm or max_norm <= 0:
            return
        if self.settings.version == 1:
            self.model.clip_grad_norm_(max_norm)
            return
        # With tp > 1 the DTensor gradients live on two meshes (data; data x tp): one all-reduce over every rank.
        grads = [p.grad for p in self.model.parameters()]
        clip_grad_norm(grads, max_norm, ranks_per_model=dist.get_world_size(), device=self.device)

    def train_step(self, micro_batches, on_boundary=None):
        """One optimizer step; `on_boundary` runs after the last backward, before clipping and the step."""
        batches = list(micro_batches)
        losses = []
        for index, tokens in enumerate(batches):
            tokens = tokens.to(self.device)
            with self._gradient_sync(index == len(batches) - 1):
                if self.settings.cp > 1:
                    loss = self._context_parallel_backward(tokens, len(batches))
                else:
                    loss = self.model(input_ids=tokens, labels=tokens).loss
                    (loss / len(batches)).backward()
            losses.append(loss.detach().float())
        if on_boundary is not None:
            on_boundary()
        self._clip_gradients()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return torch.stack(losses).mean()

    def _context_parallel_backward(self, tokens, n_micro: int):
        """One micro-batch with its sequence split over the `cp` ranks, as Accelerate's maybe_context_parallel
        splits it (FSDP's gradient mean over dp_shard x cp is then the exact micro-batch mean)."""

        def forward(tokens, positions):
            return self.model(input_ids=tokens, position_ids=positions).logits

        return context_parallel_loss(forward, tokens, self.mesh["cp"], n_micro)

    def state_bytes(self) -> Dict[str, int]:
        return fsdp_state_bytes(self.model, self.optimizer, self.settings.offload)


def data_parallel_coordinate(mesh, parallelism) -> Tuple[int, int]:
    """(dp_rank, dp_size): ranks of one tensor / context-parallel group read the same batch."""
    if not parallelism.dp_dim_names:
        return 0, 1
    return mesh["dp"].get_local_rank(), parallelism.data_parallel_size


def fsdp_state_bytes(model, optimizer, offload: bool) -> Dict[str, int]:
    """Bytes this rank holds once gradients are reduced and before the optimizer steps (device / host).

    Parameters are the sharded fp32 tensors FSDP keeps between steps (FSDP2: each DTensor's local
    shard; FSDP1: each unit's flat parameter shard, padding included); the compute-dtype copies
    gathered for forward and backward are freed by then. Gradients have the same shards and dtype.
    Optimizer: Adam's two moments, shaped like the shards. The fp32 parameters are the master weights:
    there is no separate master copy. CPU offload keeps all three in host memory: counted in
    `host_bytes`, not on the device.
    """
    state = sharded_state_bytes(model.parameters(), optimizer)
    if offload:
        state["host_bytes"] = state["param_bytes"] + state["grad_bytes"] + state["optimizer_bytes"]
        state.update(param_bytes=0, grad_bytes=0, optimizer_bytes=0)
    return state


def init_process_group(kind, settings: LaunchedSettings) -> None:
    if dist.is_initialized():
        return
    backend = kind.backend
    if kind.type == "cuda" and settings.offload:
        # Offloaded shards are CPU tensors: the gradient-norm reduction over them needs gloo too.
        backend = f"cpu:gloo,cuda:{kind.backend}"
    dist.init_process_group(backend=backend)


def apply(cfg: RunConfig, run_dir: Path, model, kind) -> FsdpSession:
    """Shard `model` as the launcher's environment says (FSDP2 moves it to the mesh's device, FSDP1 to
    `device_id`), and pair it with AdamW over the sharded parameters."""
    settings = launched_settings(int(os.environ["WORLD_SIZE"]))
    if settings.multi_dim and kind.type != "cuda":
        raise RuntimeError(
            f"tp={settings.tp}, cp={settings.cp} on device {kind.type}: engine=fsdp runs Accelerate's "
            "ParallelismConfig on GPU only (engine=nd runs tensor parallelism on CPU)"
        )
    init_process_group(kind, settings)
    if settings.precision == "fp8":
        convert_to_float8(model, torchao_float8_config())
    mesh = None
    if settings.version == 2:
        model, mesh = apply_fsdp2(model, settings, kind, cfg.engine.compile)
    else:
        model = apply_fsdp1(model, settings, kind)
    if settings.cp > 1:
        # How ring attention passes key/value chunks between cp ranks, as Accelerator._prepare_cp sets it.
        set_rotate_method(settings.parallelism.cp_handler.cp_comm_strategy)
    bench = cfg.bench
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=bench.lr, betas=ADAMW_BETAS, eps=ADAMW_EPS, weight_decay=bench.weight_decay
    )
    return FsdpSession(model, optimizer, settings, cfg, kind, mesh)
