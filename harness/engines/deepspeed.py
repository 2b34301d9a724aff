"""DeepSpeed: ZeRO 0-3, CPU/NVMe offload and AutoTP from the layout (`render`), and the engine (`apply`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

from harness.config.schema import RunConfig
from harness.engines.rendered import RenderedRun, render_launch

CONFIG_FILE = "ds_config.json"
# Top-level keys this renderer writes; DeepSpeed silently ignores unknown ones, so we check ourselves.
KNOWN_TOP_LEVEL_KEYS = frozenset(
    {
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "gradient_clipping", "bf16", "fp16", "zero_optimization", "optimizer", "tensor_parallel",
        "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    }
)  # fmt: skip


def data_parallel_size(cfg: RunConfig) -> int:
    layout = cfg.layout
    return layout.dp_replicate * layout.dp_shard


def ds_config(cfg: RunConfig) -> Dict[str, Any]:
    """A concrete DeepSpeed config (no "auto" values: DeepSpeed's own validator cannot evaluate them)."""
    layout, bench, engine = cfg.layout, cfg.bench, cfg.engine
    zero: Dict[str, Any] = {"stage": layout.zero_stage}
    if layout.zero_stage >= 2:
        zero.update(contiguous_gradients=True, overlap_comm=cfg.cluster.accelerator != "cpu")
    on_gpu = cfg.cluster.accelerator != "cpu"
    for key, target in (("offload_optimizer", layout.offload_optimizer), ("offload_param", layout.offload_params)):
        if target != "none":
            zero[key] = {"device": target, "pin_memory": on_gpu}
            if target == "nvme":
                zero[key]["nvme_path"] = layout.nvme_path
    optimizer_params = {
        "lr": bench.lr,
        "betas": [0.9, 0.95],
        "eps": 1e-8,
        "weight_decay": bench.weight_decay,
    }
    if not engine.compiled_ops:
        optimizer_params["torch_adam"] = True  # plain torch AdamW: no JIT-compiled FusedAdam / CPUAdam
    # Without an mpu, DeepSpeed's batch check counts every rank, AutoTP ranks included, although
    # the ranks of one TP group share their batch (deepspeed.initialize builds its config that way).
    ranks_in_batch_check = data_parallel_size(cfg) * layout.tp
    config: Dict[str, Any] = {
        "train_batch_size": layout.micro_batch * layout.grad_accum * ranks_in_batch_check,
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
    unknown = set(config) - KNOWN_TOP_LEVEL_KEYS
    assert not unknown, f"renderer wrote unknown DeepSpeed keys {sorted(unknown)}"
    return config


def check(cfg: RunConfig) -> Tuple[List[str], List[str]]:
    """(errors, warnings) for engine=deepspeed beyond the planner's support table."""
    errors = []
    if cfg.layout.pp > 1:
        errors.append(f"layout.pp={cfg.layout.pp}: engine=deepspeed runs without DeepSpeed's PipelineModule "
                      "here; pipeline parallelism is engine=nd's (torch.distributed.pipelining)")
    return errors, []


def render(cfg: RunConfig, run_dir: Path) -> RenderedRun:
    run_dir = Path(run_dir)
    (run_dir / CONFIG_FILE).write_text(json.dumps(ds_config(cfg), indent=2) + "\n")
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
        param_bytes = sum_tensor_bytes(p.ds_tensor for p in params)
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


def apply(cfg: RunConfig, run_dir: Path, model, kind) -> DeepSpeedSession:
    import deepspeed

    if not cfg.engine.compiled_ops:
        # Skip the JIT-built shared-memory collective op: gloo does the work without a compile.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend=kind.backend)
    config = json.loads((Path(run_dir) / CONFIG_FILE).read_text())
    if cfg.layout.activation_checkpointing == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return DeepSpeedSession(engine, cfg)
