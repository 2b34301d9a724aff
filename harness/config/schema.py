"""Typed schema of one run: the dataclasses behind every Hydra config group (no Hydra, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Dict, List, Optional, Tuple, Type

class Choice(StrEnum):
    """A closed set of string values; members are their values in comparisons, f-strings, JSON and repr."""

    def __repr__(self) -> str:
        return repr(self.value)


class EngineName(Choice):
    """Backends that turn a layout into a training setup (one `hydra_configs/engine/` option each)."""

    deepspeed = "deepspeed"
    fsdp = "fsdp"
    nd = "nd"
    megatron_lm = "megatron_lm"


class Launcher(Choice):
    """The per-node command that starts the ranks."""

    torchrun = "torchrun"
    deepspeed = "deepspeed"
    accelerate = "accelerate"


class Precision(Choice):
    """Training precision; fp8 runs the decoder layers' linear projections in FP8 and everything else in bf16."""

    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"
    fp8 = "fp8"


# torch._scaled_mm (cuBLASLt FP8) needs every GEMM dimension divisible by 16 (torchao's float8 README: "the
# dimensions of the linear layers must be divisible by 16"): the planner's FP8 rule (harness.plan.regime) and
# the width of an FP8 stand-in's tiny model (harness.config.standin) read it.
FP8_DIM_MULTIPLE = 16


class BackwardPrefetch(Choice):
    """When FSDP1 issues the all-gather of the unit whose backward comes next (torch.distributed.fsdp.BackwardPrefetch,
    Accelerate's fsdp_backward_prefetch): before the current unit's gradient computation (it hides behind it), after
    it (ahead of the current reduce-scatter on the one NCCL stream, so the next unit waits for it), or when the next
    unit's backward starts (behind the current reduce-scatter)."""

    BACKWARD_PRE = "BACKWARD_PRE"
    BACKWARD_POST = "BACKWARD_POST"
    NO_PREFETCH = "NO_PREFETCH"


class OffloadTarget(Choice):
    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class Checkpointing(Choice):
    """Activation checkpointing: nothing, the attention core only, or every block."""

    none = "none"
    selective = "selective"
    full = "full"


# OmegaConf reads an enum value from the command line by member name, so every name equals its value;
# schedule names start with digits, hence the functional form. torch.distributed.pipelining names.
PipelineSchedule = Choice("PipelineSchedule", [(name, name) for name in (
    "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")])
PipelineSchedule.__doc__ = "Pipeline schedules of torch.distributed.pipelining."
PipelineSchedule.__module__ = __name__


class DataKind(Choice):
    synthetic = "synthetic"
    text = "text"


class TrackingBackend(Choice):
    wandb = "wandb"
    disabled = "disabled"


class TrackingMode(Choice):
    offline = "offline"
    online = "online"


class LaunchBackend(Choice):
    local = "local"
    slurm = "slurm"


class NcclDebug(Choice):
    """NCCL_DEBUG levels (NCCL's environment variables documentation)."""

    VERSION = "VERSION"
    WARN = "WARN"
    INFO = "INFO"
    TRACE = "TRACE"


class FlopAttention(Choice):
    """Attention FLOPs of the MFU convention: the causal half, or the full T x T matrix (PaLM)."""

    causal = "causal"
    full = "full"


class ModelInit(Choice):
    auto = "auto"
    full = "full"
    meta = "meta"


class FsdpShardingStrategy(Choice):
    """FSDP1 sharding strategies (torch.distributed.fsdp.ShardingStrategy names)."""

    FULL_SHARD = "FULL_SHARD"
    SHARD_GRAD_OP = "SHARD_GRAD_OP"
    NO_SHARD = "NO_SHARD"
    HYBRID_SHARD = "HYBRID_SHARD"


class AttentionKernel(Choice):
    """Fused attention kernel generations the time model has measured rates for (harness.plan.hardware,
    ATTENTION_KERNEL_RATES): FlashAttention-2, the kernel of torch SDPA and flash-attn 2 (the default),
    FlashAttention v1 (flash-attn 1.x) and its Triton port (flash-attn's flash_attn_triton.py, MPT's
    attn_impl=triton), which older software stacks ran; and FlashAttention-2's variable-length kernel behind
    flash-attn's bert_padding unpad / pad, as MPT's attn_impl=flash calls it (every call, padded or not)."""

    flash_attention_2 = "flash_attention_2"
    flash_attention_1 = "flash_attention_1"
    flash_attention_1_triton = "flash_attention_1_triton"
    flash_attention_2_unpadded = "flash_attention_2_unpadded"


DEFAULT_ATTENTION_KERNEL = AttentionKernel.flash_attention_2


def allowed(enum: Type[Enum]) -> Tuple[Any, ...]:
    """The allowed values of a closed set, in declaration order (for messages and tables)."""
    return tuple(member.value for member in enum)


# Closed integer sets (OmegaConf has no integer enums on the command line): checked by harness.config.checks.
ZERO_STAGES = (0, 1, 2, 3)
FSDP_VERSIONS = (1, 2)

# The value tuples older call sites read, derived from the enums (never written out twice).
ENGINES = allowed(EngineName)
LAUNCHERS = allowed(Launcher)
PRECISIONS = allowed(Precision)
OFFLOAD_TARGETS = allowed(OffloadTarget)
CHECKPOINTING = allowed(Checkpointing)
PP_SCHEDULES = allowed(PipelineSchedule)
DATA_KINDS = allowed(DataKind)
TRACKING_BACKENDS = allowed(TrackingBackend)
TRACKING_MODES = allowed(TrackingMode)
LAUNCH_BACKENDS = allowed(LaunchBackend)
FLOP_ATTENTION = allowed(FlopAttention)
MODEL_INITS = allowed(ModelInit)


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
    init: ModelInit = ModelInit.auto
    # The sequence length the model was pre-trained at (its report; each preset cites it): what a layout
    # that leaves `layout.seq_len` unset takes on accelerators (harness.config.fill).
    train_seq_len: Optional[int] = None


@dataclass
class EngineConfig:
    """Which backend turns the layout into a training setup, and how it is launched.

    Each engine's options live in its own subclass below, selected by the `engine` config group, so an
    option of another engine fails at composition. Planner rules shared by every engine read some options
    of one engine on any engine (`engine.fsdp_version` beside `engine.name`): on an engine without the
    option these properties give the value that leaves the rule inert.
    """

    name: EngineName = EngineName.deepspeed
    launcher: Launcher = Launcher.torchrun
    # torch.compile (inductor): nd and fsdp compile each decoder layer after tensor parallelism and activation
    # checkpointing, before FSDP2 shards it (as torchtitan does); deepspeed writes its `compile` section and
    # calls the engine's own compile(). Every engine reads it, so an engine without it refuses it at plan time.
    compile: bool = False

    @property
    def fsdp_version(self) -> int:
        return 2

    @property
    def compiled_ops(self) -> bool:
        return False

    @property
    def sequence_parallel(self) -> bool:
        return False

    @property
    def loss_parallel(self) -> bool:
        return False

    @property
    def grad_reduce_in_bf16(self) -> bool:
        return False

    @property
    def backward_prefetch(self) -> BackwardPrefetch:
        return BackwardPrefetch.BACKWARD_PRE


@dataclass
class DeepSpeedOptions(EngineConfig):
    # False avoids JIT-built ops (torch Adam, no shared-memory comm) so CPU runs start fast.
    compiled_ops: bool = False


@dataclass
class FsdpOptions(EngineConfig):
    name: EngineName = EngineName.fsdp
    launcher: Launcher = Launcher.accelerate
    # FSDP2 (fully_shard) by default; 1 selects FSDP1 (FullyShardedDataParallel).
    fsdp_version: int = 2
    # FSDP1's backward prefetch; FSDP2 always gathers the next unit before the current unit's backward, as
    # BACKWARD_PRE does (harness.config.checks refuses another value with fsdp_version 2).
    backward_prefetch: BackwardPrefetch = BackwardPrefetch.BACKWARD_PRE


@dataclass
class NdOptions(EngineConfig):
    name: EngineName = EngineName.nd
    # Sequence parallel and loss parallel on the tensor-parallel axis.
    sequence_parallel: bool = False
    loss_parallel: bool = False


@dataclass
class MegatronOptions(EngineConfig):
    name: EngineName = EngineName.megatron_lm
    # Megatron's --sequence-parallel on the tensor-parallel axis.
    sequence_parallel: bool = False
    # Megatron's --grad-reduce-in-bf16 (bf16 / fp8 runs): gradients accumulated and reduced in bf16, 2 bytes a
    # parameter where Megatron-LM's default keeps fp32 main gradients (4); NeMo's and Megatron-Bridge's performance
    # recipes run with it (grad_reduce_in_fp32=False).
    grad_reduce_in_bf16: bool = False


# The option dataclass of each engine; the `engine` group's files select theirs by this name.
ENGINE_OPTIONS: Dict[EngineName, Type[EngineConfig]] = {
    EngineName.deepspeed: DeepSpeedOptions,
    EngineName.fsdp: FsdpOptions,
    EngineName.nd: NdOptions,
    EngineName.megatron_lm: MegatronOptions,
}


# The ZeRO stage an open layout.zero_stage takes on accelerators (harness.config.fill): each engine's most sharded
# one, which harness.plan.support admits (tests/unit/config/test_fill.py holds them together): ZeRO-3, but the
# Megatron-LM export shards only the optimizer (--use-distributed-optimizer, zero_stage 1).
SHARDED_ZERO_STAGE: Dict[str, int] = {EngineName.megatron_lm.value: 1}


def sharded_zero_stage(engine: str) -> int:
    return SHARDED_ZERO_STAGE.get(str(getattr(engine, "value", engine)), 3)


def engine_config(name: str = EngineName.deepspeed.value, **options: Any) -> EngineConfig:
    """The option dataclass of engine `name` holding `options` (the base class for an unknown name)."""
    return ENGINE_OPTIONS.get(name, EngineConfig)(name=name, **options)


@dataclass
class LayoutConfig:
    """The parallel layout and the per-step batch shape (one point of a sweep).

    `name`, `dp_shard`, `zero_stage`, `micro_batch`, `seq_len` and `activation_checkpointing` may be null (the `default` layout preset leaves them so):
    harness.config.fill fills them from the cluster and the model before anything reads them."""

    name: Optional[str] = "dp2"
    dp_replicate: int = 1
    dp_shard: Optional[int] = 2
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    # Sharding level shared by every engine: 0 none, 1 optimizer, 2 +gradients, 3 +parameters.
    zero_stage: Optional[int] = 2
    pp_schedule: PipelineSchedule = PipelineSchedule["1F1B"]
    pp_virtual_stages: int = 1
    # Explicit layers per pipeline stage (uneven splits); empty = even split.
    pp_stage_layers: List[int] = field(default_factory=list)
    offload_optimizer: OffloadTarget = OffloadTarget.none
    offload_params: OffloadTarget = OffloadTarget.none
    nvme_path: Optional[str] = None
    micro_batch: Optional[int] = 1
    grad_accum: int = 1
    seq_len: Optional[int] = 64
    activation_checkpointing: Optional[Checkpointing] = Checkpointing.none
    precision: Precision = Precision.bf16


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
    # A calibrated hardware profile (JSON written by `harness calibrate`) the time model uses instead of
    # the datasheet table; `host`: this host's cached profile; None: the table.
    profile: Optional[str] = None
    # The fused attention kernel generation the time model times attention at.
    attention_kernel: AttentionKernel = DEFAULT_ATTENTION_KERNEL

    @property
    def ranks(self) -> int:
        """Processes of the whole job, one per accelerator (the world a layout's mesh must cover)."""
        return self.nodes * self.accelerators_per_node


@dataclass
class DataConfig:
    """Token batches: seeded synthetic tokens, or a local text file tokenised through `datasets`."""

    kind: DataKind = DataKind.synthetic
    path: Optional[str] = None
    text_column: str = "text"
    seed: int = 1234


@dataclass
class TrackingConfig:
    """Experiment tracking; W&B offline unless the user chooses online (and holds a key)."""

    backend: TrackingBackend = TrackingBackend.wandb
    mode: TrackingMode = TrackingMode.offline
    project: str = "harness"
    entity: Optional[str] = None
    # Seconds wandb may spend reaching a server before the run goes on without it.
    init_timeout_s: int = 30


@dataclass
class LauncherConfig:
    """Local subprocess or Slurm; the Slurm fields are only read by the Slurm launcher."""

    backend: LaunchBackend = LaunchBackend.local
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
    # NCCL hints the job script exports when set: NCCL_DEBUG, NCCL_SOCKET_IFNAME (the bootstrap and socket
    # interfaces, e.g. `ib0` or `^lo,docker`), NCCL_IB_HCA (the InfiniBand adapters, e.g. `mlx5_0:1,mlx5_1:1`).
    nccl_debug: Optional[NcclDebug] = None
    nccl_socket_ifname: Optional[str] = None
    nccl_ib_hca: Optional[str] = None
    # Per-run wall-clock limit of a local launch, seconds.
    timeout_s: int = 1800


@dataclass
class BenchConfig:
    """The timed loop every rank runs."""

    warmup_steps: int = 2  # the least warm-up
    # Warm-up goes on past warmup_steps until step time is steady (harness.rundir.stats.steady), at most this many.
    warmup_max_steps: int = 6
    steps: int = 5
    # A sweep runs each point this many times, interleaved (A B C C B A ...) so that slow drift of the host
    # cancels; the report pools them. `repeat` is which one a run is (set by the sweep, 0-based).
    repeats: int = 1
    repeat: int = 0
    seed: int = 0
    lr: float = 1e-3
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    # FLOP convention of the reported MFU: attention `causal` (halved) or `full` (PaLM appendix B).
    flop_attention: FlopAttention = FlopAttention.causal
    flop_include_lm_head: bool = True


@dataclass
class StandinConfig:
    """Set when the run is the CPU stand-in of a GPU recipe (harness.config.standin)."""

    of: Optional[str] = None
    # What the stand-in cannot execute on CPU, and why; reported with the run's metrics.
    not_executed: List[str] = field(default_factory=list)


@dataclass
class RunConfig:
    """Everything one benchmark run needs; `recipes/` and the command line only override it."""

    model: ModelConfig = field(default_factory=ModelConfig)
    # Typed as the base so the `engine` group can select any engine's option dataclass.
    engine: EngineConfig = field(default_factory=EngineConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    standin: StandinConfig = field(default_factory=StandinConfig)
    # Sweep name: the folder under `results/` and the W&B group.
    sweep_name: str = "adhoc"
    results_dir: str = "results"
