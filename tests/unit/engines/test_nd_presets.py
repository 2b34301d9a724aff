"""Every nd and megatron_lm preset composes, plans without errors, fits, and renders (GPU ones only render here;
the CPU ones run in tests/integration/test_nd.py)."""

import json

import pytest

from harness import REPO_ROOT
from harness.config.compose import compose_run_config
from harness.engines import nd, nd_plans
from harness.launch.prepare import prepare_run

RECIPES = REPO_ROOT / "recipes"
ND_PRESETS = sorted(p.stem for p in [*RECIPES.glob("cpu_nd_*.yaml"), *RECIPES.glob("gpu_*_nd_*.yaml")])
MEGATRON_PRESETS = sorted(p.stem for p in RECIPES.glob("gpu_*_megatron_*.yaml"))


def prepare(name, tmp_path):
    cfg = compose_run_config([f"recipes={name}"])
    return cfg, prepare_run(cfg, tmp_path / name)


def test_the_presets_the_issue_asks_for_exist():
    assert {"cpu_nd_tp2", "cpu_nd_pp2", "gpu_llama70b_nd_tp8_pp4", "gpu_llama405b_nd_tp8_pp16"} <= set(ND_PRESETS)
    assert {"gpu_llama70b_megatron_tp8_pp4", "gpu_llama405b_megatron_tp8_pp16",
            "gpu_mixtral8x7b_megatron_ep8"} <= set(MEGATRON_PRESETS)  # fmt: skip


@pytest.mark.parametrize("name", ND_PRESETS)
def test_nd_preset_plans_and_renders(name, tmp_path):
    cfg, prepared = prepare(name, tmp_path)
    assert cfg.engine.name == "nd"
    assert prepared.plan.errors == () or list(prepared.plan.errors) == []
    assert prepared.rendered is not None and prepared.rendered.files == [nd.PLAN_FILE]
    plan = json.loads((prepared.run_dir / nd.PLAN_FILE).read_text())
    assert plan["mesh"]["world_size"] == cfg.cluster.nodes * cfg.cluster.accelerators_per_node
    assert nd_plans.check(cfg) == ([], [])
    if cfg.cluster.accelerator != "cpu":
        assert plan["mesh"]["device_type"] == "cuda"


@pytest.mark.parametrize("name", MEGATRON_PRESETS)
def test_megatron_preset_plans_and_renders(name, tmp_path):
    cfg, prepared = prepare(name, tmp_path)
    assert cfg.engine.name == "megatron_lm"
    assert prepared.plan.valid
    # Export only: the command line is written, and the run is never launched (PRUNED, with the reason).
    assert prepared.rendered is None and (prepared.run_dir / "megatron_args.sh").exists()
    status = json.loads((prepared.run_dir / "status.json").read_text())
    assert status["state"] == "PRUNED" and "export only" in status["reason"]


def test_gpu_presets_shapes():
    llama70 = compose_run_config(["recipes=gpu_llama70b_nd_tp8_pp4"]).layout
    assert (llama70.tp, llama70.pp, llama70.dp_shard) == (8, 4, 2)  # its constraint; the rest is the recommender's
    llama405 = compose_run_config(["recipes=gpu_llama405b_nd_tp8_pp16"])
    assert (llama405.layout.tp, llama405.layout.pp) == (8, 16)
    assert llama405.cluster.nodes * llama405.cluster.accelerators_per_node == 1024
    mixtral = compose_run_config(["recipes=gpu_mixtral8x7b_megatron_ep8"]).layout
    assert mixtral.ep == 8
