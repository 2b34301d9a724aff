"""Per-rank memory prediction: training states, activations and allowance against the device."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict

from harness.plan.activations import layout_token_activations, rank_activation_bytes
from harness.plan.compute_time import layer_gemms
from harness.plan.conventions import COMPUTE_BYTES, DEEPSPEED_BUCKET_NUMEL, deepspeed_overlap_comm, state_convention
from harness.plan.regime import fp8_scaling_state_bytes
from harness.plan.model_spec import ModelSpec
from harness.plan.records import build
from harness.plan.states import rank_states


def deepspeed_bucket_bytes(layout: Any, accelerator: str, rank_numel: int) -> int:
    """Device bytes of DeepSpeed's gradient reduction buckets (contiguous_gradients, on in every rendered config
    and by default), reduce_bucket_size elements (conventions.DEEPSPEED_BUCKET_NUMEL) whatever the model, in the
    16-bit (or fp32) gradient dtype:
    - ZeRO-3 allocates one per communication dtype when it builds the optimizer and keeps it for the run
      (stage3.py _setup_for_real_optimizer: torch.empty(self.reduce_bucket_size, ...));
    - ZeRO-1 / 2 allocate one, two under overlap_comm (double buffering), at the first gradient of every
      backward and free them when its reduction ends (stage_1_and_2.py setup_buckets / _release_ipg_buffers):
      they coincide with the backward's activations.
    On an H200, ZeRO-3 with CPU offload of a 1.24e9-parameter model peaked 1,648 MiB above a plan without them
    (make gpu-check, 2026-11-27); the bf16 bucket is 954 MiB of it. A CPU rank's allocator maps a buffer that
    large lazily: only the pages gradients are written to, at most the rank's own, are resident."""
    stage = layout.zero_stage
    if stage == 0:
        return 0
    buffers = 2 if stage in (1, 2) and deepspeed_overlap_comm(stage, accelerator) else 1
    elements = DEEPSPEED_BUCKET_NUMEL
    if accelerator == "cpu":
        elements = min(elements, rank_numel)
    return buffers * elements * COMPUTE_BYTES[layout.precision]


@dataclass(frozen=True)
class Allowance:
    """Head-room on top of the predicted bytes: allocator fragmentation, communication buckets,
    workspace (a fraction of what the allocator hands out and takes back: allowance_bytes), plus a fixed
    amount per rank (CUDA context, NCCL)."""

    fraction: float = 0.10
    fixed_bytes: int = 0


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted bytes of one rank (the pipeline rank that needs the most)."""

    pp_rank: int
    param_bytes: int  # parameter tensors kept on the device between steps
    grad_bytes: int
    master_bytes: int  # fp32 master copy held by the optimizer
    moment_bytes: int  # Adam exp_avg + exp_avg_sq
    optimizer_grad_bytes: int  # fp32 gradient copy held by the optimizer
    gathered_bytes: int  # unsharded compute copies of sharded parameters (ZeRO-3 / FSDP)
    accumulated_grad_bytes: int  # unsharded gradients held across a pipeline step's micro-batches (nd, FSDP2)
    activation_bytes: int  # saved for backward by the micro-batches in flight
    recompute_bytes: int  # one layer's activations rebuilt during backward (full checkpointing)
    bucket_bytes: int  # the engine's gradient reduction buckets (DeepSpeed ZeRO: deepspeed_bucket_bytes)
    allowance_bytes: int
    total_bytes: int  # device total
    host_bytes: int  # states offloaded to host memory by this rank
    nvme_bytes: int  # states offloaded to NVMe by this rank
    scaling_state_bytes: int = 0  # FP8 scaling state kept between steps (harness.plan.regime)

    @property
    def optimizer_bytes(self) -> int:
        """Everything the optimizer owns (master, moments, its gradient copy), as a meter sums optimizer
        state."""
        return self.master_bytes + self.moment_bytes + self.optimizer_grad_bytes

    @property
    def state_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    def to_dict(self) -> Dict[str, Any]:
        return {**asdict(self), "optimizer_bytes": self.optimizer_bytes, "state_bytes": self.state_bytes}


def memory_per_rank(spec: ModelSpec, layout: Any, engine: Any, accelerator: str,
                    allowance: Allowance = Allowance()) -> MemoryBreakdown:
    """The breakdown of the pipeline rank with the largest total (rank 0 and the last rank compared).

    `layout` is a harness.config.schema.LayoutConfig, `engine` an EngineConfig; the layout must have
    passed validation.
    """
    tok = layout_token_activations(spec, layout, engine, accelerator)
    conv = state_convention(engine.name, layout.precision, layout.zero_stage, engine.fsdp_version,
                            engine.grad_reduce_in_bf16)
    scaling_of = fp8_scaling_by_layers(spec, layout, engine.name)
    best = None
    for st in rank_states(spec, layout, engine.name, engine.fsdp_version, engine.grad_reduce_in_bf16):
        # weight-shared stacks (HRM, pp = 1 by validation): each run with gradient saves its layer's activations
        saved = spec.saved_layer_runs if spec.layer_runs else st.layers
        activations, recompute = rank_activation_bytes(tok, layout, st.rank, saved, st.first, st.last)
        scaling = scaling_of(st.layers)
        buckets = deepspeed_bucket_bytes(layout, accelerator, st.numel) if engine.name == "deepspeed" else 0
        predicted = (st.param + st.grad + st.master + st.moments + st.optimizer_grad + st.gathered
                     + st.accumulated_grad + activations + recompute + scaling + buckets)
        preallocated = (st.param + st.grad + st.master + st.moments + st.optimizer_grad + scaling
                        if conv is not None and conv.preallocated else 0)
        # ZeRO-3's bucket is allocated once and kept: like preallocated states, it leaves no gaps
        preallocated += buckets if layout.zero_stage == 3 else 0
        extra = allowance_bytes(allowance, predicted, preallocated)
        if best is None or predicted + extra > best[0] + best[1]:
            best = (predicted, extra, activations, recompute, st, scaling, buckets)
    predicted, extra, activations, recompute, st, scaling, buckets = best
    return build(
        MemoryBreakdown, pp_rank=st.rank, param_bytes=st.param, grad_bytes=st.grad, master_bytes=st.master,
        moment_bytes=st.moments, optimizer_grad_bytes=st.optimizer_grad, gathered_bytes=st.gathered,
        accumulated_grad_bytes=st.accumulated_grad, activation_bytes=activations, recompute_bytes=recompute,
        bucket_bytes=buckets, allowance_bytes=extra,
        total_bytes=predicted + extra, host_bytes=st.host, nvme_bytes=st.nvme, scaling_state_bytes=scaling,
    )


def allowance_bytes(allowance: Allowance, predicted: int, preallocated: int) -> int:
    """The head-room on top of `predicted` bytes: `fraction` of the bytes the caching allocator hands out and takes
    back during a step, plus `fixed_bytes`. The `preallocated` part (states in buffers allocated once at their
    exact size: StateConvention.preallocated) takes no fraction: torch's CUDA caching allocator serves a request
    from the smallest cached block that fits, splitting it, and cudaMallocs a new segment when none does
    (c10/cuda/CUDACachingAllocator.cpp; requests of 10 MiB and more are rounded to 2 MiB), so a tensor that is
    never freed fills its segment and only the tensors freed and re-allocated within the step (activations,
    gathered parameters, temporaries) leave the reserved-but-unused gaps the fraction stands for."""
    return int(allowance.fraction * (predicted - preallocated)) + allowance.fixed_bytes


def fp8_scaling_by_layers(spec: ModelSpec, layout: Any, engine: str) -> Callable[[int], int]:
    """The FP8 scaling state of a rank's decoder layers, by their number (their weight GEMMs are what FP8
    converts)."""
    if layout.precision != "fp8":
        return lambda layers: 0
    linears = sum(count for *_, count in layer_gemms(spec, 1, 1))
    return lambda layers: fp8_scaling_state_bytes(engine, layers * linears)
