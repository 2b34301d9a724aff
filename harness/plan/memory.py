"""Per-rank memory prediction: training states, activations and allowance against the device."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict

from harness.plan.activations import layout_token_activations, rank_activation_bytes
from harness.plan.compute_time import layer_gemms
from harness.plan.regime import fp8_scaling_state_bytes
from harness.plan.model_spec import ModelSpec
from harness.plan.records import build
from harness.plan.states import rank_states


@dataclass(frozen=True)
class Allowance:
    """Head-room on top of the predicted bytes: allocator fragmentation, communication buckets,
    workspace (a fraction of the prediction), plus a fixed amount per rank (CUDA context, NCCL)."""

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
    best = None
    for st in rank_states(spec, layout, engine.name, engine.fsdp_version):
        # weight-shared stacks (HRM, pp = 1 by validation): each run with gradient saves its layer's activations
        saved = spec.saved_layer_runs if spec.layer_runs else st.layers
        activations, recompute = rank_activation_bytes(tok, layout, st.rank, saved, st.first, st.last)
        scaling = fp8_scaling_bytes(spec, layout, engine.name, st.layers)
        predicted = (st.param + st.grad + st.master + st.moments + st.optimizer_grad + st.gathered
                     + st.accumulated_grad + activations + recompute + scaling)
        if best is None or predicted > best[0]:
            best = (predicted, activations, recompute, st, scaling)
    predicted, activations, recompute, st, scaling = best
    extra = int(allowance.fraction * predicted) + allowance.fixed_bytes
    return build(
        MemoryBreakdown, pp_rank=st.rank, param_bytes=st.param, grad_bytes=st.grad, master_bytes=st.master,
        moment_bytes=st.moments, optimizer_grad_bytes=st.optimizer_grad, gathered_bytes=st.gathered,
        accumulated_grad_bytes=st.accumulated_grad, activation_bytes=activations, recompute_bytes=recompute,
        allowance_bytes=extra,
        total_bytes=predicted + extra, host_bytes=st.host, nvme_bytes=st.nvme, scaling_state_bytes=scaling,
    )


def fp8_scaling_bytes(spec: ModelSpec, layout: Any, engine: str, layers: int) -> int:
    """The FP8 scaling state of a rank's `layers` decoder layers (their weight GEMMs are what FP8 converts)."""
    if layout.precision != "fp8":
        return 0
    linears = sum(count for *_, count in layer_gemms(spec, 1, 1))
    return fp8_scaling_state_bytes(engine, layers * linears)
