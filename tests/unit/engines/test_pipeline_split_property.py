"""Over random pipeline layouts, every engine builds the stages the planner counts.

For each random (pp, virtual stages, layers, explicit or even split, schedule) the layers of every stage as each
engine renders them (nd's nd_plan.json stages, DeepSpeed's PipelineModule stage list, Megatron-LM's
--pipeline-model-parallel-layout / --num-layers-per-virtual-pipeline-stage) equal harness.plan.pipeline's split,
and the layers each pipeline rank holds equal what the planner's state prediction counts for that rank.
"""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config.compose import compose_run_config
from harness.engines import deepspeed, megatron_lm, nd_plans
from harness.plan.model_spec import model_spec_from_hf
from harness.plan.pipeline import V_SCHEDULES, rank_stages, stage_layer_counts, stage_to_rank
from harness.plan.states import rank_states

ND = compose_run_config(["engine=nd", "layout=single", "layout.precision=fp32", "layout.zero_stage=0"])
DEEPSPEED = compose_run_config(["recipes=cpu_zero2", "layout.zero_stage=1", "layout.precision=fp32"])
MEGATRON = compose_run_config(["engine=megatron_lm", "model=llama3_1_70b", "cluster=h100_8x8", "layout=single",
                               "layout.zero_stage=0"])  # fmt: skip


@st.composite
def pipeline_layouts(draw, schedules):
    schedule = draw(st.sampled_from(schedules))
    pp = draw(st.integers(2, 6))
    virtual = 2 if schedule in V_SCHEDULES else 1 if schedule in ("GPipe", "1F1B") else draw(st.integers(2, 3))
    stages = pp * virtual
    if draw(st.booleans()):  # explicit, usually uneven: the ends may hold no layer, the middle at least one
        ends = draw(st.lists(st.integers(0, 4), min_size=2, max_size=2))
        middle = draw(st.lists(st.integers(1, 4), min_size=stages - 2, max_size=stages - 2))
        explicit = [ends[0], *middle, max(ends[1], 1 - ends[0] - sum(middle))]  # a model has >= 1 layer
        return schedule, pp, virtual, sum(explicit), explicit
    return schedule, pp, virtual, stages * draw(st.integers(1, 3)), []


def with_pipeline(cfg, schedule, pp, virtual, layers, explicit):
    layout = replace(cfg.layout, pp=pp, pp_virtual_stages=virtual, pp_schedule=schedule, pp_stage_layers=explicit,
                     grad_accum=2 * pp * virtual, dp_shard=1, dp_replicate=1, tp=1, cp=1)  # fmt: skip
    model = replace(cfg.model, hf_config={**cfg.model.hf_config, "num_hidden_layers": layers})
    cluster = replace(cfg.cluster, nodes=1, accelerators_per_node=pp)
    return replace(cfg, layout=layout, model=model, cluster=cluster)


def assert_planner_counts(cfg, engine_counts):
    """The planner's split equals the engine's, and so do the layers of each rank it predicts states for."""
    layout, layers = cfg.layout, cfg.model.hf_config["num_hidden_layers"]
    assert list(stage_layer_counts(layers, layout.pp, layout.pp_virtual_stages, layout.pp_stage_layers)) == engine_counts
    spec = model_spec_from_hf(cfg.model.name, cfg.model.hf_config)
    for states in rank_states(spec, layout, cfg.engine.name, cfg.engine.fsdp_version):
        local = rank_stages(layout.pp_schedule, layout.pp, layout.pp_virtual_stages, states.rank)
        assert states.layers == sum(engine_counts[s] for s in local)


@settings(max_examples=60, deadline=None)
@given(pipeline_layouts(("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                         "ZBVZeroBubble", "DualPipeV")))  # fmt: skip
def test_nd_stages_equal_the_planners(point):
    cfg = with_pipeline(ND, *point)
    assert nd_plans.check(cfg)[0] == []
    plan = nd_plans.nd_plan(cfg)["pipeline"]
    counts = [len(stage["layers"]) for stage in plan["stages"]]
    assert [s["pp_rank"] for s in plan["stages"]] == [stage_to_rank(s, cfg.layout.pp, point[0])
                                                      for s in range(len(counts))]  # fmt: skip
    assert_planner_counts(cfg, counts)


@settings(max_examples=40, deadline=None)
@given(pipeline_layouts(("1F1B",)))
def test_deepspeed_stages_equal_the_planners(point):
    cfg = with_pipeline(DEEPSPEED, *point)
    assert deepspeed.check(cfg)[0] == []
    stages = deepspeed.stage_layers(cfg, cfg.model.hf_config["num_hidden_layers"])
    assert [index for stage in stages for index in stage] == list(range(cfg.model.hf_config["num_hidden_layers"]))
    assert_planner_counts(cfg, [len(stage) for stage in stages])


def megatron_stage_counts(flags, pp):
    """Layers per stage as Megatron-LM reads its flags: the layout string, or layers per virtual stage."""
    if "--pipeline-model-parallel-layout" in flags:
        stages = flags["--pipeline-model-parallel-layout"].split("|")
        return [int(text.split("t*")[1].rstrip("L")) if "t*" in text else 0 for text in stages]
    per_stage = flags.get("--num-layers-per-virtual-pipeline-stage", flags["--num-layers"] // pp)
    return [per_stage] * (flags["--num-layers"] // per_stage)


@settings(max_examples=40, deadline=None)
@given(pipeline_layouts(("1F1B", "Interleaved1F1B")))
def test_megatron_stages_equal_the_planners(point):
    cfg = with_pipeline(MEGATRON, *point)
    assert megatron_lm.check(cfg)[0] == []
    assert_planner_counts(cfg, megatron_stage_counts(megatron_lm.megatron_flags(cfg), cfg.layout.pp))
