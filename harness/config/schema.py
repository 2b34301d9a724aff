"""Typed schema of one run: the dataclasses behind every Hydra config group (no Hydra, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

# Allowed values of the string-valued enums; checked by `harness.config.checks`.
ENGINES = ("deepspeed", "fsdp", "nd", "megatron_lm")
LAUNCHERS = ("torchrun", "deepspeed", "accelerate")
PRECISIONS = ("bf16", "fp16", "fp32")
OFFLOAD_TARGETS = ("none", "cpu", "nvme")
CHECKPOINTING = ("none", "selective", "full")
PP_SCHEDULES = (
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)
DATA_KINDS = ("synthetic", "text")
TRACKING_BACKENDS = ("wandb", "disabled")
TRACKING_MODES = ("offline", "online")
LAUNCH_BACKENDS = ("local", "slurm")
FLOP_ATTENTION = ("causal", "full")
MODEL_INITS = ("auto", "full", "meta")


@dataclass
class ModelConfig:
    """A Hugging Face model shape: config fields only, never weights."""

    name: str = "tiny_llama"
    # Fields of a transformers config (`model_type` plus its keys); the model is built from these.
    hf_config: Dict[str, Any] = field(default_factory=dict)
    # Optional hub id: its config is fetched where the hub is reachable and overrides `hf_config`.
    hub_id: Optional[str] = None
    # How ranks build the model: `full` (every weight on every rank, then the engine shards: the same
    # weights in every layout), `meta` (on the meta device; each rank materialises and initialises only
    # what it holds), `auto` (meta where the engine supports it and full copies would crowd host memory).
    init: str = "auto"


@dataclass
class EngineConfig:
    """Which backend turns the layout into a training setup, and how it is launched."""

    name: str = "deepspeed"
    launcher: str = "torchrun"
    # fsdp: FSDP2 (fully_shard) by default; 1 selects FSDP1 (FullyShardedDataParallel).
    fsdp_version: int = 2
    # deepspeed: False avoids JIT-built ops (torch Adam, no shared-memory comm) so CPU runs start fast.
    compiled_ops: bool = False
    # nd: sequence parallel and loss parallel on the tensor-parallel axis.
    sequence_parallel: bool = False
    loss_parallel: bool = False


@dataclass
class LayoutConfig:
    """The parallel layout and the per-step batch shape (one point of a sweep)."""

    name: str = "dp2"
    dp_replicate: int = 1
    dp_shard: int = 2
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    # Sharding level shared by every engine: 0 none, 1 optimizer, 2 +gradients, 3 +parameters.
    zero_stage: int = 2
    pp_schedule: str = "1F1B"
    pp_virtual_stages: int = 1
    # Explicit layers per pipeline stage (uneven splits); empty = even split.
    pp_stage_layers: List[int] = field(default_factory=list)
    offload_optimizer: str = "none"
    offload_params: str = "none"
    nvme_path: Optional[str] = None
    micro_batch: int = 1
    grad_accum: int = 1
    seq_len: int = 64
    activation_checkpointing: str = "none"
    precision: str = "bf16"


@dataclass
class ClusterConfig:
    """Where the run executes: nodes, accelerators per node, and what one accelerator is."""

    name: str = "cpu"
    nodes: int = 1
    # Processes per node; on `cpu` these are CPU processes.
    accelerators_per_node: int = 2
    # Key of the peak-FLOP/s table in `harness.plan.peak` (or `cpu`, whose peak is measured).
    accelerator: str = "cpu"
    # Device memory per accelerator; None takes the table's figure.
    memory_per_accelerator_gib: Optional[float] = None
    host_memory_gib: float = 24.0
    # Head-room the planner adds to predicted bytes: a fraction (fragmentation, buckets, workspace)
    # and a fixed amount per rank (CUDA context, NCCL); None takes the planner's default.
    memory_allowance_fraction: Optional[float] = None
    memory_allowance_fixed_gib: Optional[float] = None
    intra_node_gbps: float = 0.0
    inter_node_gbps: float = 0.0


@dataclass
class DataConfig:
    """Token batches: seeded synthetic tokens, or a local text file tokenised through `datasets`."""

    kind: str = "synthetic"
    path: Optional[str] = None
    text_column: str = "text"
    seed: int = 1234


@dataclass
class TrackingConfig:
    """Experiment tracking; W&B offline unless the user chooses online (and holds a key)."""

    backend: str = "wandb"
    mode: str = "offline"
    project: str = "harness"
    entity: Optional[str] = None
    # Seconds wandb may spend reaching a server before the run goes on without it.
    init_timeout_s: int = 30


@dataclass
class LauncherConfig:
    """Local subprocess or Slurm; the Slurm fields are only read by the Slurm launcher."""

    backend: str = "local"
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time_limit: str = "00:30:00"
    constraint: Optional[str] = None
    exclusive: bool = False
    gpus_per_node_gres: Optional[str] = None
    extra_sbatch: List[str] = field(default_factory=list)
    env_setup: List[str] = field(default_factory=list)
    array_concurrency: int = 8
    # Per-run wall-clock limit of a local launch, seconds.
    timeout_s: int = 1800


@dataclass
class BenchConfig:
    """The timed loop every rank runs."""

    warmup_steps: int = 2
    steps: int = 5
    seed: int = 0
    lr: float = 1e-3
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    # FLOP convention of the reported MFU: attention `causal` (halved) or `full` (PaLM appendix B).
    flop_attention: str = "causal"
    flop_include_lm_head: bool = True


@dataclass
class RunConfig:
    """Everything one benchmark run needs; `recipes/` and the command line only override it."""

    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    # Sweep name: the folder under `results/` and the W&B group.
    sweep_name: str = "adhoc"
    results_dir: str = "results"
