"""FSDP through Accelerate, launch side: `accelerate.yaml` from the layout (`render`) and the layouts it refuses
(`check`); FSDP2 or FSDP1 on every rank is harness.engines.fsdp_session (`apply`).

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

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from harness.config.model_shape import model_shape, wrapped_layer
from harness.config.schema import RunConfig
from harness.engines.rendered import RenderedRun, render_launch
from harness.plan.parallel_dims import ParallelDims
from harness.plan.validate import support_problems
from harness.rundir import ACCELERATE_CONFIG_FILE, write_text

CONFIG_FILE = ACCELERATE_CONFIG_FILE
# layout.zero_stage -> FSDP1 sharding strategy (FSDP2 spells the same as reshard_after_forward + mesh).
FSDP1_STRATEGIES = {3: "FULL_SHARD", 2: "SHARD_GRAD_OP", 0: "NO_SHARD"}
# layout.precision -> Accelerate's `mixed_precision` (fp32 is "no": no mixed precision policy at all).
# fp8 is Accelerate's torchao backend (`fp8_config: {backend: AO}`): float8 linears, bf16 elsewhere.
ACCELERATE_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no", "fp8": "fp8"}
# Ring-attention rotation Accelerate sets for context parallelism (its launcher's default).
CP_COMM_STRATEGY = "allgather"
# Every fsdp_config key the renderer may write; each is an `accelerate launch --<key>` argument (tested).
FSDP_KEYS = frozenset(
    {
        "fsdp_version", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap", "fsdp_offload_params",
        "fsdp_activation_checkpointing", "fsdp_cpu_ram_efficient_loading", "fsdp_state_dict_type",
        "fsdp_reshard_after_forward", "fsdp_sharding_strategy", "fsdp_sync_module_states",
        "fsdp_use_orig_params", "fsdp_forward_prefetch", "fsdp_backward_prefetch",
    }
)  # fmt: skip


def layout_problems(cfg: RunConfig) -> List[str]:
    """What this engine cannot do with the layout, one message per field (empty: renderable): the support
    table's rules (harness.plan.support, through harness.plan.validate), then the rules only FSDP has."""
    return [*support_problems(cfg), *_launch_problems(cfg), *_sharding_problems(cfg), *_offload_problems(cfg),
            *_compute_problems(cfg)]


def _launch_problems(cfg: RunConfig) -> List[str]:
    engine, layout, cluster = cfg.engine, cfg.layout, cfg.cluster
    problems = []
    if engine.launcher != "accelerate":
        problems.append(
            f"engine.launcher={engine.launcher!r}: engine=fsdp is started by `accelerate launch`, whose "
            "environment carries accelerate.yaml to the ranks (use engine.launcher=accelerate)"
        )
    problems += ParallelDims.of(layout).world_problems(cluster.nodes, cluster.accelerators_per_node)[0]
    return problems


def _sharding_problems(cfg: RunConfig) -> List[str]:
    """FSDP1 hybrid sharding on gloo, a family without transformers' TP plan, and Accelerate's ParallelismConfig
    rules for tp / cp (parallelism_config.py); zero stages, pp / ep, GPU-only axes and FSDP2-only tp / cp are the
    table's."""
    layout, engine = cfg.layout, cfg.engine
    problems = []
    if engine.fsdp_version == 1 and layout.dp_replicate > 1 and layout.zero_stage != 0:
        problems.append(
            f"layout.dp_replicate={layout.dp_replicate} with engine.fsdp_version=1: FSDP1 HYBRID_SHARD "
            "does not keep its replicas in sync on gloo (measured), hybrid sharding is fsdp_version=2"
        )
    if layout.tp > 1 and model_shape(cfg.model.hf_config)["tp_plan_source"] != "transformers":
        model_type = cfg.model.hf_config.get("model_type")
        problems.append(
            f"layout.tp={layout.tp} with engine=fsdp: transformers gives model_type={model_type!r} no "
            "base_model_tp_plan, and Accelerate's tensor parallelism applies transformers' own plan "
            "(fsdp_session.tensor_parallel_plan); engine=nd carries the harness's plan where it has one"
        )
    axes = [f"layout.{axis}={getattr(layout, axis)}" for axis in ("tp", "cp") if getattr(layout, axis) > 1]
    if not axes:
        return problems
    named = " and ".join(axes)
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
    """FSDP1's pinned offload; offload targets, stages and the one-switch rule are the table's."""
    if offloaded(cfg) and cfg.engine.fsdp_version == 1 and cfg.cluster.accelerator == "cpu":
        return [
            "cpu offload with engine.fsdp_version=1 on cluster.accelerator='cpu': FSDP1 always pins the "
            "offloaded shards, which needs a GPU (fsdp_version=2 offloads with pin_memory=False)"
        ]
    return []


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
    """The decoder-layer class FSDP wraps and checkpoints, from the model's cached shape (the model built on the
    meta device once per config; rendering imports neither torch nor transformers)."""
    return wrapped_layer(model_shape(hf_config))


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
            fsdp_backward_prefetch=cfg.engine.backward_prefetch.value,
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
        "num_processes": cluster.ranks,
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
    if cfg.layout.precision == "fp8":
        config["fp8_config"] = {"backend": "AO"}
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


def model_problems(cfg: RunConfig) -> List[str]:
    """None: engine=fsdp wraps whatever transformers builds."""
    return []


def check(cfg: RunConfig) -> Tuple[List[str], List[str]]:
    """(errors, warnings) for running this config with engine=fsdp."""
    return layout_problems(cfg), []
