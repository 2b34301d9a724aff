"""The gradient norm nd clips with, on the placements FSDP2 x TP really produces.

Four gloo ranks build the tp2 x dp_shard2 recipe with `nd_session.apply` itself: FSDP2 shards the parameters
tensor parallelism already split on dim 0 (q/k/v, gate/up, embedding, lm_head) as `_StridedShard` over the data
axis, the others as `Shard`. One training step runs with a clipping threshold far below the gradient norm, so the
clip engages; the norm the session clips with must be the norm of the gathered full gradients (`full_tensor`),
which must also be the norm one process computes over every rank's micro-batches, and the gradients after
clipping must be the full ones times torch's coefficient.
"""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from harness.config.compose import compose_run_config
from harness.engines import nd, nd_session
from harness.modeling.device import DeviceKind
from harness.modeling.model import build_model
from harness.plan.parallel_dims import ParallelDims
from harness.runtime.data import micro_batches, token_source

pytestmark = pytest.mark.integration

# Far below the tiny model's first-step gradient norm (about 0.6), so the clip scales every gradient.
MAX_NORM = 0.1
OVERRIDES = ["recipes=cpu_nd_tp2", "layout=nd_tp2_fsdp2", "cluster.accelerators_per_node=4",
             "layout.precision=fp32", "layout.grad_accum=2", "tracking=disabled", f"bench.grad_clip={MAX_NORM}"]


def _full(grad) -> torch.Tensor:
    return grad.full_tensor() if isinstance(grad, DTensor) else grad


def _rank(rank: int, cfg, run_dir: str, store_file: str, results: str) -> None:
    dims = ParallelDims.of(cfg.layout)
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=dims.world_size)
    try:
        session = nd_session.apply(cfg, Path(run_dir), build_model(cfg.model.hf_config, cfg.bench.seed),
                                   DeviceKind("cpu", "gloo"))
        out = {"placements": sorted({str(tuple(p.placements)) for p in session.params if isinstance(p, DTensor)})}
        clip = session.clip_grad_norm

        def full_gradients():
            return {name: _full(p.grad).clone() for name, p in _named_params(session)}

        def spy(max_norm):  # the session's own clip, with the gradients read on each side of it
            out["before"] = full_gradients()
            out["norm"] = clip(max_norm)
            out["after"] = full_gradients()
            return out["norm"]

        session.clip_grad_norm = spy
        layout = cfg.layout
        source = token_source(cfg.data, cfg.model.hf_config["vocab_size"], layout.seq_len)
        batches = micro_batches(source, 0, layout.micro_batch, layout.grad_accum, session.dp_rank, session.dp_size)
        session.train_step(batches)
        if rank == 0:
            torch.save(out, results)
        dist.barrier()  # no rank tears its gloo pairs down while a peer's last full_tensor still reads them
    finally:
        dist.destroy_process_group()


def _named_params(session):
    return [(f"{i}.{name}", p) for i, stage in enumerate(session.stages) for name, p in stage.named_parameters()]


def one_process_norm(cfg) -> float:
    """The first step's gradient norm of one process that sees every data-parallel rank's micro-batches."""
    layout = cfg.layout
    model = build_model(cfg.model.hf_config, cfg.bench.seed)
    source = token_source(cfg.data, cfg.model.hf_config["vocab_size"], layout.seq_len)
    rows = layout.micro_batch * ParallelDims.of(layout).dp
    for tokens in micro_batches(source, 0, rows, layout.grad_accum, 0, 1):
        (model(input_ids=tokens, labels=tokens).loss / layout.grad_accum).backward()
    return float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))


@pytest.fixture(scope="module")
def tp2_fsdp2_step(tmp_path_factory):
    cfg = compose_run_config(OVERRIDES)
    tmp = tmp_path_factory.mktemp("nd_grad_norm")
    nd.render(cfg, tmp)
    world = ParallelDims.of(cfg.layout).world_size
    mp.start_processes(_rank, args=(cfg, str(tmp), str(tmp / "store"), str(tmp / "results.pt")), nprocs=world,
                       start_method="spawn")  # fmt: skip
    return cfg, torch.load(tmp / "results.pt")


def test_fsdp2_strided_shards_count_once_in_the_clipped_norm(tp2_fsdp2_step, record_property):
    cfg, out = tp2_fsdp2_step
    assert any("_StridedShard" in p for p in out["placements"]), out["placements"]
    true_norm = float(torch.nn.utils.get_total_norm(list(out["before"].values())))
    record_property("harness_norm", out["norm"])
    record_property("full_gradient_norm", true_norm)
    print(f"\ntp2 x dp_shard2 gradient norm: harness {out['norm']:.4f}, full gradients {true_norm:.4f}")
    assert true_norm > 2 * MAX_NORM  # the clip engages
    assert true_norm == pytest.approx(one_process_norm(cfg), rel=1e-5)
    assert out["norm"] == pytest.approx(true_norm, rel=1e-6)
    coef = MAX_NORM / (true_norm + 1e-6)
    for name, grad in out["before"].items():
        torch.testing.assert_close(out["after"][name], grad * coef, msg=name)
