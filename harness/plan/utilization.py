"""Tokens per step, MFU and HFU: achieved FLOP/s over the peak of every device in the run."""

from __future__ import annotations

from typing import Optional


def tokens_per_step(micro_batch: int, grad_accum: int, dp_replicate: int, dp_shard: int, seq_len: int) -> int:
    """Tokens one optimizer step consumes, counted once for the whole job.

    Only data-parallel replicas see different samples: the ranks of one TP group share a batch, CP ranks
    split one sequence, PP stages pass the same micro-batches on. So global batch = micro_batch x
    grad_accum (the micro-batches of a pipeline, or accumulation steps) x dp_replicate x dp_shard, and
    tokens = global batch x seq_len, whatever the tp, cp and pp degrees.
    """
    return micro_batch * grad_accum * dp_replicate * dp_shard * seq_len


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
