"""Composition: every preset composes, typos and wrong types fail, overrides land where expected."""


import pytest
import yaml
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ConfigKeyError, ValidationError

from harness import REPO_ROOT
from harness.config.compose import compose_config, compose_run_config, run_config_from_dict, run_config_to_dict
from harness.config.schema import ENGINE_OPTIONS, PipelineSchedule, Precision

RECIPES = sorted(p.stem for p in (REPO_ROOT / "recipes").glob("*.yaml"))
MODELS = sorted(p.stem for p in (REPO_ROOT / "hydra_configs" / "model").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_composes_to_a_typed_run_config(recipe):
    run = compose_run_config([f"recipes={recipe}"])
    # The engine's own option dataclass, and every closed-set field holds a member of its enum.
    assert type(run.engine) is ENGINE_OPTIONS[run.engine.name]
    assert isinstance(run.layout.precision, Precision) and isinstance(run.layout.pp_schedule, PipelineSchedule)
    assert run_config_from_dict(run_config_to_dict(run)) == run
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


@pytest.mark.parametrize("overrides, line", [
    (["engine=fsdp", "engine.sequence_parallel=true"],
     "engine.sequence_parallel is an option of engine=nd / engine=megatron_lm, not a field of engine (FsdpOptions: "
     "name, launcher, compile, fsdp_version, backward_prefetch)"),
    (["engine=fsdp", "engine.compiled_ops=true"],
     "engine.compiled_ops is an option of engine=deepspeed, not a field of engine (FsdpOptions: name, launcher, "
     "compile, fsdp_version, backward_prefetch)"),
    (["engine=fsdp", "engine.compild=true"], "engine.compild is not a field of engine (did you mean 'compile'?)"),
    (["layout.precision=fp7"], "layout.precision='fp7' must be one of bf16, fp16, fp32, fp8 (did you mean 'fp8'?)"),
    (["tracking.mode=foo"], "tracking.mode='foo' must be one of offline, online"),
    (["launcher.backend=foo"], "launcher.backend='foo' must be one of local, slurm"),
    (["data.kind=csv"], "data.kind='csv' must be one of synthetic, text"),
    (["layout.pp_schedule=1f1b"], "layout.pp_schedule='1f1b' must be one of GPipe, 1F1B, Interleaved1F1B, "
                                  "LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV (did you mean '1F1B'?)"),
    (["engine.name=megatron2"], "engine.name='megatron2' must be one of deepspeed, fsdp, nd, megatron_lm "
                                "(did you mean 'megatron_lm'?)"),
])
def test_closed_sets_and_engine_options_fail_at_composition_in_one_line(overrides, line):
    from harness.config.errors import explain

    with pytest.raises(Exception) as refused:
        compose_run_config(overrides)
    assert explain(refused.value) == line


def test_each_engine_group_selects_its_option_dataclass():
    from harness.config.schema import DeepSpeedOptions, FsdpOptions, MegatronOptions, NdOptions

    expected = {"deepspeed": DeepSpeedOptions, "fsdp": FsdpOptions, "fsdp1": FsdpOptions, "nd": NdOptions,
                "megatron_lm": MegatronOptions}
    for group, options in expected.items():
        assert type(compose_run_config([f"engine={group}"]).engine) is options
    assert compose_run_config(["engine=fsdp1"]).engine.fsdp_version == 1
    # An option another engine owns reads as the value that leaves shared planner rules inert.
    assert compose_run_config(["engine=deepspeed"]).engine.sequence_parallel is False


def test_allowed_values_elsewhere_are_derived_from_the_enums():
    from harness.config.schema import Checkpointing, FlopAttention, PipelineSchedule, allowed
    from harness.plan import flops, support

    assert flops.CHECKPOINTING == allowed(Checkpointing) == ("none", "selective", "full")
    assert flops.ATTENTION_CONVENTIONS == allowed(FlopAttention)
    assert support.ALL_SCHEDULES == allowed(PipelineSchedule)


def test_sweep_group_is_in_the_defaults_list():
    run = compose_run_config(["sweep=cpu_grid"])
    assert (run.sweep_name, run.bench.steps) == ("cpu_grid", 10)


def test_point_names_carry_the_values_that_differ():
    from harness.config.naming import point_names

    points = [["engine=deepspeed", "layout.zero_stage=2", "bench.steps=2"],
              ["engine=deepspeed", "layout.zero_stage=3", "bench.steps=2"],
              ["engine=fsdp", "layout.zero_stage=3", "bench.steps=2"]]
    assert point_names(points, ["a", "b", "c"]) == ["000-deepspeed-zero2", "001-deepspeed-zero3", "002-fsdp-zero3"]
    assert point_names([["bench.steps=2"]], ["deepspeed-dp2_zero2"]) == ["000-deepspeed-dp2_zero2"]


def test_engine_compile_composes_on_every_engine_and_defaults_off():
    from harness.config.compose import compose_run_config

    assert compose_run_config([]).engine.compile is False
    for engine in ("nd", "fsdp", "deepspeed", "megatron_lm"):
        assert compose_run_config([f"engine={engine}", "engine.compile=true"]).engine.compile is True
