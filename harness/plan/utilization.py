"""Tokens per step, MFU and HFU: achieved FLOP/s over the peak of every device in the run."""

from __future__ import annotations

from typing import Optional

from harness.plan.parallel_dims import ParallelDims


def tokens_per_step(micro_batch: int, grad_accum: int, dp_replicate: int, dp_shard: int, seq_len: int) -> int:
    """Tokens one optimizer step consumes, counted once for the whole job: the global batch
    (ParallelDims.global_batch) x seq_len, whatever the tp, cp and pp degrees."""
    return ParallelDims(dp_replicate=dp_replicate, dp_shard=dp_shard).global_batch(micro_batch, grad_accum) * seq_len


def _utilization(tokens_per_s: float, flops_per_token: float, peak_flops_per_device: Optional[float],
                 world_size: int) -> Optional[float]:
    # Achieved FLOP/s of the job over the job's peak (Chowdhery et al. 2022, appendix B): both sides
    # global, so per-device figures divide by the same world size and it cancels out.
    if peak_flops_per_device is None or peak_flops_per_device <= 0 or world_size <= 0:
        return None
    return tokens_per_s * flops_per_token / (peak_flops_per_device * world_size)


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops_per_device: Optional[float],
        world_size: int) -> Optional[float]:
    """Model FLOPs utilization from global tokens/s and the model FLOPs per token (no recompute);
    None when the peak is unknown."""
    return _utilization(tokens_per_s, flops_per_token, peak_flops_per_device, world_size)


def hfu(tokens_per_s: float, flops_per_token: float, recompute_flops_per_token: float,
        peak_flops_per_device: Optional[float], world_size: int) -> Optional[float]:
    """Hardware FLOPs utilization: as MFU, with the FLOPs activation recomputation adds."""
    return _utilization(tokens_per_s, flops_per_token + recompute_flops_per_token, peak_flops_per_device,
                        world_size)
