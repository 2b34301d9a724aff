"""FSDP through Accelerate: `accelerate.yaml` from the layout (`render`), FSDP2 or FSDP1 on every rank (`apply`).

The rendered YAML is the single source of truth. `accelerate launch --config_file` turns it into the
`FSDP_*`, `PARALLELISM_CONFIG_*` and `ACCELERATE_MIXED_PRECISION` environment of every rank, and `apply`
reads that environment back through Accelerate's own `FullyShardedDataParallelPlugin` and
`ParallelismConfig`. The sharding itself is applied here with torch (`fully_shard` / FSDP1), on CPU and
GPU alike: an `Accelerator` on CPU stays `MULTI_CPU` and is never promoted to FSDP, so preparing the
model through it silently trains plain DDP (see ../shared/MEASURED.md). One code path for both devices
means the CPU integration tests exercise what a GPU cluster runs.
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

CONFIG_FILE = "accelerate.yaml"
# layout.zero_stage -> FSDP1 sharding strategy (FSDP2 spells the same as reshard_after_forward + mesh).
FSDP1_STRATEGIES = {3: "FULL_SHARD", 2: "SHARD_GRAD_OP", 0: "NO_SHARD"}
# layout.precision -> Accelerate's `mixed_precision` (fp32 is "no": no mixed precision policy at all).
ACCELERATE_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}
# Same optimizer as the deepspeed engine, so that engines compare on equal terms.
ADAMW_BETAS, ADAMW_EPS = (0.9, 0.95), 1e-8
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
    world = cluster.nodes * cluster.accelerators_per_node
    if layout.dp_replicate * layout.dp_shard != world:
        problems.append(
            f"layout.dp_replicate={layout.dp_replicate} x dp_shard={layout.dp_shard} must equal the {world} "
            f"ranks of cluster.nodes={cluster.nodes} x accelerators_per_node={cluster.accelerators_per_node}"
        )
    return problems


def _sharding_problems(cfg: RunConfig) -> List[str]:
    layout, engine = cfg.layout, cfg.engine
    problems = []
    if layout.zero_stage not in FSDP1_STRATEGIES:
        problems.append(
            f"layout.zero_stage={layout.zero_stage}: FSDP has no optimizer-only sharding level "
            "(0 NO_SHARD, 2 SHARD_GRAD_OP, 3 FULL_SHARD; ZeRO-1 is engine=deepspeed)"
        )
    for axis in ("tp", "cp", "pp", "ep"):
        if getattr(layout, axis) != 1:
            problems.append(
                f"layout.{axis}={getattr(layout, axis)}: engine=fsdp shards the data axis only "
                "(tensor, context, pipeline and expert parallelism are engine=nd)"
            )
    if engine.fsdp_version == 1 and layout.dp_replicate > 1 and layout.zero_stage != 0:
        problems.append(
            f"layout.dp_replicate={layout.dp_replicate} with engine.fsdp_version=1: FSDP1 HYBRID_SHARD "
            "does not keep its replicas in sync on gloo (measured), hybrid sharding is fsdp_version=2"
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
        # Accelerate accepts a ParallelismConfig with FSDP2 only; its mesh is (dp_replicate, dp_shard).
        replicate, shard = mesh_shape(cfg)
        config["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": replicate,
            "parallelism_config_dp_shard_size": shard,
            "parallelism_config_tp_size": 1,
            "parallelism_config_cp_size": 1,
        }
    return config


def render(cfg: RunConfig, run_dir: Path) -> RenderedRun:
    problems = layout_problems(cfg)
    if problems:
        raise ValueError("engine=fsdp cannot run this layout:\n  - " + "\n  - ".join(problems))
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    path.write_text(yaml.safe_dump(accelerate_config(cfg), sort_keys=False))
    return render_launch(cfg, run_dir, "accelerate", [CONFIG_FILE], extra=["--config_file", str(path)])


# --------------------------------------------------------------------------------------------- runtime


@dataclass(frozen=True)
class LaunchedSettings:
    """accelerate.yaml as the launcher handed it to this rank, parsed by Accelerate's own classes."""

    plugin: Any  # accelerate.utils.FullyShardedDataParallelPlugin
    precision: str  # ACCELERATE_MIXED_PRECISION: "bf16", "fp16" or "no"
    replicate: int  # FSDP2 mesh; FSDP1 shards over the whole world
    shard: int

    @property
    def version(self) -> int:
        return self.plugin.fsdp_version

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
    if plugin.fsdp_version == 2:
        mesh = ParallelismConfig()
        replicate, shard = mesh.dp_replicate_size, mesh.dp_shard_size
    else:
        replicate, shard = 1, world_size
    if replicate * shard != world_size:
        raise RuntimeError(
            f"accelerate.yaml gives a dp_replicate={replicate} x dp_shard={shard} mesh for {world_size} ranks"
        )
    return LaunchedSettings(plugin, os.environ.get("ACCELERATE_MIXED_PRECISION", "no"), replicate, shard)


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
    (replicate, shard) mesh: 1-D FSDP when nothing replicates, 2-D HSDP otherwise."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    plugin = settings.plugin
    is_layer = wrap_policy(plugin, model)
    if plugin.activation_checkpointing:
        checkpoint_layers(model, is_layer)  # before sharding, as Accelerate does for FSDP2
    if settings.replicate > 1:
        shape, names = (settings.replicate, settings.shard), ("dp_replicate", "dp_shard")
    else:
        shape, names = (settings.shard,), ("dp_shard",)
    options = dict(
        mesh=init_device_mesh(kind.type, shape, mesh_dim_names=names),
        mp_policy=fsdp2_mixed_precision(settings.precision),
        offload_policy=offload_policy(plugin, kind),
    )
    for layer in outermost(model, is_layer):
        fully_shard(layer, reshard_after_forward=plugin.reshard_after_forward, **options)
    fully_shard(model, **options)  # root: torch keeps it gathered after forward (used first in backward)
    return model


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

    def __init__(self, model, optimizer, settings: LaunchedSettings, cfg: RunConfig, kind):
        import torch.distributed as dist

        self.model, self.optimizer, self.settings, self.cfg = model, optimizer, settings, cfg
        self.device = torch_device(kind)
        # Data parallelism is the only axis: every rank reads its own batch.
        self.dp_rank, self.dp_size = dist.get_rank(), dist.get_world_size()

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
        import torch

        max_norm = self.cfg.bench.grad_clip
        if not max_norm or max_norm <= 0:
            return
        if self.settings.version == 1:
            self.model.clip_grad_norm_(max_norm)
            return
        # DTensor gradients: the norm of the local shards is a partial result; full_tensor() reduces it.
        params = [p for p in self.model.parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0)
        if hasattr(total, "full_tensor"):
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)

    def train_step(self, micro_batches, on_boundary=None):
        """One optimizer step; `on_boundary` runs after the last backward, before clipping and the step."""
        import torch

        batches = list(micro_batches)
        losses = []
        for index, tokens in enumerate(batches):
            tokens = tokens.to(self.device)
            with self._gradient_sync(index == len(batches) - 1):
                loss = self.model(input_ids=tokens, labels=tokens).loss
                (loss / len(batches)).backward()
            losses.append(loss.detach().float())
        if on_boundary is not None:
            on_boundary()
        self._clip_gradients()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return torch.stack(losses).mean()

    def state_bytes(self) -> Dict[str, int]:
        return fsdp_state_bytes(self.model, self.optimizer, self.settings.offload)


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
    init_process_group(kind, settings)
    if settings.version == 2:
        model = apply_fsdp2(model, settings, kind)
    else:
        model = apply_fsdp1(model, settings, kind)
    bench = cfg.bench
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=bench.lr, betas=ADAMW_BETAS, eps=ADAMW_EPS, weight_decay=bench.weight_decay
    )
    return FsdpSession(model, optimizer, settings, cfg, kind)


def check(cfg: RunConfig) -> Tuple[List[str], List[str]]:
    """(errors, warnings) for running this config with engine=fsdp (the engine contract's name)."""
    return layout_problems(cfg), []
