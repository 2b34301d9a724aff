"""model.init=meta on CPU processes: with engine=nd every rank builds the model on the meta device, shards it
(TP / pipeline stages / FSDP2) and only then allocates and initialises its own share; with engine=deepspeed
at ZeRO-3 transformers builds it inside deepspeed.zero.Init, partitioned as it goes. Each rank holds
exactly the predicted state bytes (Adam state included: the optimizer stepped), and the losses are those of
an initialised model on uniform tokens, ln(vocab).

Weights differ from a full build (each shard is drawn after sharding), so losses are not compared with the
single-process reference; tests/integration/test_nd.py does that for the same layouts built in full.
"""

import json
import math

import pytest

from harness.config.compose import compose_run_config
from harness.engines import nd_plans
from tests.integration.runs import prepare_and_launch

pytestmark = pytest.mark.integration

BASE = ["model.init=meta", "tracking=disabled", "bench.warmup_steps=2", "bench.warmup_max_steps=2", "bench.steps=2", "layout.precision=fp32"]
FOUR = "cluster.accelerators_per_node=4"
TIMEOUT_S = 600


@pytest.mark.parametrize("name, overrides", [
    ("nd_tp2_fsdp2", ["recipes=cpu_nd_tp2", "layout=nd_tp2_fsdp2", FOUR]),
    ("nd_pp2_fsdp2", ["recipes=cpu_nd_pp2", "layout=nd_pp2_fsdp2", FOUR]),
    ("deepspeed_zero3", ["recipes=cpu_zero3"]),  # transformers' zero.Init path
])  # fmt: skip
def test_sharded_construction_holds_each_rank_share_and_trains(name, overrides, tmp_path, record_property):
    cfg = compose_run_config([*BASE, *overrides])
    result, plan, seconds = prepare_and_launch(cfg, tmp_path / name, TIMEOUT_S)
    record_property("wall_time_s", round(seconds, 1))
    print(f"\n  meta init {name}: {seconds:.1f} s wall")
    assert plan["model_init"] == "meta"
    measured = result["measured"]
    for record in measured["per_rank"]:
        if cfg.engine.name == "nd":
            exact = nd_plans.predicted_state_bytes(cfg.model.hf_config, cfg.layout, record["rank"])
        else:
            exact = {key: result["predicted"][key] for key in ("param_bytes", "grad_bytes", "optimizer_bytes")}
        assert {k: record[k] for k in exact} == exact, f"rank {record['rank']}"
    ln_vocab = math.log(cfg.model.hf_config["vocab_size"])
    losses = measured["losses"]
    # Initialised, untrained, on uniform synthetic tokens: every step's loss stays at the uniform guess
    # (garbage from to_empty or a missing init would be far off, or not finite).
    assert losses == pytest.approx([ln_vocab] * len(losses), rel=0.02)
    # ...but not exactly: all-zero weights (allocated, never initialised) predict exactly uniform logits.
    assert losses[0] != pytest.approx(ln_vocab, abs=1e-4)
    assert json.loads((tmp_path / name / "config.json").read_text())["model"]["init"] == "meta"
