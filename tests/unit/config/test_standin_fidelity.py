"""A stand-in runs its recipe's resolved config, shrunk: every field where the two resolved configs differ is a
shrink field (standin.SHRINK_FIELDS) or named by one of the stand-in's not_executed gaps, and no gap names a
field that does not differ.

The resolved config is the RunConfig with model.init resolved (`auto` decided at each config's own size) and
the files the engine renders from it (ds_config.json, accelerate.yaml, nd_plan.json, the Megatron-LM script,
the launch line and environment). The rendered side of the recipe is the stand-in's config on the recipe's
accelerator: what differs there is what the engine renders differently for a CPU, at equal size.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

from harness import REPO_ROOT
from harness.config.compose import compose_run_config, run_config_to_dict
from harness.config.schema import RunConfig
from harness.config.standin import Gap, make_standin, unfounded_gaps, unlisted_differences
from harness.engines import engine_module
from harness.plan.construction import resolved_model_init

GPU_RECIPES = sorted(p.stem for p in (REPO_ROOT / "recipes").glob("gpu_*.yaml"))


def flat(value: Any, prefix: str) -> Dict[str, Any]:
    """Nested mappings as dotted keys (`zero_optimization.overlap_comm`); lists and empty mappings are values."""
    if not isinstance(value, dict) or not value:
        return {prefix: value}
    out: Dict[str, Any] = {}
    for key, item in value.items():
        out.update(flat(item, f"{prefix}.{key}" if prefix else str(key)))
    return out


def config_view(cfg: RunConfig) -> Dict[str, Any]:
    return {**flat(run_config_to_dict(cfg), ""), "model.init": resolved_model_init(cfg)}


def rendered_view(cfg: RunConfig, run_dir: Path) -> Dict[str, Any]:
    """`file:key` for every value of the JSON / YAML files the engine writes (a text file: its whole text),
    `env.NAME` for the launch environment, `argv` for the launch line."""
    run_dir.mkdir(parents=True)
    rendered = engine_module(cfg.engine.name).render(cfg, run_dir)
    view: Dict[str, Any] = {"argv": " ".join(rendered.argv).replace(str(run_dir), "RUN_DIR")}
    view.update({f"env.{name}": value for name, value in rendered.env.items()})
    for name in rendered.files:
        text = (run_dir / name).read_text()
        if name.endswith(".json"):
            view.update({f"{name}:{key}": v for key, v in flat(json.loads(text), "").items()})
        elif name.endswith((".yaml", ".yml")):
            view.update({f"{name}:{key}": v for key, v in flat(yaml.safe_load(text), "").items()})
        else:
            view[name] = text.replace(str(run_dir), "RUN_DIR")
    return view


def resolved_pair(recipe: str, tmp_path: Path):
    """(the recipe's resolved config, the stand-in's, the stand-in)."""
    cfg = compose_run_config([f"recipes={recipe}"])
    standin = make_standin(recipe, cfg, resolved_model_init(cfg))
    small = compose_run_config([f"recipes={recipe}", *standin.overrides])
    on_recipe_accelerator = replace(small, cluster=replace(small.cluster, accelerator=cfg.cluster.accelerator))
    recipe_view = {**config_view(cfg), **rendered_view(on_recipe_accelerator, tmp_path / "recipe")}
    standin_view = {**config_view(small), **rendered_view(small, tmp_path / "standin")}
    return recipe_view, standin_view, standin


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_every_difference_from_the_recipe_is_a_shrink_or_listed(recipe, tmp_path):
    recipe_view, standin_view, standin = resolved_pair(recipe, tmp_path)
    unlisted = unlisted_differences(recipe_view, standin_view, standin.gaps)
    assert not unlisted, "differs from the recipe, neither a shrink nor listed:\n" + "\n".join(unlisted)
    unfounded = unfounded_gaps(recipe_view, standin_view, standin.gaps)
    assert not unfounded, f"listed as not executed but the same as the recipe: {unfounded}"
    assert standin_view["model.init"] == recipe_view["model.init"]


def test_the_nd_recipes_build_on_the_meta_device_and_so_do_their_standins():
    # 70B / 405B / Mixtral: each of 8 local ranks would build every weight in fp32 (> half of host memory).
    for recipe in ("gpu_llama70b_nd_tp8_pp4", "gpu_llama405b_nd_tp8_pp16", "gpu_mixtral8x7b_nd_tp2_fsdp32"):
        cfg = compose_run_config([f"recipes={recipe}"])
        assert (cfg.model.init, resolved_model_init(cfg)) == ("auto", "meta"), recipe
        small = compose_run_config([f"recipes={recipe}", "standin=cpu"])
        assert (small.model.init, resolved_model_init(small)) == ("meta", "meta"), recipe
        # the same tiny model with `auto` would build whole: the stand-in follows the recipe, not its own size
        assert resolved_model_init(replace(small, model=replace(small.model, init="auto"))) == "full"


def test_deepspeed_cpu_switches_are_listed():
    cfg = compose_run_config(["recipes=gpu_llama8b_zero3_offload_1gpu"])
    gaps = make_standin("gpu_llama8b_zero3_offload_1gpu", cfg, "full").gaps
    named = {name for gap in gaps for name in gap.fields}
    assert {"ds_config.json:zero_optimization.overlap_comm",
            "ds_config.json:zero_optimization.offload_optimizer.pin_memory",
            "ds_config.json:zero_optimization.offload_param.pin_memory"} <= named


# The comparison itself.


def test_an_unlisted_difference_is_reported_with_both_values():
    recipe = {"layout.tp": 8, "layout.zero_stage": 3, "model.init": "meta", "cluster.name": "h100_8x8"}
    standin = {"layout.tp": 2, "layout.zero_stage": 2, "model.init": "full", "cluster.name": "local_slurm"}
    assert unlisted_differences(recipe, standin, []) == ["layout.zero_stage: 3 -> 2", "model.init: 'meta' -> 'full'"]
    assert unlisted_differences(recipe, standin, [Gap("why", ("layout.zero_stage", "model.init"))]) == []


def test_an_axis_that_stops_splitting_is_not_a_shrink():
    assert unlisted_differences({"layout.tp": 8}, {"layout.tp": 2}, []) == []
    assert unlisted_differences({"layout.tp": 8}, {"layout.tp": 1}, []) == ["layout.tp: 8 -> 1"]
    assert unlisted_differences({"layout.dp_shard": 1}, {"layout.dp_shard": 2}, []) == ["layout.dp_shard: 1 -> 2"]


def test_a_key_on_one_side_only_is_a_difference():
    assert unlisted_differences({}, {"env.DS_ACCELERATOR": "cpu"}, []) == ["env.DS_ACCELERATOR: None -> 'cpu'"]


def test_a_gap_naming_a_field_that_runs_is_unfounded():
    gaps = [Gap("a", ("x",)), Gap("b", ("y", "z")), Gap("runtime only")]
    assert unfounded_gaps({"x": 1, "y": 1}, {"x": 2, "y": 1}, gaps) == ["y"]
