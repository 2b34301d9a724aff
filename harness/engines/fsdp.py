"""FSDP through Accelerate: `accelerate.yaml` from the layout (`render`), FSDP2 or FSDP1 on every rank (`apply`).

The rendered YAML is the single source of truth. `accelerate launch --config_file` turns it into the
`FSDP_*`, `PARALLELISM_CONFIG_*` and `ACCELERATE_MIXED_PRECISION` environment of every rank, and `apply`
reads that environment back through Accelerate's own `FullyShardedDataParallelPlugin` and
`ParallelismConfig`. The sharding itself is applied here with torch (`fully_shard` / FSDP1), on CPU and
GPU alike: an `Accelerator` on CPU stays `MULTI_CPU` and is never promoted to FSDP, so preparing the
model through it silently trains plain DDP (see ../shared/MEASURED.md). One code path for both devices
means the CPU integration tests exercise what a GPU cluster runs.

Tensor and context parallelism (FSDP2, GPU clusters only) also go through the YAML's `parallelism_config`:
each rank rebuilds Accelerate's ParallelismConfig and its device mesh, shards the model with transformers'
own tensor-parallel plan (what `from_pretrained(tp_plan="auto")` applies) on the `tp` dim, and runs
fully_shard over `dp_shard_cp`, as Accelerate's FSDP2 preparation does. Accelerate's own `prepare` is not
used for this: its TP step needs a `ReplicateParallel` style that transformers 5.23 no longer has.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from harness.config.schema import RunConfig
from harness.engines.rendered import RenderedRun, render_launch
from harness.plan.parallel_dims import ParallelDims
from harness.rundir import ACCELERATE_CONFIG_FILE, write_text

CONFIG_FILE = ACCELERATE_CONFIG_FILE
# layout.zero_stage -> FSDP1 sharding strategy (FSDP2 spells the same as reshard_after_forward + mesh).
FSDP1_STRATEGIES = {3: "FULL_SHARD", 2: "SHARD_GRAD_OP", 0: "NO_SHARD"}
# layout.precision -> Accelerate's `mixed_precision` (fp32 is "no": no mixed precision policy at all).
ACCELERATE_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}
# Same optimizer as the deepspeed engine, so that engines compare on equal terms.
ADAMW_BETAS, ADAMW_EPS = (0.9, 0.95), 1e-8
# Ring-attention rotation Accelerate sets for context parallelism (its launcher's default).
CP_COMM_STRATEGY = "allgather"
IGNORE_INDEX = -100  # transformers' label for "no loss here"
# Every fsdp_config key the renderer may write; each is an `accelerate launch --<key>` argument (tested).
FSDP_KEYS = frozenset(
    {
        "fsdp_version", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap", "fsdp_offload_params",
        "fsdp_activation_checkpointing", "fsdp_cpu_ram_efficient_loading", "fsdp_state_dict_type",
        "fsdp_reshard_after_forward", "fsdp_sharding_strategy", "fsdp_sync_module_states",
        "fsdp_use_orig_params", "fsdp_forward_prefetch", "fsdp_backward_prefetch",
    }
)  # fmt: skip


# ---------------------------------------------------------------------------------------------- render


def layout_problems(cfg: RunConfig) -> List[str]:
    """What this engine cannot do with the layout, one message per field (empty: renderable)."""
    return [*_launch_problems(cfg), *_sharding_problems(cfg), *_offload_problems(cfg), *_compute_problems(cfg)]


def _launch_problems(cfg: RunConfig) -> List[str]:
    engine, layout, cluster = cfg.engine, cfg.layout, cfg.cluster
    problems = []
    if engine.launcher != "accelerate":
        problems.append(
            f"engine.launcher={engine.launcher!r}: engine=fsdp is started by `accelerate launch`, whose "
            "environment carries accelerate.yaml to the ranks (use engine.launcher=accelerate)"
        )
    if engine.fsdp_version not in (1, 2):
        problems.append(f"engine.fsdp_version={engine.fsdp_version} must be 1 or 2")
    problems += ParallelDims.of(layout).world_problems(cluster.nodes, cluster.accelerators_per_node)[0]
    return problems


def _sharding_problems(cfg: RunConfig) -> List[str]:
    layout, engine = cfg.layout, cfg.engine
    problems = []
    if layout.zero_stage not in FSDP1_STRATEGIES:
        problems.append(
            f"layout.zero_stage={layout.zero_stage}: FSDP has no optimizer-only sharding level "
            "(0 NO_SHARD, 2 SHARD_GRAD_OP, 3 FULL_SHARD; ZeRO-1 is engine=deepspeed)"
        )
    for axis in ("pp", "ep"):
        if getattr(layout, axis) != 1:
            problems.append(
                f"layout.{axis}={getattr(layout, axis)}: engine=fsdp has no pipeline or expert parallelism "
                "(pipeline parallelism is engine=nd)"
            )
    problems += _parallelism_problems(cfg)
    if engine.fsdp_version == 1 and layout.dp_replicate > 1 and layout.zero_stage != 0:
        problems.append(
            f"layout.dp_replicate={layout.dp_replicate} with engine.fsdp_version=1: FSDP1 HYBRID_SHARD "
            "does not keep its replicas in sync on gloo (measured), hybrid sharding is fsdp_version=2"
        )
    return problems


def _parallelism_problems(cfg: RunConfig) -> List[str]:
    """Tensor / context parallelism: Accelerate's ParallelismConfig rules (parallelism_config.py)."""
    layout, engine, accelerator = cfg.layout, cfg.engine, cfg.cluster.accelerator
    axes = [f"layout.{axis}={getattr(layout, axis)}" for axis in ("tp", "cp") if getattr(layout, axis) > 1]
    if not axes:
        return []
    named = " and ".join(axes)
    problems = []
    if accelerator == "cpu":
        problems.append(
            f"{named} on cluster.accelerator='cpu': engine=fsdp runs tensor and context parallelism through "
            "Accelerate's ParallelismConfig, which needs GPUs (it refuses a MULTI_CPU state; context "
            "parallelism does not run on CPU); use engine=nd for tensor parallelism on CPU"
        )
    if engine.fsdp_version != 2:
        problems.append(f"{named} with engine.fsdp_version={engine.fsdp_version}: Accelerate composes them with FSDP2 only")
    if layout.zero_stage == 0:
        problems.append(
            f"{named} with layout.zero_stage=0: Accelerate composes them with sharded FSDP2 (zero_stage 2 or 3)"
        )
    if layout.dp_shard == 1 and (layout.cp == 1 or layout.dp_replicate > 1):
        problems.append(
            f"{named} with layout.dp_shard=1, dp_replicate={layout.dp_replicate}, cp={layout.cp}: FSDP2 needs a "
            "dp_shard (or, without replicas, cp) axis > 1 to shard across"
        )
    return problems


def _offload_problems(cfg: RunConfig) -> List[str]:
    layout, engine = cfg.layout, cfg.engine
    problems = []
    for key in ("offload_params", "offload_optimizer"):
        if getattr(layout, key) not in ("none", "cpu"):
            problems.append(f"layout.{key}={getattr(layout, key)!r}: FSDP offloads to cpu only")
    if layout.offload_params != layout.offload_optimizer:
        problems.append(
            f"layout.offload_params={layout.offload_params!r} and offload_optimizer={layout.offload_optimizer!r}: "
            "FSDP's CPU offload moves parameters, gradients and the optimizer step together (set both)"
        )
    if offloaded(cfg) and layout.zero_stage != 3:
        problems.append(f"layout.zero_stage={layout.zero_stage} with cpu offload: FSDP offloads at zero_stage=3")
    if offloaded(cfg) and engine.fsdp_version == 1 and cfg.cluster.accelerator == "cpu":
        problems.append(
            "cpu offload with engine.fsdp_version=1 on cluster.accelerator='cpu': FSDP1 always pins the "
            "offloaded shards, which needs a GPU (fsdp_version=2 offloads with pin_memory=False)"
        )
    return problems


def _compute_problems(cfg: RunConfig) -> List[str]:
    layout = cfg.layout
    problems = []
    if layout.activation_checkpointing == "selective":
        problems.append(
            "layout.activation_checkpointing='selective': engine=fsdp checkpoints whole decoder layers "
            "(none or full)"
        )
    if layout.precision == "fp16":
        problems.append("layout.precision='fp16': engine=fsdp trains in bf16 or fp32 (it has no loss scaler)")
    return problems


def offloaded(cfg: RunConfig) -> bool:
    return "cpu" in (cfg.layout.offload_params, cfg.layout.offload_optimizer)


def wrap_class_name(hf_config: Dict[str, Any]) -> str:
    """The decoder-layer class FSDP wraps and checkpoints, read from the model built on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    from harness.runtime.model import decoder_layer_class, hf_config_object

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config_object(hf_config))
    return decoder_layer_class(model).__name__


def mesh_shape(cfg: RunConfig) -> Tuple[int, int]:
    """(replicate, shard) degrees of the data-parallel mesh. zero_stage=0 shards nothing: every data
    rank replicates (a shard group of one), which FSDP2 runs as HSDP with Shard(0) over one rank."""
    layout = cfg.layout
    if layout.zero_stage == 0:
        return layout.dp_replicate * layout.dp_shard, 1
    return layout.dp_replicate, layout.dp_shard


def fsdp_config(cfg: RunConfig, layer_class: str) -> Dict[str, Any]:
    layout, version = cfg.layout, cfg.engine.fsdp_version
    config: Dict[str, Any] = {
        "fsdp_version": version,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": layer_class,
        "fsdp_offload_params": offloaded(cfg),
        "fsdp_activation_checkpointing": layout.activation_checkpointing == "full",
        "fsdp_cpu_ram_efficient_loading": False,  # every rank builds the same seeded weights
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    }
    if version == 2:
        config["fsdp_reshard_after_forward"] = layout.zero_stage == 3
    else:
        strategy = FSDP1_STRATEGIES[layout.zero_stage]
        config.update(
            # The launcher always exports FSDP_SHARDING_STRATEGY (default FULL_SHARD) and FSDP1 reads it
            # before the reshard key: without this key the YAML's strategy would be overridden.
            fsdp_sharding_strategy=strategy,
            fsdp_reshard_after_forward=strategy,
            # True broadcasts from rank 0 through a param_init_fn that needs an accelerator device.
            fsdp_sync_module_states=False,
            fsdp_use_orig_params=False,
            fsdp_forward_prefetch=False,
            fsdp_backward_prefetch="BACKWARD_PRE",
        )
    unknown = set(config) - FSDP_KEYS
    assert not unknown, f"renderer wrote unknown fsdp_config keys {sorted(unknown)}"
    return config


def accelerate_config(cfg: RunConfig, layer_class: Optional[str] = None) -> Dict[str, Any]:
    """The content of accelerate.yaml (what `accelerate config` would have written for this layout)."""
    cluster = cfg.cluster
    layer_class = layer_class or wrap_class_name(cfg.model.hf_config)
    config: Dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "mixed_precision": ACCELERATE_PRECISION[cfg.layout.precision],
        "num_machines": cluster.nodes,
        "num_processes": cluster.nodes * cluster.accelerators_per_node,
        "machine_rank": 0,  # the launch line passes each node's own --machine_rank
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
        "use_cpu": False,  # True would route `accelerate launch` to its single-process CPU launcher
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "debug": False,
        "fsdp_config": fsdp_config(cfg, layer_class),
    }
    if cfg.engine.fsdp_version == 2:
        config["parallelism_config"] = parallelism_config(cfg)
    return config


def parallelism_config(cfg: RunConfig) -> Dict[str, Any]:
    """The YAML's `parallelism_config` section: `accelerate launch` turns each key into its
    `--parallelism_config_*` argument and exports PARALLELISM_CONFIG_* (accelerate/utils/launch.py),
    from which ParallelismConfig() reads its mesh (dp_replicate, dp_shard, cp, tp). Accelerate accepts
    it with FSDP2 only."""
    layout = cfg.layout
    replicate, shard = mesh_shape(cfg)
    section: Dict[str, Any] = {
        "parallelism_config_dp_replicate_size": replicate,
        "parallelism_config_dp_shard_size": shard,
        "parallelism_config_tp_size": layout.tp,
        "parallelism_config_cp_size": layout.cp,
    }
    if layout.cp > 1:
        section.update(parallelism_config_cp_backend="torch", parallelism_config_cp_comm_strategy=CP_COMM_STRATEGY)
    return section


def render(cfg: RunConfig, run_dir: Path) -> RenderedRun:
    problems = layout_problems(cfg)
    if problems:
        raise ValueError("engine=fsdp cannot run this layout:\n  - " + "\n  - ".join(problems))
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    write_text(path, yaml.safe_dump(accelerate_config(cfg), sort_keys=False))
    return render_launch(cfg, run_dir, "accelerate", [CONFIG_FILE], extra=["--config_file", str(path)])


# --------------------------------------------------------------------------------------------- runtime


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
        from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy

        offload = self.plugin.cpu_offload  # FSDP2: an OffloadPolicy; FSDP1: a CPUOffload
        return isinstance(offload, CPUOffloadPolicy) or (isinstance(offload, CPUOffload) and offload.offload_params)


def launched_settings(world_size: int) -> LaunchedSettings:
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import FullyShardedDataParallelPlugin

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
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


# Precision policy (both versions): the parameters FSDP keeps sharded are fp32 and are the optimizer's
# master weights (no separate copy); each unit all-gathers them cast to bf16 for forward and backward;
# gradients are reduced and kept in fp32 (reduce_dtype fp32, as torchtitan's default: a bf16 sum over
# many ranks loses low bits). No output cast: the HF loss is computed from fp32-upcast logits and
# stays fp32 (Accelerate's own policy for mixed_precision=bf16 sets output_dtype and reduce_dtype to
# bf16: the model then returns its loss in bf16, checked). Buffers (rotary inv_freq) stay fp32.
# State bytes follow: 4 (param) + 4 (grad) + 8 (Adam moments) bytes per parameter, sharded.
def fsdp2_mixed_precision(precision: str):
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = compute_dtype(precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def fsdp1_mixed_precision(precision: str):
    import torch
    from torch.distributed.fsdp import MixedPrecision

    dtype = compute_dtype(precision)
    if dtype is None:
        return None
    return MixedPrecision(param_dtype=dtype, reduce_dtype=torch.float32, buffer_dtype=None)


def offload_policy(plugin, kind):
    """The plugin's CPU offload; host memory is pinned only where a GPU copies from it."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    if isinstance(plugin.cpu_offload, CPUOffloadPolicy) and kind.type == "cpu":
        return CPUOffloadPolicy(pin_memory=False)
    return plugin.cpu_offload


def wrap_policy(plugin, model):
    """`module -> bool` for the layer classes named in fsdp_transformer_layer_cls_to_wrap (Accelerate's
    own lookup, which raises when the model has no such class)."""
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    return fsdp2_prepare_auto_wrap_policy(plugin, model)


def checkpoint_layers(model, is_layer) -> None:
    """Full activation checkpointing: each decoder layer keeps only its input for the backward."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    wrapper = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, check_fn=is_layer)


def apply_fsdp2(model, settings: LaunchedSettings, kind):
    """fully_shard each decoder layer, then the root (embedding, final norm, lm_head), on a
    (replicate, shard) mesh: 1-D FSDP when nothing replicates, 2-D HSDP otherwise. With tensor or
    context parallelism, on Accelerate's N-D mesh instead (returned; None otherwise)."""
    from torch.distributed.fsdp import fully_shard

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
    options = dict(
        mesh=fsdp_mesh,
        mp_policy=fsdp2_mixed_precision(settings.precision),
        offload_policy=offload_policy(plugin, kind),
    )
    for layer in outermost(model, is_layer):
        fully_shard(layer, reshard_after_forward=plugin.reshard_after_forward, **options)
    fully_shard(model, **options)  # root: torch keeps it gathered after forward (used first in backward)
    return model, mesh


def data_parallel_mesh(settings: LaunchedSettings, kind):
    from torch.distributed.device_mesh import init_device_mesh

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
    from transformers.distributed import DistributedConfig

    tp_plan, _, _ = model._resolve_parallel_plans(DistributedConfig(tp_size=tp, tp_plan="auto"))
    return tp_plan


def apply_tensor_parallel(model, tp_mesh, tp: int) -> None:
    """Shard in place on the `tp` mesh dim. Every rank built the same seeded weights, so each keeps its
    own slice (src_data_rank=None in transformers' styles: no broadcast)."""
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    apply_tensor_parallelism(model, tp_mesh, tensor_parallel_plan(model, tp))


def attach_context_parallel_hooks(model) -> None:
    """Accelerate's own hooks (Accelerator._prepare_cp): attention runs causal without a mask, which ring
    attention needs; models with sliding-window layers are refused there."""
    from accelerate.big_modeling import _attach_context_parallel_hooks

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
    from torch.distributed.fsdp import FullyShardedDataParallel

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


def torch_device(kind):
    from harness.runtime.device import torch_device as device_of

    return device_of(kind)


class FsdpSession:
    """One FSDP-wrapped model and its AdamW on one rank: a training step and the bytes it holds."""

    def __init__(self, model, optimizer, settings: LaunchedSettings, cfg: RunConfig, kind, mesh=None):
        import torch.distributed as dist

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
        from torch.distributed.fsdp import ShardingStrategy

        if self.settings.plugin.sharding_strategy == ShardingStrategy.NO_SHARD and not last:
            return self.model.no_sync()
        return contextlib.nullcontext()

    def _clip_gradients(self) -> None:
        import torch.distributed as dist

        from harness.engines.grad_norm import clip_grad_norm

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
        import torch

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
        """Forward and backward of one micro-batch with its sequence split over the `cp` ranks
        (load-balanced causal chunks, torch's context_parallel as Accelerate's maybe_context_parallel).

        Each rank's loss is its labelled tokens' summed cross-entropy over the micro-batch's mean count per
        cp rank, so FSDP's gradient mean over dp_shard x cp is the exact micro-batch mean; the returned
        loss is that mean, on every rank.
        """
        import torch.distributed as dist
        import torch.nn.functional as F
        from torch.distributed.tensor.experimental import context_parallel

        cp_mesh, cp = self.mesh["cp"], self.settings.cp
        labels, positions = context_parallel_buffers(tokens)
        count = (labels != IGNORE_INDEX).sum()
        buffers = [tokens, labels, positions]
        with context_parallel(cp_mesh, buffers=buffers, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(buffers)):
            logits = self.model(input_ids=tokens, position_ids=positions).logits
            summed = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX,
                                     reduction="sum")  # fmt: skip
            loss = summed * cp / count
            (loss / n_micro).backward()
        value = local_shard(loss).detach().float()
        dist.all_reduce(value, group=cp_mesh.get_group())
        return value / cp

    def state_bytes(self) -> Dict[str, int]:
        return fsdp_state_bytes(self.model, self.optimizer, self.settings.offload)



def context_parallel_buffers(tokens):
    """(labels, position ids) for a sequence split across ranks: labels are shifted before the split (the
    model's own shift would pair tokens across chunk borders), positions are global."""
    import torch

    labels = torch.full_like(tokens, IGNORE_INDEX)
    labels[:, :-1] = tokens[:, 1:]
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens).contiguous()
    return labels, positions


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
    import torch

    from harness.runtime.meter import sum_tensor_bytes

    params = list(model.parameters())
    moments = [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v) and v.dim() > 0]
    # Local shards, not the DTensors: a DTensor's data_ptr() is 0, so the meter's de-duplication by
    # address would merge distinct DTensors of equal shape.
    state = {
        "param_bytes": sum_tensor_bytes(map(local_shard, params)),
        "grad_bytes": sum_tensor_bytes(local_shard(p.grad) for p in params),
        "optimizer_bytes": sum_tensor_bytes(map(local_shard, moments)),
        "host_bytes": 0,
    }
    if offload:
        state["host_bytes"] = state["param_bytes"] + state["grad_bytes"] + state["optimizer_bytes"]
        state.update(param_bytes=0, grad_bytes=0, optimizer_bytes=0)
    return state


def local_shard(tensor):
    """The tensor this rank stores: a DTensor's local shard, any other tensor itself."""
    return getattr(tensor, "_local_tensor", tensor)


def init_process_group(kind, settings: LaunchedSettings) -> None:
    import torch.distributed as dist

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
    import torch

    settings = launched_settings(int(os.environ["WORLD_SIZE"]))
    if settings.multi_dim and kind.type != "cuda":
        raise RuntimeError(
            f"tp={settings.tp}, cp={settings.cp} on device {kind.type}: engine=fsdp runs Accelerate's "
            "ParallelismConfig on GPU only (engine=nd runs tensor parallelism on CPU)"
        )
    init_process_group(kind, settings)
    mesh = None
    if settings.version == 2:
        model, mesh = apply_fsdp2(model, settings, kind)
    else:
        model = apply_fsdp1(model, settings, kind)
    if settings.cp > 1:
        set_rotate_method(settings.parallelism.cp_handler.cp_comm_strategy)
    bench = cfg.bench
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=bench.lr, betas=ADAMW_BETAS, eps=ADAMW_EPS, weight_decay=bench.weight_decay
    )
    return FsdpSession(model, optimizer, settings, cfg, kind, mesh)


def set_rotate_method(strategy: str) -> None:
    """How ring attention passes key/value chunks between cp ranks, as Accelerator._prepare_cp sets it."""
    from torch.distributed.tensor.experimental._attention import set_rotate_method as set_method

    set_method(strategy)


def check(cfg: RunConfig) -> Tuple[List[str], List[str]]:
    """(errors, warnings) for running this config with engine=fsdp (the engine contract's name)."""
    return layout_problems(cfg), []
