"""The parallel degrees of one layout: world size, data-parallel sizes, mesh order and coordinates, validation."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, List, Tuple

# Mesh dimensions, outermost first. Pipeline outermost and tensor innermost, as in torchtitan's
# ParallelDims: TP all-reduces every layer (keep it on NVLink, adjacent ranks), PP only sends activations
# point to point (it may cross nodes), the data axes reduce gradients once per step in between.
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of every parallel axis. Every rank sits at one coordinate of the pp x dp_replicate x dp_shard x
    cp x tp mesh; experts borrow their degree from inside dp_shard x cp (torchtitan), so ep does not multiply."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    @classmethod
    def of(cls, layout: Any) -> "ParallelDims":
        """The degrees of a LayoutConfig (or anything with the same fields)."""
        return cls(**{name: getattr(layout, name) for name in _DEGREES})

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        """Ranks that read different batches; the cp, tp and pp ranks of one data-parallel rank share a batch."""
        return self.dp_replicate * self.dp_shard

    @property
    def data_ranks(self) -> int:
        """Ranks that hold the same weights of one pipeline stage and TP shard: dp_replicate x dp_shard x cp."""
        return self.dp * self.cp

    @property
    def dp_shard_cp(self) -> int:
        """Ranks one parameter is sharded over when the data axis shards: dp_shard x cp (torchtitan's dp_shard_cp;
        context-parallel ranks hold the same weights)."""
        return self.dp_shard * self.cp

    def global_batch(self, micro_batch: int, grad_accum: int) -> int:
        """Sequences one optimizer step consumes: only data-parallel ranks see different samples (tp ranks share a
        batch, cp ranks split one sequence, pp stages pass the same micro-batches on)."""
        return micro_batch * grad_accum * self.dp

    @property
    def ranks_per_stage(self) -> int:
        """Ranks that together hold one pipeline stage (the whole model without pipelining)."""
        return self.world_size // self.pp

    def mesh_shape(self) -> List[int]:
        return [getattr(self, name) for name in MESH_DIMS]

    def coordinates(self, rank: int) -> Dict[str, int]:
        """Row-major coordinates of `rank` in the mesh (what `init_device_mesh` assigns)."""
        coords, rest = {}, rank
        for name, size in reversed(list(zip(MESH_DIMS, self.mesh_shape()))):
            coords[name] = rest % size
            rest //= size
        return {name: coords[name] for name in MESH_DIMS}

    def data_parallel_rank(self, rank: int) -> int:
        c = self.coordinates(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]

    def problems(self) -> List[str]:
        """Degrees below 1, each named (the divisibility rules elsewhere would divide by them)."""
        bad = [f"layout.{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) < 1]
        return [f"{', '.join(bad)}: parallel degrees must be >= 1"] if bad else []

    def world_problems(self, nodes: int, accelerators_per_node: int) -> Tuple[List[str], List[str]]:
        """(errors, warnings): the mesh must cover the cluster's ranks exactly, naming every factor."""
        errors, warnings = [], []
        if nodes < 1 or accelerators_per_node < 1:
            errors.append(f"cluster.nodes={nodes}, cluster.accelerators_per_node={accelerators_per_node} must be >= 1")
        elif self.world_size != nodes * accelerators_per_node:
            factors = " x ".join(f"{name}={getattr(self, name)}" for name in ("dp_replicate", "dp_shard", "tp", "pp",
                                                                               "cp"))
            errors.append(f"{factors} = {self.world_size} must equal cluster.nodes={nodes} x "
                          f"cluster.accelerators_per_node={accelerators_per_node} = {nodes * accelerators_per_node}")
        if self.tp > accelerators_per_node >= 1:
            warnings.append(f"tp={self.tp} > cluster.accelerators_per_node={accelerators_per_node}: tensor-parallel "
                            "collectives cross the inter-node network")
        return errors, warnings


# ParallelDims' field names, read once (dataclasses.fields builds them anew at every call; `of` runs per plan).
_DEGREES = tuple(f.name for f in fields(ParallelDims))
