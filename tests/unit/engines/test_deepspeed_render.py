"""Every ds_config.json the renderer can write passes DeepSpeed's own validator (DeepSpeedConfig)."""

import itertools
import json
from dataclasses import replace

import deepspeed
import pytest

from harness.config.compose import compose_run_config
from harness.engines import deepspeed as ds_engine
from harness.plan.conventions import DEEPSPEED_BUCKET_NUMEL, deepspeed_overlap_comm


class _DataParallel:
    """The `mpu` DeepSpeedConfig asks for the data-parallel size (no process group needed)."""

    def __init__(self, size: int):
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


def validate_with_deepspeed(config: dict, dp_size: int, monkeypatch):
    from deepspeed.runtime.config import DeepSpeedConfig

    monkeypatch.setattr(deepspeed.comm, "get_rank", lambda *a, **k: 0)
    return DeepSpeedConfig(json.loads(json.dumps(config)), mpu=_DataParallel(dp_size))


# Composed once; each grid point replaces layout fields (composition is the slow part).
BASE = compose_run_config(["recipes=cpu_zero2", "cluster.accelerators_per_node=4", "cluster=h100_8x8"])

GRID = [
    dict(zero=z, precision=p, offload_optimizer=oo, offload_params=op, tp=tp, accum=ga)
    for z, p, oo, op, tp, ga in itertools.product(
        (0, 1, 2, 3), ("bf16", "fp16", "fp32"), ("none", "cpu", "nvme"), ("none", "cpu", "nvme"), (1, 2), (1, 4)
    )
    # Only what the planner lets through: offload needs ZeRO >= 1, params offload ZeRO-3.
    if not (oo != "none" and z == 0) and not (op != "none" and z != 3)
]


@pytest.mark.parametrize("point", GRID, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_rendered_config_passes_deepspeeds_validator(point, monkeypatch):
    dp = 4 // point["tp"]
    layout = replace(
        BASE.layout, dp_shard=dp, tp=point["tp"], zero_stage=point["zero"], precision=point["precision"],
        offload_optimizer=point["offload_optimizer"], offload_params=point["offload_params"],
        nvme_path="/local_nvme", grad_accum=point["accum"], micro_batch=2,
    )  # fmt: skip
    run = replace(BASE, layout=layout)
    config = ds_engine.ds_config(run)
    # deepspeed.initialize validates with the whole world (AutoTP ranks included) when no mpu is given.
    parsed = validate_with_deepspeed(config, 4, monkeypatch)
    assert parsed.zero_optimization_stage == point["zero"]
    assert parsed.train_batch_size == 2 * point["accum"] * 4
    assert parsed.gradient_accumulation_steps == point["accum"]
    assert parsed.bfloat16_config.enabled == (point["precision"] == "bf16")
    assert parsed.float16_config.enabled == (point["precision"] == "fp16")
    zero = parsed.zero_config
    if point["zero"] >= 1:  # the bucket and its double buffering as the plan counts them (plan.memory)
        assert zero.reduce_bucket_size == DEEPSPEED_BUCKET_NUMEL and zero.contiguous_gradients
        assert zero.overlap_comm == deepspeed_overlap_comm(point["zero"], run.cluster.accelerator)
    if point["offload_optimizer"] != "none":
        assert zero.offload_optimizer.device == point["offload_optimizer"]
        if point["offload_optimizer"] == "nvme":
            assert str(zero.offload_optimizer.nvme_path) == "/local_nvme"
    else:
        assert zero.offload_optimizer is None or zero.offload_optimizer.device == "none"
    if point["offload_params"] != "none":
        assert zero.offload_param.device == point["offload_params"]
    if point["tp"] > 1:
        assert parsed.tensor_parallel_config.autotp_size == point["tp"]


def test_renderer_writes_only_known_top_level_keys():
    # DeepSpeed silently accepts a misspelled top-level key, so the renderer guards its own output.
    run = compose_run_config(["recipes=cpu_zero2", "layout.tp=2", "layout.dp_shard=1"])
    assert set(ds_engine.ds_config(run)) <= ds_engine.KNOWN_TOP_LEVEL_KEYS


def test_validator_would_catch_a_bad_nested_key(monkeypatch):
    run = compose_run_config(["recipes=cpu_zero2"])
    config = ds_engine.ds_config(run)
    config["zero_optimization"]["stagee"] = 2
    with pytest.raises(Exception, match="stagee"):
        validate_with_deepspeed(config, 2, monkeypatch)


def test_cpu_render_skips_jit_ops_and_names_cpu_accelerator(tmp_path):
    run = compose_run_config(["recipes=cpu_zero2"])
    rendered = ds_engine.render(run, tmp_path)
    config = json.loads((tmp_path / "ds_config.json").read_text())
    assert config["optimizer"]["params"]["torch_adam"] is True
    assert config["zero_optimization"] == {"stage": 2, "reduce_bucket_size": DEEPSPEED_BUCKET_NUMEL,
                                           "contiguous_gradients": True, "overlap_comm": False}
    assert rendered.env["DS_ACCELERATOR"] == "cpu"
    assert rendered.argv[:5] == ["torchrun", "--nnodes", "1", "--nproc_per_node", "2"]
    assert rendered.argv[-3:] == ["-m", "harness.runtime.bench", str(tmp_path)]


PP_GRID = [
    dict(zero=z, precision=p, dp=dp, accum=ga, offload=oo)
    for z, p, dp, ga, oo in itertools.product((0, 1), ("bf16", "fp32"), (1, 2), (2, 4), ("none", "cpu"))
    if not (oo != "none" and z == 0)
]


@pytest.mark.parametrize("point", PP_GRID, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_pipeline_config_passes_deepspeeds_validator(point, monkeypatch):
    # pp=2 x dp ranks; the PipelineModule's grid is the mpu, so the batch check counts data-parallel ranks.
    layout = replace(
        BASE.layout, pp=2, dp_shard=point["dp"], zero_stage=point["zero"], precision=point["precision"],
        grad_accum=point["accum"], micro_batch=2, offload_optimizer=point["offload"],
    )  # fmt: skip
    config = ds_engine.ds_config(replace(BASE, layout=layout))
    parsed = validate_with_deepspeed(config, point["dp"], monkeypatch)
    assert parsed.train_batch_size == 2 * point["accum"] * point["dp"]
    assert parsed.gradient_accumulation_steps == point["accum"]  # the pipeline's micro-batches
    assert parsed.zero_optimization_stage == point["zero"]


PP2 = ["recipes=cpu_zero1_pp2"]


def test_pipeline_parallel_renders_for_launch(tmp_path):
    from harness.launch.prepare import prepare_run

    prepared = prepare_run(compose_run_config(PP2), tmp_path)
    config = json.loads((tmp_path / "ds_config.json").read_text())
    assert prepared.rendered.argv[:5] == ["torchrun", "--nnodes", "1", "--nproc_per_node", "2"]
    assert (config["train_batch_size"], config["gradient_accumulation_steps"]) == (4, 4)
    assert config["zero_optimization"] == {"stage": 1, "reduce_bucket_size": DEEPSPEED_BUCKET_NUMEL}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["layout.zero_stage=2"], "engine=deepspeed rejects zero_stage=2 with pp=2"),
        (["layout.zero_stage=3"], "engine=deepspeed rejects zero_stage=3 with pp=2"),
        (["model.hf_config.tie_word_embeddings=true"], "tie_word_embeddings=true with pp=2: engine=deepspeed"),
        (["layout.tp=2", "cluster.accelerators_per_node=4"], "layout.tp=2 with pp=2: engine=deepspeed"),
        (["model=gpt2"], "model_type=gpt2 with pp=2: engine=deepspeed"),
        (["layout.zero_stage=0"], "precision=bf16 zero_stage=0 with pp=2: DeepSpeed's PipelineEngine"),
        (["+model.hf_config.attn_implementation=eager"], "attn_implementation=eager with pp=2: engine=deepspeed"),
    ],
)
def test_pipeline_layouts_deepspeed_cannot_run_are_refused_before_launch(overrides, message, tmp_path):
    from harness.launch.prepare import RunRejected, prepare_run

    with pytest.raises(RunRejected, match=message):
        prepare_run(compose_run_config([*PP2, *overrides]), tmp_path)
    assert not (tmp_path / "rendered.json").exists()


@pytest.mark.parametrize(
    "layers, explicit, stages",
    [(2, [], [[0], [1]]), (4, [], [[0, 1], [2, 3]]), (4, [1, 3], [[0], [1, 2, 3]]), (4, [0, 4], [[], [0, 1, 2, 3]])],
)
def test_stage_layers_follow_the_planners_split(layers, explicit, stages):
    run = compose_run_config(PP2)
    run = replace(run, layout=replace(run.layout, pp_stage_layers=explicit))
    assert ds_engine.stage_layers(run, layers) == stages


def test_compile_writes_deepspeeds_compile_section_which_its_validator_reads(monkeypatch):
    eager = ds_engine.ds_config(BASE)
    compiled = ds_engine.ds_config(replace(BASE, engine=replace(BASE.engine, compile=True)))
    assert "compile" not in eager
    assert compiled["compile"] == {"deepcompile": False}
    parsed = validate_with_deepspeed(compiled, ds_engine.ranks_in_batch_check(BASE), monkeypatch)
    assert parsed.compile_config.deepcompile is False
    # The section reaches DeepSpeed's CompileConfig: a misspelled key in it is refused there.
    with pytest.raises(Exception, match="deepcompil"):
        validate_with_deepspeed({**compiled, "compile": {"deepcompil": True}}, ds_engine.ranks_in_batch_check(BASE),
                                monkeypatch)


def test_compile_with_a_pipeline_is_refused_before_launch(tmp_path):
    from harness.launch.prepare import RunRejected, prepare_run

    with pytest.raises(RunRejected, match="engine.compile=true with pp=2: engine=deepspeed"):
        prepare_run(compose_run_config([*PP2, "engine.compile=true"]), tmp_path)


def test_selective_checkpointing_is_refused_as_deepspeed_runs_none_of_it():
    """deepspeed_session.apply checkpoints whole decoder layers or none: `selective` ran as none while the plan
    predicted a recompute, and the recommender offered it as a separate, slower choice."""
    from harness.engines.admission import judge
    from harness.engines.deepspeed import check

    for pp in (1, 2):
        cfg = compose_run_config(["recipes=cpu_zero1_pp2" if pp > 1 else "recipes=cpu_zero2",
                                  "layout.activation_checkpointing=selective"])
        errors, _ = check(cfg)
        assert any("engine=deepspeed checkpoints whole decoder layers" in error for error in errors), errors
        assert not judge(cfg).admitted
    assert not check(compose_run_config(["recipes=cpu_zero2", "layout.activation_checkpointing=full"]))[0]
