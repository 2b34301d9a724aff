"""ParallelDims: mesh order, row-major coordinates, data-parallel sizes, and validation naming every factor."""

from harness.plan.parallel_dims import MESH_DIMS, ParallelDims


def test_mesh_dims_pipeline_outermost_tensor_innermost():
    dims = ParallelDims(pp=2, dp_replicate=3, dp_shard=5, cp=7, tp=11)
    assert MESH_DIMS == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    assert dims.mesh_shape() == [2, 3, 5, 7, 11]
    assert dims.world_size == 2 * 3 * 5 * 7 * 11
    assert dims.dp == 15 and dims.data_ranks == 105 and dims.ranks_per_stage == 3 * 5 * 7 * 11


def test_coordinates_are_row_major_and_tp_ranks_are_adjacent():
    dims = ParallelDims(pp=2, dp_shard=2, tp=2)
    coords = [dims.coordinates(r) for r in range(8)]
    assert [c["tp"] for c in coords] == [0, 1] * 4
    assert [c["dp_shard"] for c in coords] == [0, 0, 1, 1] * 2
    assert [c["pp"] for c in coords] == [0] * 4 + [1] * 4


def test_tp_cp_and_pp_ranks_of_one_data_rank_read_the_same_batch():
    dims = ParallelDims(pp=2, dp_replicate=2, dp_shard=2, cp=2, tp=2)
    assert dims.dp == 4
    by_dp = {}
    for rank in range(dims.world_size):
        by_dp.setdefault(dims.data_parallel_rank(rank), []).append(rank)
    assert sorted(by_dp) == [0, 1, 2, 3]
    assert all(len(ranks) == 8 for ranks in by_dp.values())  # pp x cp x tp


def test_expert_degree_does_not_multiply_the_world():
    assert ParallelDims(dp_shard=8, ep=4).world_size == 8


def test_world_mismatch_names_every_factor():
    errors, warnings = ParallelDims(dp_replicate=2, dp_shard=3, tp=4, pp=1, cp=1).world_problems(2, 8)
    assert errors == ["dp_replicate=2 x dp_shard=3 x tp=4 x pp=1 x cp=1 = 24 must equal cluster.nodes=2 x "
                      "cluster.accelerators_per_node=8 = 16"]
    assert warnings == []
    assert ParallelDims(tp=16).world_problems(2, 8)[1] == [
        "tp=16 > cluster.accelerators_per_node=8: tensor-parallel collectives cross the inter-node network"]


def test_degrees_below_one_are_named():
    assert ParallelDims(tp=0, cp=-1).problems() == ["layout.tp=0, layout.cp=-1: parallel degrees must be >= 1"]
    assert ParallelDims().problems() == []
