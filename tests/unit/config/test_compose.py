"""Composition: every preset composes, typos and wrong types fail, overrides land where expected."""


import pytest
import yaml
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ConfigKeyError, ValidationError

from harness import REPO_ROOT
from harness.config.compose import compose_config, compose_run_config, run_config_from_dict, run_config_to_dict
from harness.config.schema import RunConfig

RECIPES = sorted(p.stem for p in (REPO_ROOT / "recipes").glob("*.yaml"))
MODELS = sorted(p.stem for p in (REPO_ROOT / "hydra_configs" / "model").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_composes_to_a_typed_run_config(recipe):
    run = compose_run_config([f"recipes={recipe}"])
    assert isinstance(run, RunConfig)
    assert run.sweep_name != "adhoc", f"recipe {recipe} should name its sweep"


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipes_only_override(recipe):
    text = (REPO_ROOT / "recipes" / f"{recipe}.yaml").read_text()
    assert text.startswith("# @package _global_"), f"{recipe}.yaml must start with '# @package _global_'"
    defaults = yaml.safe_load(text).get("defaults", [])
    for entry in defaults:
        key = next(iter(entry)) if isinstance(entry, dict) else entry
        assert key.startswith("override /"), f"{recipe}.yaml defaults entry {entry!r} is not an override"


@pytest.mark.parametrize("model", MODELS)
def test_every_model_preset_holds_hf_fields(model):
    run = compose_run_config([f"model={model}"])
    assert run.model.name == model
    assert "model_type" in run.model.hf_config


def test_default_recipe_composes_to_exact_layout():
    run = compose_run_config(["recipes=cpu_zero2"])
    assert (run.engine.name, run.engine.launcher) == ("deepspeed", "torchrun")
    assert (run.layout.dp_shard, run.layout.zero_stage, run.layout.precision) == (2, 2, "bf16")
    assert (run.cluster.accelerator, run.cluster.accelerators_per_node) == ("cpu", 2)
    assert run.sweep_name == "cpu_zero2"


def test_command_line_override_beats_recipe():
    run = compose_run_config(["recipes=cpu_zero2", "layout.zero_stage=3", "bench.steps=3"])
    assert run.layout.zero_stage == 3 and run.bench.steps == 3


def test_misspelled_key_fails_at_composition():
    with pytest.raises(ConfigCompositionException, match="zero_stag"):
        compose_config(["layout.zero_stag=3"])


def test_appended_unknown_key_fails_before_use():
    # `+key=` bypasses Hydra's struct check; the typed RunConfig every command builds still refuses it.
    with pytest.raises(ConfigKeyError, match="zero_stag"):
        compose_run_config(["+layout.zero_stag=3"])


def test_wrong_type_fails_at_composition():
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose_config(["layout.tp=two"])


def test_unknown_recipe_and_model_fail_with_their_names():
    with pytest.raises(MissingConfigException, match="no_such_recipe"):
        compose_config(["recipes=no_such_recipe"])
    with pytest.raises(MissingConfigException, match="no_such_model"):
        compose_config(["model=no_such_model"])


def test_typo_inside_a_preset_file_fails(tmp_path, monkeypatch):
    bad = REPO_ROOT / "recipes" / "zz_test_typo.yaml"
    bad.write_text("# @package _global_\nlayout:\n  micro_bach: 4\n")
    try:
        with pytest.raises(ConfigCompositionException):
            compose_config(["recipes=zz_test_typo"])
    finally:
        bad.unlink()


def test_resolved_config_round_trips_through_json():
    run = compose_run_config(["recipes=cpu_zero2", "layout.pp_stage_layers=[1,1]"])
    assert run_config_from_dict(run_config_to_dict(run)) == run


def test_run_label_names_the_layout_values():
    from harness.config.naming import run_label

    run = compose_run_config(["recipes=cpu_zero2", "layout.zero_stage=3", "layout.offload_params=cpu"])
    assert run_label(run) == "deepspeed dp2 z3 param->cpu mb2x1 s64 bf16"
