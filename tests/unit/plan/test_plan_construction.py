"""model.init: where ranks build the model, decided from the engine and the host memory a full build takes."""

import pytest

from harness.config.compose import compose_run_config
from harness.plan.construction import FULL_BUILD_HOST_FRACTION, check_model_init, full_build_bytes, model_init_mode
from harness.plan.planner import make_plan, spec_for

GIB = 2**30


def test_full_build_bytes_is_fp32_weights_on_every_local_rank():
    # Llama-3.1-70B: 70,553,706,496 parameters x 4 bytes x 8 ranks = 2.05 TiB on one node.
    assert full_build_bytes(70_553_706_496, 8) == 2_257_718_607_872


@pytest.mark.parametrize("recipe, mode", [
    ("gpu_llama70b_nd_tp8_pp4", "meta"),  # 2.05 TiB of full copies > half of 2 TiB of host memory
    ("gpu_llama405b_nd_tp8_pp16", "meta"),
    ("gpu_llama8b_fsdp_8gpu", "full"),  # 240 GiB: fits beside everything else
    ("cpu_nd_tp2", "full"),
])  # fmt: skip
def test_auto_builds_on_meta_exactly_when_full_copies_crowd_the_host(recipe, mode):
    cfg = compose_run_config([f"recipes={recipe}"])
    spec = spec_for(cfg.model)
    assert model_init_mode(cfg.engine.name, cfg.layout.zero_stage, "auto", spec.total_params,
                           cfg.cluster.accelerators_per_node, cfg.cluster.host_memory_gib) == mode  # fmt: skip


def test_auto_stays_full_where_the_engine_builds_full_models_and_warns_with_the_numbers():
    errors, warnings = check_model_init("deepspeed", 2, "auto", 70_553_706_496, 4, 2048.0)
    assert errors == ()
    assert warnings == (f"model.init=auto: 4 ranks per node each build all 70.55B parameters in fp32 (1051.3 GiB) "
                        f"before sharding, more than {FULL_BUILD_HOST_FRACTION:.0%} of cluster.host_memory_gib=2048",)
    # Beyond the host's memory the node runs out before anything is sharded: refused, naming the way out.
    errors, warnings = check_model_init("deepspeed", 2, "auto", 70_553_706_496, 8, 2048.0)
    assert errors == ("model.init=auto: 8 ranks per node each build all 70.55B parameters in fp32 (2102.7 GiB) "
                      "before sharding, more than cluster.host_memory_gib=2048: the host runs out of memory first "
                      "(sharded construction: engine=deepspeed at zero_stage 3; engine=nd at zero_stage 0, 2, 3)",)
    assert warnings == ()
    # Megatron-LM builds its own model, already split by tp and pp: the harness builds nothing to refuse.
    assert check_model_init("megatron_lm", 1, "auto", 405_853_388_800, 8, 2048.0) == ((), ())
    assert model_init_mode("deepspeed", 2, "auto", 70_553_706_496, 8, 2048.0) == "full"
    assert model_init_mode("deepspeed", 3, "auto", 70_553_706_496, 8, 2048.0) == "meta"  # zero.Init
    assert model_init_mode("fsdp", 3, "auto", 70_553_706_496, 8, 2048.0) == "full"


def test_meta_on_an_engine_that_builds_full_models_is_refused_at_plan_time():
    plan = make_plan(compose_run_config(["recipes=cpu_zero2", "model.init=meta"]))
    assert any("model.init=meta: engine=deepspeed with zero_stage=2 builds the full model on every rank" in e
               and "engine=deepspeed at zero_stage 3" in e for e in plan.errors)
    assert make_plan(compose_run_config(["recipes=cpu_zero3", "model.init=meta"])).errors == ()


def test_unknown_init_is_refused_naming_the_choices():
    from harness.config.errors import explain

    with pytest.raises(Exception) as refused:
        compose_run_config(["recipes=cpu_nd_tp2", "model.init=lazy"])
    assert explain(refused.value) == "model.init='lazy' must be one of auto, full, meta"


def test_explicit_choices_are_kept():
    assert model_init_mode("nd", 0, "full", 10**12, 8, 2048.0) == "full"
    assert model_init_mode("nd", 0, "meta", 10, 1, 2048.0) == "meta"


def test_nvme_parameter_offload_builds_inside_zero_init():
    """A tiny model that fits anywhere still builds inside zero.Init when ZeRO-3 puts its parameters on NVMe
    (the parameter swapper then takes the config's precision, not DeepSpeed's accelerator guess)."""
    assert model_init_mode("deepspeed", 3, "auto", 10**6, 2, 24.0) == "full"
    assert model_init_mode("deepspeed", 3, "auto", 10**6, 2, 24.0, offload_params="nvme") == "meta"
    assert model_init_mode("deepspeed", 3, "auto", 10**6, 2, 24.0, offload_params="cpu") == "full"
    assert model_init_mode("deepspeed", 3, "full", 10**6, 2, 24.0, offload_params="nvme") == "full"
