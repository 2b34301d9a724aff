"""Per-rank state bytes when shapes do not divide by the shard group: the planner against FSDP1 and FSDP2
built on 3 gloo CPU processes under the real `accelerate launch`.

The tiny Llama with vocab_size=251 over 3 ranks: no decoder-layer flat parameter (36992 elements), no root
flat parameter (embedding + final norm + lm_head, 32192 elements) and no dim 0 (64, 32, 128, 251) divides
by 3, so every padding rule shows in the bytes.
"""

import pytest

from harness.config.compose import compose_run_config
from harness.plan.planner import spec_for
from harness.plan.states import rank_states
from tests.integration.runs import prepare_and_launch

pytestmark = pytest.mark.integration

RANKS = 3
BASE = [
    "engine=fsdp", "tracking=disabled", "bench.warmup_steps=2", "bench.warmup_max_steps=2", "bench.steps=1", "layout.micro_batch=1",
    "layout.seq_len=32", "layout.precision=fp32", "layout.zero_stage=3", f"layout.dp_shard={RANKS}",
    f"cluster.accelerators_per_node={RANKS}", "model.hf_config.vocab_size=251",
]  # fmt: skip
STATES = ("param_bytes", "grad_bytes", "optimizer_bytes")
TIMEOUT_S = 300


def planned_states(cfg) -> dict:
    """The planner's state bytes of one rank for this config (FSDP1 or FSDP2)."""
    (states,) = rank_states(spec_for(cfg.model), cfg.layout, "fsdp", cfg.engine.fsdp_version)
    return {"param_bytes": states.param, "grad_bytes": states.grad, "optimizer_bytes": states.master + states.moments}


@pytest.mark.parametrize("version", [1, 2])
def test_uneven_shards_match_the_planner(version, tmp_path, record_property):
    cfg = compose_run_config([*BASE, f"engine.fsdp_version={version}"])
    result, _, seconds = prepare_and_launch(cfg, tmp_path, TIMEOUT_S)
    record_property("wall_time_s", round(seconds, 1))
    print(f"\n  fsdp{version} padding over {RANKS} ranks: {seconds:.1f} s wall")
    measured, predicted = result["measured"], result["predicted"]
    per_rank = measured["per_rank"]
    assert len(per_rank) == RANKS
    planned = planned_states(cfg)
    whole = spec_for(cfg.model).total_params
    assert planned["param_bytes"] > 4 * whole / RANKS  # padding: more than an even split
    held = {key: [rank[key] for rank in per_rank] for key in STATES}
    if version == 1:
        # Each flat parameter's shard is padded to ceil(total / 3) on every rank.
        assert held == {key: [planned[key]] * RANKS for key in STATES}
        assert {key: predicted[key] for key in STATES} == planned  # make_plan applies the same rule
        return
    # FSDP2 chunks dim 0 as torch.chunk does (22, 22, 20 rows of 64): ranks 0 and 1 hold ceil(d0 / 3) rows,
    # the planner's figure; the last rank's DTensor is a narrowed view of its padded shard (fsdp_param.py
    # allocates ceil(d0 / 3) rows everywhere), and the meter counts the view.
    for key in STATES:
        assert held[key][:-1] == [planned[key]] * (RANKS - 1) and held[key][-1] < planned[key], key
        assert measured[key] == predicted[key] == planned[key], key  # the run's maximum, and make_plan's
