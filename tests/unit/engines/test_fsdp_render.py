"""accelerate.yaml means what we intend: read back by Accelerate's own loader, turned into the environment
`accelerate launch` gives the ranks, and parsed there by FullyShardedDataParallelPlugin / ParallelismConfig."""

import itertools
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType
from accelerate.utils.launch import prepare_multi_gpu_env
from torch.distributed.fsdp import BackwardPrefetch as TorchBackwardPrefetch
from torch.distributed.fsdp import (
    CPUOffload,
    CPUOffloadPolicy,
    OffloadPolicy,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from harness.config.compose import compose_run_config
from harness.config.schema import BackwardPrefetch
from harness.engines import fsdp, fsdp_session
from harness.engines.lm_loss import shifted_labels
from harness.engines.rendered import RANK_PROGRAM
from harness.launch.local import free_port

LAYER = "LlamaDecoderLayer"
# Composed once (composition is the slow part); each grid point replaces fields.
BASE = compose_run_config(["engine=fsdp", "cluster.accelerators_per_node=4"])
LAUNCH_PREFIXES = ("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_")

GRID = [
    dict(version=v, zero=z, replicate=r, offload=o, checkpointing=ac, precision=p, accelerator=a)
    for v, z, r, o, ac, p, a in itertools.product(
        (1, 2), (0, 2, 3), (1, 2), (False, True), ("none", "full"), ("bf16", "fp32"), ("cpu", "h100_sxm")
    )
]


def run_config(point):
    layout = replace(
        BASE.layout, zero_stage=point["zero"], dp_replicate=point["replicate"], dp_shard=4 // point["replicate"],
        offload_params="cpu" if point["offload"] else "none", offload_optimizer="cpu" if point["offload"] else "none",
        activation_checkpointing=point["checkpointing"], precision=point["precision"],
    )  # fmt: skip
    engine = replace(BASE.engine, fsdp_version=point["version"])
    cluster = replace(BASE.cluster, accelerator=point["accelerator"])
    return replace(BASE, layout=layout, engine=engine, cluster=cluster)


RENDERABLE = [p for p in GRID if not fsdp.layout_problems(run_config(p))]


def point_id(point):
    return "-".join(f"{k[:4]}{v}" for k, v in point.items())


@pytest.fixture
def fixed_layer_class(monkeypatch):
    """The grid does not need a meta-device model per point; wrap_class_name has its own test."""
    monkeypatch.setattr(fsdp, "wrap_class_name", lambda hf_config: LAYER)


def launcher_environment(rendered) -> dict:
    """The variables `accelerate launch` exports to the ranks for this launch line (its own code)."""
    argv = rendered.argv_for("0", "127.0.0.1", str(free_port()))
    assert argv[:2] == ["accelerate", "launch"]
    args = launch_command_parser().parse_args(argv[2:])
    args, _, _ = _validate_launch_command(args)
    assert args.use_fsdp and not args.cpu  # the FSDP branch of launch_command: multi_gpu_launcher
    env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith(LAUNCH_PREFIXES)}


@pytest.fixture
def as_launched(monkeypatch):
    """Put a launcher environment in place of this process's own (nothing of the test's leaks in)."""

    def install(env: dict) -> None:
        for key in list(os.environ):
            if key.startswith(LAUNCH_PREFIXES):
                monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)

    return install


def test_grid_covers_every_strategy_version_and_option():
    seen = {(p["version"], p["zero"], p["replicate"] > 1, p["offload"], p["checkpointing"], p["precision"])
            for p in RENDERABLE}  # fmt: skip
    assert (2, 3, True, False, "full", "bf16") in seen  # HSDP
    assert (2, 0, True, False, "none", "fp32") in seen  # NO_SHARD as a replicate-only mesh
    assert (2, 3, False, True, "none", "bf16") in seen  # CPU offload
    assert (1, 2, False, False, "full", "bf16") in seen
    assert (1, 3, False, True, "none", "fp32") in seen  # FSDP1 offload: GPU clusters only
    assert len(RENDERABLE) > 40


@pytest.mark.parametrize("point", RENDERABLE, ids=point_id)
def test_rendered_yaml_reads_back_through_accelerate(point, tmp_path, fixed_layer_class):
    cfg = run_config(point)
    fsdp.render(cfg, tmp_path)
    loaded = load_config_from_file(str(tmp_path / fsdp.CONFIG_FILE))
    assert isinstance(loaded, ClusterConfig)  # unknown top-level keys would have raised
    assert loaded.distributed_type == DistributedType.FSDP
    assert loaded.mixed_precision == {"bf16": "bf16", "fp32": "no"}[point["precision"]]
    assert (loaded.num_machines, loaded.num_processes) == (1, 4)
    config = loaded.fsdp_config
    assert config["fsdp_version"] == point["version"]
    assert config["fsdp_transformer_layer_cls_to_wrap"] == LAYER
    assert config["fsdp_offload_params"] is point["offload"]
    assert config["fsdp_activation_checkpointing"] is (point["checkpointing"] == "full")
    # fsdp_config is a free dict to the loader: every key must be an `accelerate launch` argument.
    known = vars(launch_command_parser().parse_args(["x.py"]))
    assert set(config) <= set(known), sorted(set(config) - set(known))
    assert set(loaded.parallelism_config) <= set(known)


@pytest.mark.parametrize("point", RENDERABLE, ids=point_id)
def test_launcher_environment_parses_to_the_intended_plugin(point, tmp_path, fixed_layer_class, as_launched):
    cfg = run_config(point)
    as_launched(launcher_environment(fsdp.render(cfg, tmp_path)))
    settings = fsdp_session.launched_settings(world_size=4)
    plugin = settings.plugin
    assert plugin.fsdp_version == point["version"]
    assert plugin.activation_checkpointing is (point["checkpointing"] == "full")
    assert plugin.auto_wrap_policy is transformer_auto_wrap_policy
    assert plugin.transformer_cls_names_to_wrap == [LAYER]
    assert settings.precision == {"bf16": "bf16", "fp32": "no"}[point["precision"]]
    assert settings.offload is point["offload"]
    if point["version"] == 2:
        assert plugin.reshard_after_forward is (point["zero"] == 3)
        assert isinstance(plugin.cpu_offload, CPUOffloadPolicy if point["offload"] else OffloadPolicy)
        replicate = 4 if point["zero"] == 0 else point["replicate"]
        assert (settings.replicate, settings.shard) == (replicate, 4 // replicate)
    else:
        # The launcher also exports its FULL_SHARD default: the YAML's strategy must win over it.
        expected = {0: ShardingStrategy.NO_SHARD, 2: ShardingStrategy.SHARD_GRAD_OP, 3: ShardingStrategy.FULL_SHARD}
        assert plugin.sharding_strategy == expected[point["zero"]]
        assert plugin.sync_module_states is False  # True needs an accelerator device to init on
        assert plugin.use_orig_params is False  # flat parameters: the state bytes convention
        assert isinstance(plugin.cpu_offload, CPUOffload) and plugin.cpu_offload.offload_params is point["offload"]
        assert (settings.replicate, settings.shard) == (1, 4)


@pytest.mark.parametrize("prefetch", list(BackwardPrefetch))
def test_fsdp1_backward_prefetch_reaches_the_plugin(prefetch, tmp_path, fixed_layer_class, as_launched):
    point = dict(GRID[0], version=1, zero=3)
    cfg = run_config(point)
    cfg = replace(cfg, engine=replace(cfg.engine, backward_prefetch=prefetch))
    as_launched(launcher_environment(fsdp.render(cfg, tmp_path)))
    plugin = fsdp_session.launched_settings(world_size=4).plugin
    # NO_PREFETCH: Accelerate's plugin holds None, what FullyShardedDataParallel takes for no prefetch
    expected = None if prefetch == BackwardPrefetch.NO_PREFETCH else TorchBackwardPrefetch[prefetch.value]
    assert plugin.backward_prefetch == expected


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp32", None)])
def test_mixed_precision_keeps_fp32_master_and_fp32_reduction(precision, dtype):
    policy = fsdp_session.fsdp2_mixed_precision({"bf16": "bf16", "fp32": "no"}[precision])
    assert (policy.param_dtype, policy.output_dtype) == (dtype, None)
    assert policy.reduce_dtype == (torch.float32 if dtype else None)
    fsdp1 = fsdp_session.fsdp1_mixed_precision({"bf16": "bf16", "fp32": "no"}[precision])
    if dtype is None:
        assert fsdp1 is None
    else:
        assert (fsdp1.param_dtype, fsdp1.reduce_dtype, fsdp1.buffer_dtype) == (dtype, torch.float32, None)


def test_launch_line_is_accelerate_with_the_rendered_config(tmp_path, fixed_layer_class):
    cfg = replace(BASE, layout=replace(BASE.layout, zero_stage=3, dp_shard=4))
    rendered = fsdp.render(cfg, tmp_path)
    assert rendered.argv[:2] == ["accelerate", "launch"]
    index = rendered.argv.index("--config_file")
    assert rendered.argv[index + 1] == str(tmp_path / fsdp.CONFIG_FILE)
    assert rendered.argv[-3:] == [*RANK_PROGRAM, str(tmp_path)]
    assert rendered.files == [fsdp.CONFIG_FILE] and rendered.engine == "fsdp"
    assert (Path(rendered.run_dir) / fsdp.CONFIG_FILE).exists()


@pytest.mark.parametrize(
    "model, layer",
    [("tiny_llama", "LlamaDecoderLayer"), ("gpt2", "GPT2Block"), ("mistral_7b", "MistralDecoderLayer"),
     ("qwen2_5_7b", "Qwen2DecoderLayer"), ("mixtral_8x7b", "MixtralDecoderLayer"),
     ("llama3_1_405b", "LlamaDecoderLayer")],
)  # fmt: skip
def test_wrap_class_comes_from_the_model(model, layer):
    cfg = compose_run_config(["engine=fsdp", f"model={model}"])
    assert fsdp.wrap_class_name(cfg.model.hf_config) == layer


@pytest.mark.parametrize("model", ["tiny_llama", "gpt2", "mixtral_8x7b"])
def test_the_cached_wrap_class_is_the_one_the_built_model_holds(model):
    """The shape records the class `decoder_layer_class` finds in the model the ranks build."""
    from harness.modeling.model import build_model, decoder_layer_class

    cfg = compose_run_config(["engine=fsdp", f"model={model}"])
    built = build_model(cfg.model.hf_config, seed=0, on_meta=True)
    assert fsdp.wrap_class_name(cfg.model.hf_config) == decoder_layer_class(built).__name__


def test_a_model_without_a_decoder_layer_class_is_refused_by_name():
    from harness.config.model_shape import wrapped_layer

    with pytest.raises(ValueError, match=r"Odd declares no decoder layer class in _no_split_modules=\[\]"):
        wrapped_layer({"decoder_layer": None, "architecture": "Odd", "no_split_modules": []})


REFUSED = [
    (["layout.zero_stage=1"], "does not support zero_stage=1 (FSDP has no optimizer-only sharding level)"),
    (["layout.tp=2", "layout.dp_shard=1"], "runs tp=2 on GPU only"),
    (["layout.cp=2", "layout.dp_shard=1"], "runs cp=2 on GPU only"),
    (["layout.pp=2", "layout.dp_shard=1"], "does not support pp=2"),
    (["engine.fsdp_version=1", "layout.zero_stage=3", "layout.dp_replicate=2", "layout.dp_shard=1"],
     "layout.dp_replicate=2"),
    (["layout.zero_stage=3", "layout.offload_params=nvme", "layout.offload_optimizer=nvme"],
     "offload_params=nvme at zero_stage=3 is not supported"),
    (["layout.zero_stage=3", "layout.offload_params=cpu"], "offload_optimizer=none must equal offload_params=cpu"),
    (["layout.zero_stage=2", "layout.offload_params=cpu", "layout.offload_optimizer=cpu"],
     "offload_params=cpu at zero_stage=2 is not supported (zero_stage in 3)"),
    (["engine.fsdp_version=1", "layout.zero_stage=3", "layout.offload_params=cpu", "layout.offload_optimizer=cpu"],
     "pins"),
    (["layout.activation_checkpointing=selective"], "selective"),
    (["layout.precision=fp16"], "fp16"),
    (["engine.launcher=torchrun"], "engine.launcher='torchrun'"),
    (["layout.dp_shard=4"], "must equal cluster.nodes="),
]  # fmt: skip


@pytest.mark.parametrize("overrides, phrase", REFUSED, ids=[r[1] for r in REFUSED])
def test_layouts_fsdp_cannot_run_are_refused_by_name(overrides, phrase, tmp_path):
    cfg = compose_run_config(["engine=fsdp", "layout.zero_stage=3", *overrides])
    problems = fsdp.layout_problems(cfg)
    assert any(phrase in problem for problem in problems), problems
    with pytest.raises(ValueError, match="engine=fsdp cannot run this layout"):
        fsdp.render(cfg, tmp_path)
    assert not (tmp_path / fsdp.CONFIG_FILE).exists()


def test_launched_settings_refuse_another_launcher(as_launched):
    as_launched({})
    with pytest.raises(RuntimeError, match="ACCELERATE_USE_FSDP"):
        fsdp_session.launched_settings(world_size=2)


FSDP_RECIPES = sorted(p.stem for p in (Path(__file__).resolve().parents[3] / "recipes").glob("cpu_fsdp*.yaml"))
FSDP_LAYOUTS = sorted(
    p.stem for p in (Path(__file__).resolve().parents[3] / "hydra_configs" / "layout").glob("fsdp_*.yaml")
)


@pytest.mark.parametrize("recipe", FSDP_RECIPES)
def test_fsdp_recipes_compose_plan_and_render(recipe, tmp_path):
    from harness.plan.planner import make_plan

    cfg = compose_run_config([f"recipes={recipe}"])
    assert cfg.engine.name == "fsdp" and cfg.engine.launcher == "accelerate"
    plan = make_plan(cfg)
    assert not plan.errors and plan.fits
    fsdp.render(cfg, tmp_path)
    assert load_config_from_file(str(tmp_path / fsdp.CONFIG_FILE)).distributed_type == DistributedType.FSDP


@pytest.mark.parametrize("layout", FSDP_LAYOUTS)
def test_fsdp_layout_presets_render(layout, tmp_path, fixed_layer_class):
    cfg = compose_run_config(["recipes=cpu_fsdp", f"layout={layout}"])
    world = cfg.layout.dp_replicate * cfg.layout.dp_shard
    cfg = replace(cfg, cluster=replace(cfg.cluster, accelerators_per_node=world))
    assert cfg.layout.name == layout
    assert fsdp.layout_problems(cfg) == []
    fsdp.render(cfg, tmp_path)


def test_multi_node_hsdp_renders_one_launch_line_per_node(tmp_path, fixed_layer_class, as_launched):
    """8 nodes x 8 GPUs, HSDP replicating across nodes and sharding within one: the GPU-cluster shape."""
    cfg = compose_run_config(["engine=fsdp", "cluster=h100_8x8", "layout.zero_stage=3", "layout.dp_replicate=8",
                              "layout.dp_shard=8", "layout.activation_checkpointing=full"])  # fmt: skip
    rendered = fsdp.render(cfg, tmp_path)
    assert (rendered.nnodes, rendered.nproc_per_node) == (8, 8)
    loaded = load_config_from_file(str(tmp_path / fsdp.CONFIG_FILE))
    assert (loaded.num_machines, loaded.num_processes, loaded.same_network) == (8, 64, True)
    as_launched(launcher_environment(rendered))
    settings = fsdp_session.launched_settings(world_size=64)
    assert (settings.version, settings.replicate, settings.shard, settings.precision) == (2, 8, 8, "bf16")
    assert settings.plugin.reshard_after_forward is True and settings.plugin.activation_checkpointing is True


# ------------------------------------------------ tensor / context parallelism (GPU clusters, FSDP2 only)

# (cluster, dp_replicate, dp_shard, tp, cp) -> Accelerate's mesh (dim names, sizes), canonical order
ND_POINTS = [
    ("gpu_h100_1x8", 1, 4, 2, 1, ("dp_shard", "tp"), (4, 2)),
    ("gpu_h100_1x8", 1, 2, 2, 2, ("dp_shard", "cp", "tp"), (2, 2, 2)),
    ("gpu_h100_1x8", 1, 1, 1, 8, ("cp",), (8,)),
    ("h100_8x8", 8, 4, 2, 1, ("dp_replicate", "dp_shard", "tp"), (8, 4, 2)),
    ("h100_8x8", 2, 4, 4, 2, ("dp_replicate", "dp_shard", "cp", "tp"), (2, 4, 2, 4)),
]  # fmt: skip


def nd_config(cluster, replicate, shard, tp, cp):
    return compose_run_config(
        ["engine=fsdp", f"cluster={cluster}", "layout.zero_stage=3", f"layout.dp_replicate={replicate}",
         f"layout.dp_shard={shard}", f"layout.tp={tp}", f"layout.cp={cp}", "layout.seq_len=4096"]
    )  # fmt: skip


def fake_fsdp2_accelerator(world: int):
    """What ParallelismConfig._validate_accelerator reads of an FSDP2 Accelerator on `world` GPUs."""
    from types import SimpleNamespace

    return SimpleNamespace(multi_device=True, num_processes=world, is_fsdp2=True, is_main_process=True,
                           distributed_type=DistributedType.FSDP)  # fmt: skip


@pytest.mark.gpu_only
@pytest.mark.parametrize("cluster, replicate, shard, tp, cp, names, shape", ND_POINTS)
def test_parallelism_config_means_the_layout_validated_only(
    cluster, replicate, shard, tp, cp, names, shape, tmp_path, fixed_layer_class, as_launched
):
    cfg = nd_config(cluster, replicate, shard, tp, cp)
    assert fsdp.layout_problems(cfg) == []
    rendered = fsdp.render(cfg, tmp_path)
    world = cfg.cluster.nodes * cfg.cluster.accelerators_per_node
    loaded = load_config_from_file(str(tmp_path / fsdp.CONFIG_FILE))
    assert set(loaded.parallelism_config) <= set(vars(launch_command_parser().parse_args(["x.py"])))
    env = launcher_environment(rendered)
    assert env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    as_launched(env)
    settings = fsdp_session.launched_settings(world_size=world)
    mesh = settings.parallelism
    assert (mesh.dp_replicate_size, mesh.dp_shard_size, mesh.tp_size, mesh.cp_size) == (replicate, shard, tp, cp)
    assert (settings.tp, settings.cp, settings.multi_dim) == (tp, cp, True)
    assert mesh.total_size == world and mesh._get_mesh() == (names, shape)
    # FSDP shards over dp_shard x cp (flattened), replicated over dp_replicate; TP/CP ranks share a batch.
    assert fsdp_session.fsdp_mesh_dims(mesh) == (("dp_replicate",) if replicate > 1 else ()) + ("dp_shard_cp",)
    assert mesh.data_parallel_size == replicate * shard
    if cp > 1:
        assert mesh.cp_handler.cp_comm_strategy == fsdp.CP_COMM_STRATEGY
    mesh._validate_accelerator(fake_fsdp2_accelerator(world))  # Accelerate's own checks pass


ND_REFUSED = [
    (["cluster=cpu", "layout.tp=2", "cluster.accelerators_per_node=4"],
     "engine=fsdp runs tp=2 on GPU only, not accelerator=cpu (Accelerate's ParallelismConfig refuses a "
     "MULTI_CPU state"),
    (["cluster=cpu", "layout.cp=2", "cluster.accelerators_per_node=4"], "engine=nd runs tp on CPU"),
    (["cluster=gpu_h100_1x8", "layout.dp_shard=4", "layout.tp=2", "engine.fsdp_version=1"],
     "engine=fsdp fsdp_version=1 cannot compose tp=2 / cp=1 (needs FSDP2)"),
    (["cluster=gpu_h100_1x8", "layout.dp_shard=4", "layout.tp=2", "layout.zero_stage=0"], "zero_stage=0"),
    (["cluster=gpu_h100_1x8", "layout.dp_shard=1", "layout.tp=8"], "FSDP2 needs a dp_shard"),
    (["cluster=gpu_h100_1x8", "layout.dp_replicate=2", "layout.dp_shard=1", "layout.tp=2", "layout.cp=2"],
     "FSDP2 needs a dp_shard"),
    (["cluster=gpu_h100_1x8", "layout.dp_shard=2", "layout.tp=2"], "x tp=2 x pp=1 x cp=1 = 4 must equal cluster.nodes=1 x cluster.accelerators_per_node=8"),
]  # fmt: skip


@pytest.mark.parametrize("overrides, phrase", ND_REFUSED, ids=[str(i) for i in range(len(ND_REFUSED))])
def test_tensor_and_context_parallel_layouts_fsdp_cannot_run(overrides, phrase):
    cfg = compose_run_config(["engine=fsdp", "layout.zero_stage=3", "layout.seq_len=4096", *overrides])
    problems = fsdp.layout_problems(cfg)
    assert any(phrase in problem for problem in problems), problems


@pytest.mark.gpu_only
def test_tensor_parallel_plan_is_transformers_own_validated_only():
    """The plan apply hands transformers' apply_tensor_parallelism (what from_pretrained(tp_plan="auto")
    applies): Megatron's column / row split per layer, vocabulary-split embedding and lm_head."""
    from transformers import AutoModelForCausalLM

    from harness.modeling.model import hf_config_object

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config_object(BASE.model.hf_config))
    plan = fsdp_session.tensor_parallel_plan(model, tp=2)
    layers = BASE.model.hf_config["num_hidden_layers"]
    for i in range(layers):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            assert plan[f"model.layers.{i}.{name}"] == "colwise"
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            assert plan[f"model.layers.{i}.{name}"] == "rowwise"
    assert plan["model.embed_tokens"] == "embedding_rowwise" and plan["lm_head"] == "colwise_gather_output"
    # norms stay whole (FSDP shards them over dp_shard_cp only), matching the planner's table
    assert not any("norm" in name for name in plan)
    from harness.plan.support import ENGINE_SUPPORT

    assert ENGINE_SUPPORT["fsdp"].tp_shards_vocab == (True, True)


def test_context_parallel_labels_are_shifted_before_the_split():
    """The context-parallel loss shifts labels over the whole sequence before splitting it."""
    tokens = torch.arange(12).view(2, 6)
    assert shifted_labels(tokens).tolist() == [[1, 2, 3, 4, 5, -100], [7, 8, 9, 10, 11, -100]]


@pytest.mark.gpu_only
@pytest.mark.parametrize("replicate, shard, tp, cp, expected", [(1, 4, 2, 1, (3, 4)), (2, 2, 2, 1, (3, 4)),
                                                                (1, 1, 2, 4, (0, 1))])  # fmt: skip
def test_ranks_of_a_tp_or_cp_group_read_one_batch_validated_only(replicate, shard, tp, cp, expected):
    from types import SimpleNamespace

    from accelerate.parallelism_config import ParallelismConfig

    config = ParallelismConfig(dp_replicate_size=replicate, dp_shard_size=shard, tp_size=tp, cp_size=cp)
    mesh = {"dp": SimpleNamespace(get_local_rank=lambda: 3)}
    assert fsdp_session.data_parallel_coordinate(mesh, config) == expected


def test_apply_refuses_tensor_parallelism_off_gpu(tmp_path, fixed_layer_class, as_launched, monkeypatch):
    """The plan refuses it already; a hand-made launch is stopped before any process group starts."""
    from types import SimpleNamespace

    cfg = nd_config("gpu_h100_1x8", 1, 4, 2, 1)
    as_launched(launcher_environment(fsdp.render(cfg, tmp_path)))
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.raises(RuntimeError, match="tp=2, cp=1 on device cpu: engine=fsdp runs"):
        fsdp_session.apply(cfg, tmp_path, model=None, kind=SimpleNamespace(type="cpu", backend="gloo"))


def test_tp_on_a_family_transformers_has_no_plan_for_is_refused_as_transformers_refuses_it():
    # GPT-2 has no base_model_tp_plan: the plan Accelerate's TP would apply is refused by transformers itself.
    from transformers import AutoModelForCausalLM

    from harness.config.model_shape import hf_config_object

    cfg = compose_run_config(["engine=fsdp", "model=gpt2", "cluster=gpu_h100_1x8", "layout.zero_stage=3",
                              "layout.dp_shard=4", "layout.tp=2"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config_object(cfg.model.hf_config))
    with pytest.raises(ValueError, match="has no `tp_plan`"):
        fsdp_session.tensor_parallel_plan(model, 2)
    assert ("layout.tp=2 with engine=fsdp: transformers gives model_type='gpt2' no base_model_tp_plan"
            in " ".join(fsdp.layout_problems(cfg)))
    llama = compose_run_config(["engine=fsdp", "model=llama3_1_8b", "cluster=gpu_h100_1x8", "layout.zero_stage=3",
                                "layout.dp_shard=4", "layout.tp=2"])
    assert not any("base_model_tp_plan" in p for p in fsdp.layout_problems(llama))
