"""Resolve a data-parallel degree of -1 to the ranks the other degrees leave (torchtitan's convention)."""

from __future__ import annotations

from dataclasses import replace

from harness.config.schema import RunConfig

FILLABLE = ("dp_replicate", "dp_shard")
FIXED = ("tp", "pp", "cp")


class DegreeFillError(ValueError):
    """A -1 degree that cannot be resolved; the message names the fields and the numbers."""


def fill_data_parallel(run: RunConfig) -> RunConfig:
    """`layout.dp_shard=-1` (or dp_replicate) becomes world / (the other degrees), so a sweep over
    tp / pp / cp keeps the cluster's world size. ep borrows ranks from dp_shard x cp and does not count."""
    layout, cluster = run.layout, run.cluster
    wildcards = [axis for axis in FILLABLE if getattr(layout, axis) == -1]
    if not wildcards:
        return run
    if len(wildcards) > 1:
        raise DegreeFillError("layout.dp_replicate=-1 and layout.dp_shard=-1: only one degree can fill the world")
    world = cluster.ranks
    others = [axis for axis in (*FILLABLE, *FIXED) if axis != wildcards[0]]
    used = 1
    for axis in others:
        used *= getattr(layout, axis)
    factors = " x ".join(f"{axis}={getattr(layout, axis)}" for axis in others)
    if used < 1 or world % used:
        raise DegreeFillError(
            f"layout.{wildcards[0]}=-1 fills the world: cluster.nodes={cluster.nodes} x "
            f"cluster.accelerators_per_node={cluster.accelerators_per_node} = {world} is not a multiple of "
            f"{factors} = {used}")
    return replace(run, layout=replace(layout, **{wildcards[0]: world // used}))
