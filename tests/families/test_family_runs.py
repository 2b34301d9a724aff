"""Tiny versions of other Hugging Face families train on two CPU processes under every engine axis
(DeepSpeed ZeRO-3, FSDP2, nd TP2 with sequence and loss parallelism, nd PP2) exactly like one process
(fp32 losses within 1e-5), and each rank holds the state bytes the plan predicts.

The axes are spread over the families rather than crossed with them (CI time): each run is one family on
one engine. The reference is plain torch in this process, as in tests/integration/test_nd.py: the same
seeded Hugging Face model, every data-parallel rank's micro-batches as one batch, AdamW and clipping as
the engines configure them.
"""

import json
import time
from functools import lru_cache

import pytest
from family_helpers import tiny_fields

from harness.config.compose import compose_run_config
from harness.engines import nd_plans
from harness.plan.parallel_dims import ParallelDims
from tests.integration.reference import single_process_losses
from tests.integration.runs import prepare_and_launch

pytestmark = pytest.mark.integration

# Two warm-up steps (the second measures state bytes) and two timed steps: four losses to compare.
BASE = ["tracking=disabled", "bench.warmup_steps=2", "bench.warmup_max_steps=2", "bench.steps=2", "layout.precision=fp32"]
FP32_RTOL = 1e-5
TIMEOUT_S = 600
# The tiny fields' window (32) is shorter than the runs' 64 tokens: nd passes no mask and refuses it.
RUN_FIELDS = {"sliding_window": 64}
# run name: (family, engine recipe and its overrides). Every engine axis, eight families beyond Llama.
RUNS = {
    "gemma2_zero3": ("gemma2", ["recipes=cpu_zero3"]),
    "phi3_fsdp2": ("phi3", ["recipes=cpu_fsdp"]),
    "deepseek_v3_fsdp2": ("deepseek_v3", ["recipes=cpu_fsdp"]),  # a dense first layer, then MoE layers
    "deepseek_v32_fsdp2": ("deepseek_v32", ["recipes=cpu_fsdp"]),
    "deepseek_v32_zero3": ("deepseek_v32", ["recipes=cpu_zero3"]),
    "gemma3_text_fsdp2": ("gemma3_text", ["recipes=cpu_fsdp"]),
    "olmo2_nd_tp2": ("olmo2", ["recipes=cpu_nd_tp2"]),
    "qwen3_nd_tp2": ("qwen3", ["recipes=cpu_nd_tp2"]),
    "qwen3_moe_nd_pp2": ("qwen3_moe", ["recipes=cpu_nd_pp2"]),
}
# Wall-clock seconds of each run, printed at the end of the module (`-s`) and kept with each test's report.
WALL_TIMES = {}


def family_overrides(family: str):
    fields = {**tiny_fields(family), **RUN_FIELDS}
    return [f"model.name=tiny_{family}", *(f"++model.hf_config.{k}={v}" for k, v in fields.items())]


@lru_cache(maxsize=None)
def reference(hf_config_json: str, rows: int, grad_accum: int, n_steps: int):
    """Per-step mean losses of one process that sees every data-parallel rank's micro-batches at once."""
    cfg = compose_run_config(BASE)
    return single_process_losses(cfg, json.loads(hf_config_json), rows, grad_accum, n_steps)[0]


@pytest.fixture(scope="module")
def results_root(tmp_path_factory):
    return tmp_path_factory.mktemp("family_runs")


@pytest.mark.parametrize("name", sorted(RUNS))
def test_family_trains_like_one_process(name, results_root, record_property):
    family, engine = RUNS[name]
    cfg = compose_run_config([*engine, *BASE, *family_overrides(family)])
    assert cfg.model.hf_config["model_type"] == family
    result, plan, seconds = prepare_and_launch(cfg, results_root / name, TIMEOUT_S)
    measured, predicted = result["measured"], result["predicted"]
    layout = cfg.layout
    rows = layout.micro_batch * ParallelDims.of(layout).dp
    start = time.monotonic()
    want = reference(json.dumps(cfg.model.hf_config, sort_keys=True), rows, layout.grad_accum,
                     len(measured["losses"]))  # fmt: skip
    seconds += time.monotonic() - start
    WALL_TIMES[name] = seconds
    record_property("wall_time_s", round(seconds, 1))
    error = max(abs(a - b) / abs(b) for a, b in zip(measured["losses"], want))
    record_property("loss_rel_error", error)
    print(f"{name}: loss relative error {error:.1e}, {seconds:.1f} s")
    assert measured["losses"] == pytest.approx(want, rel=FP32_RTOL)
    by_rank = {r["rank"]: r for r in measured["per_rank"]}
    assert sorted(by_rank) == list(range(ParallelDims.of(layout).world_size))
    # The planner's figure is for the pipeline rank it reports (plan.json memory.pp_rank); every rank of that
    # stage holds it (shards are padded to the same size on every rank).
    stage_size = ParallelDims.of(layout).world_size // layout.pp
    for rank in (r for r in by_rank if r // stage_size == plan["memory"].get("pp_rank", 0)):
        for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            assert by_rank[rank][key] == predicted[key], (rank, key, by_rank[rank][key], predicted[key])
    if cfg.engine.name == "nd":
        for rank, record in by_rank.items():
            exact = nd_plans.predicted_state_bytes(cfg.model.hf_config, layout, rank)
            assert {k: record[k] for k in exact} == exact, f"rank {rank}"


def teardown_module():
    if WALL_TIMES:
        print("\nfamily run wall times (s): " + ", ".join(f"{k} {v:.1f}" for k, v in WALL_TIMES.items()))
