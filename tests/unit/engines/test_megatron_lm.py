"""megatron_lm export: the pretrain_gpt.py flags for each layout and model shape, checked two ways.

1. megatron.core's own TransformerConfig (pip `megatron-core`, CPU-importable) is built from the flags the way
   Megatron-LM's `core_transformer_config_from_args` does; its __post_init__ enforces the head / query-group /
   tensor-parallel rules, the uneven and layout-string pipeline splits, virtual stages, MoE and recompute
   settings (megatron-core is a test dependency).
2. The rules of `megatron/training/arguments.py::validate_args` (not shipped in the pip package) are restated
   here: world size = tp*pp*cp*dp, global batch = micro * accumulation * dp, interleaving needs micro-batches
   divisible by pp and layers divisible by pp*vpp, expert parallel divides dp*cp and needs sequence parallel
   with tp > 1.
"""

import json
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from harness import REPO_ROOT
from harness.config.compose import compose_run_config
from harness.engines import megatron_lm
from harness.engines.registry import ENGINES
from harness.plan.model_spec import model_spec_from_hf
from tests.unit.engines.megatron_core_config import transformer_config

GPU_RECIPES = sorted(p.stem for p in (REPO_ROOT / "recipes").glob("gpu_*megatron*.yaml"))
PRESETS = {name: compose_run_config([f"recipes={name}"]) for name in GPU_RECIPES}
LLAMA70 = compose_run_config(["engine=megatron_lm", "model=llama3_1_70b", "cluster=h100_8x8", "layout=single"])


def layout_cfg(cfg=LLAMA70, sp=False, **fields):
    out = replace(cfg, layout=replace(cfg.layout, **fields))
    return replace(out, engine=replace(out.engine, sequence_parallel=sp))


def flags_of(cfg):
    return megatron_lm.megatron_flags(cfg)


# --------------------------------------------------------------------------- megatron.core's checks
@pytest.mark.parametrize("name", GPU_RECIPES)
def test_gpu_presets_pass_megatron_cores_config_checks(name):
    config = transformer_config(flags_of(PRESETS[name]))
    assert config.tensor_model_parallel_size == PRESETS[name].layout.tp


@pytest.mark.parametrize(
    "model, fields",
    [
        ("llama3_1_8b", dict(tp=4, dp_shard=16, zero_stage=1)),
        ("llama3_1_70b", dict(tp=8, pp=8, pp_virtual_stages=2, pp_schedule="Interleaved1F1B", grad_accum=8)),
        ("qwen2_5_7b", dict(tp=4, pp=2, dp_shard=8, grad_accum=4, activation_checkpointing="full")),
        ("mistral_7b", dict(tp=2, cp=2, dp_shard=16, seq_len=4096, zero_stage=1)),
        ("gpt2", dict(tp=4, dp_shard=16, precision="fp16", seq_len=1024)),
        ("llama3_1_70b", dict(tp=8, pp=4, pp_stage_layers=[19, 21, 21, 19], dp_shard=2, grad_accum=4)),
        ("llama3_1_70b", dict(tp=8, pp=2, pp_virtual_stages=2, pp_schedule="Interleaved1F1B",
                              pp_stage_layers=[19, 21, 21, 19], dp_shard=4, grad_accum=4)),
    ],
)
def test_model_shapes_pass_megatron_cores_config_checks(model, fields):
    cfg = compose_run_config(["engine=megatron_lm", f"model={model}", "cluster=h100_8x8", "layout=single"])
    cfg = layout_cfg(cfg, sp=fields.get("tp", 1) > 1, **fields)
    flags = flags_of(cfg)
    config = transformer_config(flags)
    spec = model_spec_from_hf(model, cfg.model.hf_config)
    assert config.num_query_groups == spec.num_kv_heads
    assert config.ffn_hidden_size == spec.ffn_size
    if fields.get("pp_virtual_stages", 1) > 1:
        assert config.virtual_pipeline_model_parallel_size == 2


def test_megatron_core_rejects_a_bad_split_we_also_refuse():
    """A split megatron.core refuses is refused by our own check too (same rule, our wording)."""
    cfg = layout_cfg(tp=8, pp=4, dp_shard=2, grad_accum=4, pp_stage_layers=[20, 20, 20, 21])
    errors, _ = megatron_lm.check(cfg)
    assert any("summing to num_layers=80" in e for e in errors)
    flags = flags_of(layout_cfg(tp=8, pp=4, dp_shard=2, grad_accum=4))
    flags["--pipeline-model-parallel-layout"] = megatron_lm.pipeline_layout([20, 20, 20, 21])
    with pytest.raises((AssertionError, ValueError)):
        transformer_config(flags)


# ------------------------------------------------------------------------------- restated rules
@pytest.mark.parametrize(
    "fields, sp, message",
    [
        (dict(tp=8, dp_shard=4), False, "= 32 must equal cluster.nodes=8 x cluster.accelerators_per_node=8 = 64"),
        (dict(tp=8, pp=3, dp_shard=2, grad_accum=3), False, "must equal"),
        (dict(tp=8, pp=8, pp_virtual_stages=3, pp_schedule="Interleaved1F1B", grad_accum=8), False,
         "num_layers=80 must be divisible by pp*pp_virtual_stages=24"),
        (dict(tp=8, pp=4, pp_virtual_stages=2, pp_schedule="Interleaved1F1B", dp_shard=2, grad_accum=6), False,
         "grad_accum=6 must be a multiple of pp=4"),
        (dict(tp=8, pp=8, pp_schedule="GPipe", grad_accum=8), False, "pp_schedule in 1F1B, Interleaved1F1B, not GPipe"),
        (dict(tp=8, pp=8, pp_virtual_stages=2, pp_schedule="1F1B", grad_accum=8), False, "interleaves exactly"),
        (dict(tp=8, dp_shard=8, zero_stage=3), False, "zero_stage=3"),
        (dict(tp=8, dp_replicate=2, dp_shard=4), False, "(dp_replicate=2) at zero_stage=0 (hybrid sharding: 1)"),
        (dict(tp=8, dp_shard=8, offload_optimizer="cpu"), False, "offload_optimizer=cpu at zero_stage=0 is not supported (never)"),
        (dict(tp=8, dp_shard=8, ep=2), False, "needs a MoE model"),
        (dict(tp=8, cp=2, dp_shard=4, seq_len=4098), False, "divisible by 2*cp"),
        (dict(tp=8, dp_shard=8, seq_len=4100), True, "divisible by tp=8"),
    ],
)
def test_validate_args_rules_are_refused(fields, sp, message):
    errors, _ = megatron_lm.check(layout_cfg(sp=sp, **fields))
    assert any(message in e for e in errors), errors
    with pytest.raises(ValueError, match="megatron_lm cannot export"):
        flags_of(layout_cfg(sp=sp, **fields))


def test_heads_must_split_evenly():
    qwen = compose_run_config(["engine=megatron_lm", "model=qwen2_5_7b", "cluster=h100_8x8", "layout=single"])
    errors, _ = megatron_lm.check(layout_cfg(qwen, tp=8, dp_shard=8))
    assert "tp=8 must divide num_attention_heads=28" in errors
    assert "num_query_groups=4 must be a multiple or divisor of tp=8" not in errors  # 8 % 4 == 0: replicated


MIXTRAL = compose_run_config(["engine=megatron_lm", "model=mixtral_8x7b", "cluster=h100_8x8", "layout=single"])


@pytest.mark.parametrize(
    "fields, sp, message",
    [
        (dict(tp=2, ep=3, dp_shard=32), True, "ep=3 must divide num_experts=8"),
        (dict(tp=8, ep=8, dp_shard=8, pp=1), False, "requires --sequence-parallel"),
        (dict(tp=8, pp=2, ep=8, dp_shard=4, grad_accum=2), True, "ep=8 must divide dp*cp=4"),
    ],
)
def test_expert_parallel_rules(fields, sp, message):
    errors, _ = megatron_lm.check(layout_cfg(MIXTRAL, sp=sp, **fields))
    assert any(message in e for e in errors), errors


def test_world_and_batch_identities():
    """world = tp*pp*cp*dp and global batch = micro * accumulation * dp (Megatron derives dp, then checks
    global % (micro * dp) == 0): the export writes the global batch that makes both hold."""
    for name, cfg in PRESETS.items():
        flags, layout, cluster = flags_of(cfg), cfg.layout, cfg.cluster
        world = cluster.nodes * cluster.accelerators_per_node
        tp, pp, cp = flags["--tensor-model-parallel-size"], flags["--pipeline-model-parallel-size"], \
            flags["--context-parallel-size"]  # fmt: skip
        assert world % (tp * pp * cp) == 0, name
        dp = world // (tp * pp * cp)
        assert flags["--global-batch-size"] % (flags["--micro-batch-size"] * dp) == 0, name
        assert flags["--global-batch-size"] // (flags["--micro-batch-size"] * dp) == layout.grad_accum, name


# ------------------------------------------------------------------------------- what is written
def test_llama70b_flags():
    flags = flags_of(layout_cfg(tp=8, pp=4, pp_schedule="Interleaved1F1B", pp_virtual_stages=5, dp_shard=2,
                                zero_stage=1, micro_batch=1, grad_accum=16, seq_len=8192,
                                activation_checkpointing="selective", precision="bf16", sp=True))
    expected = {
        "--num-layers": 80, "--hidden-size": 8192, "--ffn-hidden-size": 28672, "--num-attention-heads": 64,
        "--group-query-attention": True, "--num-query-groups": 8, "--swiglu": True, "--rotary-base": 500000,
        "--untie-embeddings-and-output-weights": True, "--normalization": "RMSNorm", "--seq-length": 8192,
        "--max-position-embeddings": 131072, "--disable-bias-linear": True, "--position-embedding-type": "rope",
        "--tensor-model-parallel-size": 8, "--pipeline-model-parallel-size": 4,
        "--num-layers-per-virtual-pipeline-stage": 4, "--sequence-parallel": True, "--context-parallel-size": 1,
        "--expert-model-parallel-size": 1, "--micro-batch-size": 1, "--global-batch-size": 32,
        "--use-distributed-optimizer": True, "--recompute-granularity": "selective", "--bf16": True,
        # 128256 = 2^8 * 501: 32 * tp 8 divides it, so Megatron keeps the HF vocabulary unpadded.
        "--make-vocab-size-divisible-by": 32,
        # config.json's rope_scaling (rope_type llama3, factor 8)
        "--use-rope-scaling": True, "--rope-scaling-factor": 8.0,
    }  # fmt: skip
    assert {k: flags[k] for k in expected} == expected


def test_qwen2_bias_and_gpt2_shape():
    qwen = compose_run_config(["engine=megatron_lm", "model=qwen2_5_7b", "cluster=h100_8x8", "layout=single"])
    flags = flags_of(layout_cfg(qwen, tp=4, dp_shard=16))
    assert flags["--add-qkv-bias"] and flags["--disable-bias-linear"]
    gpt2 = compose_run_config(["engine=megatron_lm", "model=gpt2", "cluster=h100_8x8", "layout=single"])
    flags = flags_of(layout_cfg(gpt2, tp=4, dp_shard=16, seq_len=1024))
    assert flags["--position-embedding-type"] == "learned_absolute" and flags["--normalization"] == "LayerNorm"
    assert "--swiglu" not in flags and "--untie-embeddings-and-output-weights" not in flags
    assert "--disable-bias-linear" not in flags


def test_sliding_window_is_exported_as_transformer_engines_window():
    mistral = compose_run_config(["engine=megatron_lm", "model=mistral_7b", "cluster=h100_8x8", "layout=single"])
    flags = flags_of(layout_cfg(mistral, tp=2, dp_shard=32, seq_len=16384))
    # transformers' window of 4096 keys ends at the query; Transformer Engine counts the 4095 beside it
    assert flags["--window-size"] == "4095,0" and "--window-attn-skip-freq" not in flags
    assert transformer_config(flags).window_size == (4095, 0)  # megatron.core's TransformerConfig takes it
    assert megatron_lm.window_flags((0, 4096, 0, 4096)) == {"--window-size": "4095,0",
                                                            "--window-attn-skip-freq": "[0,1,0,1]"}
    assert megatron_lm.window_flags((0, 0)) == {}
    assert "--window-size" not in flags_of(layout_cfg(tp=8, dp_shard=8))


def test_gpt2s_tanh_gelu_is_named_where_megatron_runs_exact_gelu():
    gpt2 = compose_run_config(["engine=megatron_lm", "model=gpt2", "cluster=h100_8x8", "layout=single"])
    _, warnings = megatron_lm.check(layout_cfg(gpt2, tp=4, dp_shard=16, seq_len=1024))
    assert any(w.startswith("activation=gelu_new (GELU's tanh approximation): Megatron-core's layers run exact GELU")
               for w in warnings)
    import megatron.core.transformer.transformer_config as core
    assert "openai_gelu" not in {f.name for f in __import__("dataclasses").fields(core.TransformerConfig)}


def test_mixtral_expert_flags():
    flags = flags_of(layout_cfg(MIXTRAL, tp=2, pp=4, ep=8, dp_shard=8, zero_stage=1, seq_len=4096, sp=True))
    assert flags["--num-experts"] == 8 and flags["--moe-router-topk"] == 2
    assert flags["--expert-model-parallel-size"] == 8 and flags["--sequence-parallel"]
    preset = flags_of(PRESETS["gpu_mixtral8x7b_megatron_ep8"])
    assert preset["--expert-model-parallel-size"] == 8  # the preset shows expert parallelism (its constraint)


def test_uneven_split_is_a_pipeline_layout_string():
    llama405 = PRESETS["gpu_llama405b_megatron_tp8_pp16"]
    flags = flags_of(layout_cfg(llama405, tp=8, pp=16, pp_schedule="1F1B", pp_virtual_stages=1, dp_shard=8,
                                pp_stage_layers=[7] + [8] * 14 + [7], sp=True))
    assert flags["--pipeline-model-parallel-layout"] == "Et*7|" + "t*8|" * 14 + "t*7L"
    assert megatron_lm.pipeline_layout([0, 3, 0]) == "E|t*3|L"


def test_recompute_and_precision_flags():
    full = flags_of(layout_cfg(tp=8, dp_shard=8, activation_checkpointing="full", precision="fp16"))
    assert (full["--recompute-granularity"], full["--recompute-method"], full["--recompute-num-layers"]) == \
        ("full", "uniform", 1)  # fmt: skip
    assert full["--fp16"] and "--bf16" not in full
    none = flags_of(layout_cfg(tp=8, dp_shard=8, precision="fp32"))
    assert "--recompute-granularity" not in none and "--bf16" not in none and "--fp16" not in none


@pytest.mark.parametrize("precision, rendered", [("bf16", True), ("fp8", True), ("fp16", False), ("fp32", False)])
def test_bf16_gradient_reduction_flag_only_where_megatron_reads_it(precision, rendered):
    cfg = layout_cfg(tp=8, dp_shard=8, precision=precision)
    cfg = replace(cfg, engine=replace(cfg.engine, grad_reduce_in_bf16=True))
    assert ("--grad-reduce-in-bf16" in flags_of(cfg)) == rendered
    assert any("grad_reduce_in_bf16" in w for w in megatron_lm.check(cfg)[1]) != rendered
    assert "--grad-reduce-in-bf16" not in flags_of(layout_cfg(tp=8, dp_shard=8, precision=precision))


def test_distributed_optimizer_instances_for_dp_replicate():
    flags = flags_of(layout_cfg(tp=8, dp_replicate=2, dp_shard=4, zero_stage=1))
    assert flags["--num-distributed-optimizer-instances"] == 2 and flags["--use-distributed-optimizer"]


def test_vocab_divisor():
    assert megatron_lm.vocab_divisor(128256, 8) == 32
    assert megatron_lm.vocab_divisor(32000, 8) == 32 and megatron_lm.vocab_divisor(32000, 2) == 128
    assert megatron_lm.vocab_divisor(50257, 4) == 1  # odd: Megatron pads it


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_render_writes_a_runnable_script_and_the_flags(name, tmp_path):
    cfg = PRESETS[name]
    rendered = megatron_lm.render(cfg, tmp_path)
    assert ENGINES["megatron_lm"].export_only and ENGINES["megatron_lm"].session is None
    assert rendered.files == [megatron_lm.SCRIPT_FILE, megatron_lm.ARGS_FILE]
    payload = json.loads((tmp_path / megatron_lm.ARGS_FILE).read_text())
    assert payload["argv"] == megatron_lm.flags_to_argv(payload["flags"])
    script = tmp_path / megatron_lm.SCRIPT_FILE
    subprocess.run(["bash", "-n", str(script)], check=True)
    # Run the script with a stand-in torchrun that prints its argv: the flags arrive intact.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    (bin_dir / "torchrun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MEGATRON_LM": "/megatron", "NODE_RANK": "0",
           "MASTER_ADDR": "host", "MASTER_PORT": "1234"}  # fmt: skip
    argv = subprocess.run(["bash", str(script)], env=env, check=True, capture_output=True, text=True).stdout.split("\n")
    start = argv.index("/megatron/pretrain_gpt.py") + 1
    assert argv[start : start + len(payload["argv"])] == payload["argv"]
    assert "--mock-data" in argv and "NullTokenizer" in argv
    assert argv[argv.index("--vocab-size") + 1] == str(model_spec_from_hf("m", cfg.model.hf_config).vocab_size - 1)
    nodes = str(cfg.cluster.nodes)
    assert argv[argv.index("--nnodes") + 1] == nodes
    assert shlex.join(rendered.argv).startswith("torchrun --nnodes")


def test_real_data_needs_a_tokenizer(tmp_path):
    megatron_lm.render(PRESETS[GPU_RECIPES[0]], tmp_path)
    env = {"PATH": "/usr/bin:/bin", "MEGATRON_LM": "/m", "DATA_PATH": "corpus_text_document", "NODE_RANK": "0",
           "MASTER_ADDR": "h", "MASTER_PORT": "1"}  # fmt: skip
    proc = subprocess.run(["bash", str(Path(tmp_path) / megatron_lm.SCRIPT_FILE)], env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert proc.returncode != 0 and "TOKENIZER_MODEL" in proc.stderr


def run_script(tmp_path, cfg, **env_vars):
    """Run the rendered script with a stand-in torchrun that prints its environment variable
    CUDA_DEVICE_MAX_CONNECTIONS, then its argv, one item a line."""
    megatron_lm.render(cfg, tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = '#!/bin/sh\nprintf "%s\\n" "${CUDA_DEVICE_MAX_CONNECTIONS:-unset}"\nfor a in "$@"; do printf "%s\\n" "$a"; done\n'
    (bin_dir / "torchrun").write_text(stub)
    (bin_dir / "torchrun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MEGATRON_LM": "/megatron", "NODE_RANK": "0", "MASTER_ADDR": "host",
           "MASTER_PORT": "1234", **env_vars}  # fmt: skip
    return subprocess.run(["bash", str(tmp_path / megatron_lm.SCRIPT_FILE)], env=env, capture_output=True, text=True)


@pytest.mark.parametrize("fields", [dict(tp=8, dp_shard=8), dict(cp=2, dp_shard=32), dict(tp=1, dp_shard=64)])
def test_script_sets_one_device_connection_where_validate_args_asserts_it(tmp_path, fields):
    # validate_args (core_r0.16): tp > 1 or cp > 1 before Blackwell asserts CUDA_DEVICE_MAX_CONNECTIONS == "1".
    cfg = layout_cfg(seq_len=4096, **fields)
    proc = run_script(tmp_path, cfg, CUDA_DEVICE_MAX_CONNECTIONS="8")
    assert proc.returncode == 0, proc.stderr
    required = fields.get("tp", 1) > 1 or fields.get("cp", 1) > 1
    assert proc.stdout.split("\n")[0] == ("1" if required else "8")


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_every_gpu_export_sets_one_device_connection_where_validate_args_asks(tmp_path, name):
    cfg = PRESETS[name]
    required = cfg.layout.tp > 1 or cfg.layout.cp > 1  # validate_args asks for one connection under tp / cp
    assert run_script(tmp_path, cfg).stdout.split("\n")[0] == ("1" if required else "unset")


def test_a_benchmark_run_neither_loads_nor_saves_by_default(tmp_path):
    argv = run_script(tmp_path, PRESETS[GPU_RECIPES[0]]).stdout.split("\n")
    assert not {"--load", "--save", "--save-interval", "--ckpt-format"} & set(argv)


def test_saving_goes_to_a_directory_of_its_own_and_loading_restarts_the_iterations(tmp_path):
    cfg = PRESETS[GPU_RECIPES[0]]
    proc = run_script(tmp_path, cfg, SAVE_DIR="/ckpt", LOAD_DIR="/ckpt/converted", SLURM_JOB_ID="77")
    argv = proc.stdout.split("\n")
    assert argv[argv.index("--save") + 1] == f"/ckpt/{cfg.model.name}-{cfg.layout.name}-77"
    assert argv[argv.index("--load") + 1] == "/ckpt/converted"
    assert {"--finetune", "--no-load-optim", "--no-load-rng"} <= set(argv)  # iteration 0: every step trains


def test_saving_without_a_run_id_is_refused(tmp_path):
    proc = run_script(tmp_path, PRESETS[GPU_RECIPES[0]], SAVE_DIR="/ckpt")
    assert proc.returncode != 0 and "RUN_ID" in proc.stderr
