"""The harness's gradient clipping on FSDP2 x tensor-parallel placements: gradients on two device meshes.

Accelerate refuses tp on CPU, so engine=fsdp with tp > 1 cannot run here; these tests drive the clipping
function the FSDP session calls directly, on a (dp, tp) device mesh of 4 gloo ranks with DTensor gradients
placed by hand as Shard / Replicate, and compare with torch's single-process norm and clipping. The placements
FSDP2 itself gives a tensor-parallel weight (`_StridedShard` on the data axis) are checked by
tests/integration/test_nd_grad_norm.py, on the model nd_session.apply builds.
"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from harness.engines.grad_norm import clip_grad_norm

WORLD, DP, TP = 4, 2, 2


def full_gradients(scale: float):
    """Full gradients (same on every rank): a norm weight, column- and row-parallel projections, an
    embedding, a replicated bias."""
    generator = torch.Generator().manual_seed(0)
    shapes = {"norm": (8,), "q_proj": (8, 8), "o_proj": (8, 8), "embed": (16, 8), "bias": (8,)}
    return {name: torch.randn(shape, generator=generator) * scale for name, shape in shapes.items()}


def placed(full, dp_mesh, dp_tp_mesh):
    """FSDP2 shards dim 0 over dp; TP shards q_proj by rows (colwise), o_proj by columns (rowwise)."""
    return {
        "norm": distribute_tensor(full["norm"], dp_mesh, [Shard(0)]),  # 1-D data mesh only
        "q_proj": distribute_tensor(full["q_proj"], dp_tp_mesh, [Shard(0), Shard(0)]),
        "o_proj": distribute_tensor(full["o_proj"], dp_tp_mesh, [Shard(0), Shard(1)]),
        "embed": distribute_tensor(full["embed"], dp_tp_mesh, [Shard(0), Shard(1)]),
        "bias": distribute_tensor(full["bias"], dp_tp_mesh, [Shard(0), Replicate()]),
    }


CASES = {"clipped": (1.0, 1.0), "below_max_norm": (0.01, 1.0)}  # name: (gradient scale, max_norm)


def _rank(rank: int, store_file: str, results: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
        out = {}
        for case, (scale, max_norm) in CASES.items():
            grads = placed(full_gradients(scale), mesh["dp"], mesh)
            norm = clip_grad_norm(grads.values(), max_norm, ranks_per_model=WORLD, device="cpu")
            out[case] = (norm, {name: grad.full_tensor() for name, grad in grads.items()})
        if rank == 0:
            torch.save(out, results)
        dist.barrier()  # no rank tears its gloo pairs down while a peer's last full_tensor still reads them
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def clipped_on_four_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clip")
    mp.start_processes(_rank, args=(str(tmp / "store"), str(tmp / "results.pt")), nprocs=WORLD, start_method="spawn")
    return torch.load(tmp / "results.pt")


@pytest.mark.parametrize("case", CASES)
def test_fsdp_tp_clipping_over_two_meshes_on_4_gloo_ranks_accelerate_refuses_tp_on_cpu(case, clipped_on_four_ranks):
    scale, max_norm = CASES[case]
    norm, clipped = clipped_on_four_ranks[case]
    reference = {name: grad.clone() for name, grad in full_gradients(scale).items()}
    expected = torch.nn.utils.get_total_norm(list(reference.values()), norm_type=2.0)
    assert norm == pytest.approx(float(expected), rel=1e-6)
    coef = min(1.0, max_norm / (float(expected) + 1e-6))
    assert (coef < 1.0) == (scale == 1.0)
    for name, grad in reference.items():
        torch.testing.assert_close(clipped[name], grad * coef)
