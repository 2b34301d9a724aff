"""megatron_lm (export only): the Megatron-LM `pretrain_gpt.py` command line for a layout and an HF model shape.

The harness never launches it (export only): `render` writes `megatron_args.sh` (a runnable script with data
and checkpoint hints) and `megatron_args.json` (the same flags as data) for users who run Megatron-LM itself.
Flags follow Megatron-LM core_r0.16 (megatron-core 0.16); `check` restates the argument rules of
`megatron/training/arguments.py::validate_args` and of megatron.core's TransformerConfig that a layout can break.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Dict, List, Tuple

from harness.config.schema import RunConfig
from harness.engines.optimizer import ADAMW_BETAS, ADAMW_EPS
from harness.engines.rendered import MASTER_ADDR, MASTER_PORT, NODE_RANK, PORT_BASE, PORT_SPAN, RenderedRun
from harness.plan.model_spec import ModelSpec
from harness.plan.parallel_dims import ParallelDims
from harness.plan.planner import spec_for
from harness.plan.regime import megatron_fp8_flags
from harness.plan.validate import support_problems
from harness.rundir import MEGATRON_ARGS_FILE, MEGATRON_SCRIPT_FILE, write_text

SCRIPT_FILE = MEGATRON_SCRIPT_FILE
ARGS_FILE = MEGATRON_ARGS_FILE
# Megatron-LM schedules: 1F1B without virtual stages, interleaved 1F1B with them.
MEGATRON_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "gpt2")
# Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by * tp (default 128).
DEFAULT_VOCAB_DIVISOR = 128

Flags = Dict[str, Any]  # flag -> value; True for a switch


def global_batch_size(cfg: RunConfig) -> int:
    return ParallelDims.of(cfg.layout).global_batch(cfg.layout.micro_batch, cfg.layout.grad_accum)


def vocab_divisor(vocab_size: int, tp: int) -> int:
    """Largest power of two <= 128 with vocab % (divisor * tp) == 0, so Megatron keeps the HF vocabulary
    exactly (no padded rows); 1 when even that fails (Megatron then pads to a multiple of tp)."""
    divisor = DEFAULT_VOCAB_DIVISOR
    while divisor > 1 and vocab_size % (divisor * tp):
        divisor //= 2
    return divisor


def pipeline_layout(stage_layers: List[int]) -> str:
    """Megatron's --pipeline-model-parallel-layout: stages in global order (stage s on rank s % pp),
    `E` embedding, `t*n` n decoder layers, `L` final norm + LM head + loss."""
    stages = []
    for index, count in enumerate(stage_layers):
        text = ("E" if index == 0 else "") + (f"t*{count}" if count else "")
        text += "L" if index == len(stage_layers) - 1 else ""
        stages.append(text)
    return "|".join(stages)


def _model_flags(spec: ModelSpec, hf: Dict[str, Any], cfg: RunConfig) -> Flags:
    flags: Flags = {
        "--num-layers": spec.num_layers,
        "--hidden-size": spec.hidden_size,
        "--ffn-hidden-size": spec.ffn_size,
        "--num-attention-heads": spec.num_heads,
        "--kv-channels": spec.head_dim,
        "--seq-length": cfg.layout.seq_len,
        "--max-position-embeddings": spec.max_positions,
        "--attention-dropout": spec.attention_dropout,
        "--hidden-dropout": spec.hidden_dropout,
    }
    if spec.num_kv_heads != spec.num_heads:
        flags["--group-query-attention"] = True
        flags["--num-query-groups"] = spec.num_kv_heads
    if spec.norm_kind == "rmsnorm":
        flags["--normalization"] = "RMSNorm"
        flags["--norm-epsilon"] = float(hf.get("rms_norm_eps", 1e-6))
    else:
        flags["--normalization"] = "LayerNorm"
        flags["--norm-epsilon"] = float(hf.get("layer_norm_epsilon", 1e-5))
    if spec.mlp_kind == "swiglu":
        flags["--swiglu"] = True
    if spec.learned_positions:
        flags["--position-embedding-type"] = "learned_absolute"
    else:
        flags["--position-embedding-type"] = "rope"
        flags["--rotary-base"] = int(float(hf.get("rope_theta", 10000.0)))
        scaling = hf.get("rope_scaling") or hf.get("rope_parameters") or {}  # transformers' legacy and 5.x names
        if scaling.get("rope_type", scaling.get("type")) == "llama3":
            flags["--use-rope-scaling"] = True
            flags["--rope-scaling-factor"] = float(scaling["factor"])
    flags.update(window_flags(spec.attention_windows))
    if not (spec.qkv_bias or spec.out_bias or spec.mlp_bias):
        flags["--disable-bias-linear"] = True
    elif spec.qkv_bias and not spec.out_bias and not spec.mlp_bias:
        flags["--disable-bias-linear"] = True
        flags["--add-qkv-bias"] = True
    if spec.qk_norm:
        flags["--qk-layernorm"] = True
    if not spec.tied_embeddings:
        flags["--untie-embeddings-and-output-weights"] = True
    if spec.is_moe:
        flags.update({
            "--num-experts": spec.num_experts,
            "--moe-router-topk": spec.experts_per_token,
            "--moe-router-load-balancing-type": "aux_loss",
            "--moe-aux-loss-coeff": float(hf.get("router_aux_loss_coef", 0.02)),
            "--moe-grouped-gemm": True,
            "--moe-token-dispatcher-type": "alltoall",
        })  # fmt: skip
    return flags


def _parallel_flags(spec: ModelSpec, cfg: RunConfig) -> Flags:
    layout, engine = cfg.layout, cfg.engine
    flags: Flags = {
        "--tensor-model-parallel-size": layout.tp,
        "--pipeline-model-parallel-size": layout.pp,
        "--context-parallel-size": layout.cp,
        "--expert-model-parallel-size": layout.ep,
        "--micro-batch-size": layout.micro_batch,
        "--global-batch-size": global_batch_size(cfg),
    }
    if layout.tp > 1 and engine.sequence_parallel:
        flags["--sequence-parallel"] = True
    if layout.pp > 1:
        if layout.pp_stage_layers:
            flags["--pipeline-model-parallel-layout"] = pipeline_layout(list(layout.pp_stage_layers))
        elif layout.pp_virtual_stages > 1:
            flags["--num-layers-per-virtual-pipeline-stage"] = spec.num_layers // (layout.pp * layout.pp_virtual_stages)
    if layout.zero_stage == 1:
        flags["--use-distributed-optimizer"] = True
        flags["--overlap-grad-reduce"] = True
        flags["--overlap-param-gather"] = True
        if layout.dp_replicate > 1:
            # Shard the optimizer within dp_shard ranks, replicate across dp_replicate groups.
            flags["--num-distributed-optimizer-instances"] = layout.dp_replicate
    if layout.activation_checkpointing == "selective":
        flags["--recompute-granularity"] = "selective"
    elif layout.activation_checkpointing == "full":
        flags.update({"--recompute-granularity": "full", "--recompute-method": "uniform", "--recompute-num-layers": 1})
    if engine.grad_reduce_in_bf16 and layout.precision in ("bf16", "fp8"):
        flags["--grad-reduce-in-bf16"] = True
    if layout.precision == "bf16":
        flags["--bf16"] = True
    elif layout.precision == "fp16":
        flags["--fp16"] = True
    elif layout.precision == "fp8":
        flags["--bf16"] = True  # FP8 GEMMs inside Transformer Engine layers, bf16 everywhere else
        flags.update(megatron_fp8_flags())
    return flags


def _training_flags(cfg: RunConfig) -> Flags:
    bench = cfg.bench
    return {
        "--train-iters": bench.warmup_steps + bench.steps,
        "--lr": bench.lr,
        "--min-lr": bench.lr,
        "--lr-decay-style": "constant",
        "--weight-decay": bench.weight_decay,
        "--clip-grad": bench.grad_clip,
        "--adam-beta1": ADAMW_BETAS[0],
        "--adam-beta2": ADAMW_BETAS[1],
        "--adam-eps": ADAMW_EPS,
        "--seed": bench.seed,
        "--log-interval": 1,
        "--log-throughput": True,
        "--eval-iters": 0,
        "--transformer-impl": "transformer_engine",
    }


# transformers' names of GELU's tanh approximation (activations.py: NewGELUActivation, PytorchGELUTanh, FastGELU)
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def window_sizes(windows: Tuple[int, ...]) -> List[int]:
    """The distinct sliding-window sizes of a model's layers (0, a full-attention layer, left out)."""
    return sorted({w for w in windows if w})


def window_flags(windows: Tuple[int, ...]) -> Flags:
    """Sliding-window attention as Megatron-LM takes it (arguments.py: --window-size, --window-attn-skip-freq):
    `windows` holds per layer the keys a query sees (0: every earlier key; transformers' sliding window of w,
    keys in (q - w, q]). Transformer Engine's window (left, right) counts the keys beside the query's own:
    (w - 1, 0). Layers without a window are listed by the skip pattern (1: windowed, 0: full attention)."""
    sizes = window_sizes(windows)
    if len(sizes) != 1:  # none, or several (refused by check)
        return {}
    flags: Flags = {"--window-size": f"{sizes[0] - 1},0"}
    if not all(windows):
        flags["--window-attn-skip-freq"] = "[" + ",".join("1" if w else "0" for w in windows) + "]"
    return flags


def megatron_flags(cfg: RunConfig) -> Flags:
    """Every pretrain_gpt.py flag for this config, in the order they are written (data flags excluded)."""
    errors, _ = check(cfg)
    if errors:
        raise ValueError("megatron_lm cannot export this layout:\n  - " + "\n  - ".join(errors))
    spec = spec_for(cfg.model)
    flags = _model_flags(spec, cfg.model.hf_config, cfg)
    flags["--make-vocab-size-divisible-by"] = vocab_divisor(spec.vocab_size, cfg.layout.tp)
    flags.update(_parallel_flags(spec, cfg))
    flags.update(_training_flags(cfg))
    return flags


def flags_to_argv(flags: Flags) -> List[str]:
    argv: List[str] = []
    for flag, value in flags.items():
        if value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv += [flag, str(value)]
    return argv


def single_device_connection(cfg: RunConfig) -> bool:
    """Whether Megatron-LM needs CUDA_DEVICE_MAX_CONNECTIONS=1 for this layout.

    megatron/training/arguments.py::validate_args (core_r0.16) asserts it when tp > 1 or cp > 1 on GPUs
    before Blackwell (compute capability < 10) unless Megatron-FSDP or overlap_moe_expert_parallel_comm is on
    (the export uses neither): one hardware queue keeps each tensor/context-parallel collective ahead of the
    compute it overlaps. Blackwell accepts the setting, so the export sets it whatever the GPU.
    """
    return cfg.layout.tp > 1 or cfg.layout.cp > 1


def _environment_lines(cfg: RunConfig) -> List[str]:
    if not single_device_connection(cfg):
        return []
    return ["# tp > 1 or cp > 1: Megatron-LM's validate_args requires one device connection before Blackwell.",
            "export CUDA_DEVICE_MAX_CONNECTIONS=1"]


def _rendezvous_lines(cfg: RunConfig) -> List[str]:
    """Bash lines that set NODE_RANK, MASTER_ADDR and MASTER_PORT unless the user's environment does.

    Under Slurm (one task per node, as the harness's job script runs it): the node's SLURM_NODEID, the
    first node of the allocation by its NodeAddr (node names need not resolve), and the job script's port
    rule. Elsewhere a one-node cluster rendezvouses on this host; several nodes need all three set.
    """
    single = cfg.cluster.nodes == 1
    need = "set NODE_RANK, MASTER_ADDR and MASTER_PORT on every node (or run under Slurm)"
    return [
        'if [ -n "${SLURM_JOB_ID:-}" ] && [ -n "${SLURM_JOB_NODELIST:-}" ]; then',
        '  NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-}}',
        '  if [ -z "${MASTER_ADDR:-}" ]; then',
        '    first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "    first_node=${first_node%%$'\\n'*}",
        '    node_info=$(scontrol show node "$first_node" 2>/dev/null || true)',
        '    if [[ $node_info =~ NodeAddr=([^[:space:]]+) ]]; then MASTER_ADDR=${BASH_REMATCH[1]}; '
        'else MASTER_ADDR=$first_node; fi',
        "  fi",
        f"  MASTER_PORT=${{MASTER_PORT:-$(( {PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN} ))}}",
        "fi",
        *[f"{name}=${{{name}:-{default}}}" if single else f"{name}=${{{name}:?{need}}}"
          for name, default in (("NODE_RANK", 0), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", 29500))],
    ]


def _checkpoint_lines(cfg: RunConfig) -> List[str]:
    """Bash lines that build CHECKPOINT_ARGS: empty unless LOAD_DIR / SAVE_DIR ask for a load or a save."""
    run_name = f"{cfg.model.name}-{cfg.layout.name}"
    return [
        "CHECKPOINT_ARGS=()",
        'if [ -n "$LOAD_DIR" ]; then',
        '  CHECKPOINT_ARGS+=(--load "$LOAD_DIR" --finetune --no-load-optim --no-load-rng)',
        "fi",
        'if [ -n "$SAVE_DIR" ]; then',
        '  RUN_ID=${RUN_ID:-${SLURM_JOB_ID:?set RUN_ID (the same on every node) to name the checkpoint directory of this run}}',
        f'  RUN_CHECKPOINT_DIR="$SAVE_DIR/{run_name}-$RUN_ID"',
        '  if [ "$RUN_CHECKPOINT_DIR" = "$LOAD_DIR" ]; then echo "SAVE_DIR: $RUN_CHECKPOINT_DIR is LOAD_DIR" >&2; exit 2; fi',
        '  CHECKPOINT_ARGS+=(--save "$RUN_CHECKPOINT_DIR" --save-interval "$SAVE_INTERVAL")',
        "fi",
        'if [ ${#CHECKPOINT_ARGS[@]} -gt 0 ]; then CHECKPOINT_ARGS+=(--ckpt-format torch_dist); fi',
    ]


def _script(cfg: RunConfig, flags: Flags) -> str:
    layout, cluster = cfg.layout, cfg.cluster
    vocab = spec_for(cfg.model).vocab_size
    tokenizer = cfg.model.hub_id or ""
    lines = [
        "#!/usr/bin/env bash",
        f"# Megatron-LM pretrain_gpt.py for model={cfg.model.name}, layout={layout.name}, cluster={cluster.name}:",
        f"# tp={layout.tp} pp={layout.pp} (virtual {layout.pp_virtual_stages}) cp={layout.cp} ep={layout.ep} "
        f"dp={ParallelDims.of(cfg.layout).dp} on {cluster.nodes} x {cluster.accelerators_per_node} GPUs.",
        "# Generated by the harness (engine=megatron_lm, export only: the harness does not launch it).",
        "# Run on every node from a Megatron-LM checkout (core_r0.16). Under Slurm (srun, one task per node) the",
        "#   rendezvous comes from the job (SLURM_NODEID, the first node, a port from SLURM_JOB_ID); NODE_RANK,",
        "#   MASTER_ADDR and MASTER_PORT in the environment win.",
        "#",
        "# Data: preprocess a corpus with tools/preprocess_data.py (same tokenizer), then point DATA_PATH at the",
        "#   <prefix> of <prefix>.bin/.idx (weighted blends: DATA_PATH='0.7 a_text_document 0.3 b_text_document').",
        "#   The default, DATA_PATH=--mock-data, runs on synthetic tokens with a NullTokenizer of the model's",
        "#   vocabulary; real data needs TOKENIZER_MODEL (the model's Hugging Face tokenizer: hub id or path).",
        "# Checkpoints: a benchmark run neither loads nor saves by default. LOAD_DIR (optional) starts from converted",
        "#   weights (Megatron-Bridge or tools/checkpoint/convert.py) with --finetune: iteration, optimizer and RNG",
        "#   start fresh, so the run always trains every step. SAVE_DIR (optional) saves every SAVE_INTERVAL steps",
        "#   into this run's own directory $SAVE_DIR/<model>-<layout>-$RUN_ID (RUN_ID: the Slurm job id, or set it",
        "#   to the same value on every node), which nothing loads.",
        "set -euo pipefail",
        *_environment_lines(cfg),
        'MEGATRON_LM=${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout}',
        'DATA_PATH=${DATA_PATH:---mock-data}',
        'LOAD_DIR=${LOAD_DIR:-}',
        'SAVE_DIR=${SAVE_DIR:-}',
        'SAVE_INTERVAL=${SAVE_INTERVAL:-1000}',
        f'TOKENIZER_MODEL=${{TOKENIZER_MODEL:-{tokenizer}}}',
        "",
        "MEGATRON_ARGS=(",
        *[f"  {shlex.join(flags_to_argv({flag: value}))}" for flag, value in flags.items() if value is not False],
        ")",
        'if [ "$DATA_PATH" = "--mock-data" ]; then',
        # NullTokenizer adds one id (end of document) to --vocab-size.
        f"  DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size {vocab - 1})",
        "else",
        '  : "${TOKENIZER_MODEL:?set TOKENIZER_MODEL to the Hugging Face tokenizer of the model}"',
        '  DATA_ARGS=(--data-path $DATA_PATH --split 949,50,1 --tokenizer-type HuggingFaceTokenizer '
        '--tokenizer-model "$TOKENIZER_MODEL")',
        "fi",
        *_checkpoint_lines(cfg),
        *_rendezvous_lines(cfg),
        "",
        f"torchrun --nnodes {cluster.nodes} --nproc_per_node {cluster.accelerators_per_node} "
        '--node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \\',
        '  "$MEGATRON_LM/pretrain_gpt.py" "${MEGATRON_ARGS[@]}" "${DATA_ARGS[@]}" "${CHECKPOINT_ARGS[@]}"',
        "",
    ]
    return "\n".join(lines)


def render(cfg: RunConfig, run_dir: Path) -> RenderedRun:
    run_dir = Path(run_dir)
    flags = megatron_flags(cfg)
    script = run_dir / SCRIPT_FILE
    write_text(script, _script(cfg, flags), executable=True)
    write_text(run_dir / ARGS_FILE, json.dumps({"flags": flags, "argv": flags_to_argv(flags)}, indent=2) + "\n")
    cluster = cfg.cluster
    # Documentation only: the registry marks this engine export only, so the launchers never run this line.
    argv = [
        "torchrun", "--nnodes", str(cluster.nodes), "--nproc_per_node", str(cluster.accelerators_per_node),
        "--node_rank", NODE_RANK, "--master_addr", MASTER_ADDR, "--master_port", MASTER_PORT,
        "pretrain_gpt.py", *flags_to_argv(flags),
    ]  # fmt: skip
    return RenderedRun(
        run_dir=str(run_dir),
        engine="megatron_lm",
        launcher="torchrun",
        nnodes=cluster.nodes,
        nproc_per_node=cluster.accelerators_per_node,
        argv=argv,
        env={},
        files=[SCRIPT_FILE, ARGS_FILE],
    )


# ------------------------------------------------------------------------------------------ checks
def _layout_problems(spec: ModelSpec, cfg: RunConfig) -> List[str]:
    """The support table's rules (zero stages, hybrid sharding, schedules, no offload: harness.plan.support),
    then Megatron's own: interleaving exactly with virtual stages."""
    layout, problems = cfg.layout, support_problems(cfg)
    # Megatron derives its data-parallel size as world / (tp*pp*cp): the mesh must cover the cluster exactly.
    problems += ParallelDims.of(layout).world_problems(cfg.cluster.nodes, cfg.cluster.accelerators_per_node)[0]
    if layout.pp > 1 and (layout.pp_schedule == "Interleaved1F1B") != (layout.pp_virtual_stages > 1):
        problems.append(f"layout.pp_schedule={layout.pp_schedule} with pp_virtual_stages={layout.pp_virtual_stages}: "
                        f"Megatron interleaves exactly when virtual stages > 1")
    if layout.pp == 1 and layout.pp_virtual_stages > 1:
        problems.append(f"layout.pp_virtual_stages={layout.pp_virtual_stages} needs pp > 1")
    return problems


def _shape_problems(spec: ModelSpec, cfg: RunConfig) -> List[str]:
    layout, problems = cfg.layout, []
    tp, pp, stages = layout.tp, layout.pp, layout.pp * layout.pp_virtual_stages
    if spec.num_heads % tp:
        problems.append(f"tp={tp} must divide num_attention_heads={spec.num_heads}")
    if spec.num_kv_heads % tp and tp % spec.num_kv_heads:
        problems.append(f"num_query_groups={spec.num_kv_heads} must be a multiple or divisor of tp={tp}")
    if spec.ffn_size % tp:
        problems.append(f"tp={tp} must divide ffn_hidden_size={spec.ffn_size} (column-parallel fc1)")
    explicit = list(layout.pp_stage_layers)
    if explicit:
        if len(explicit) != stages or sum(explicit) != spec.num_layers or min(explicit) < 0:
            problems.append(f"layout.pp_stage_layers={explicit} must have pp*pp_virtual_stages={stages} entries >= 0 "
                            f"summing to num_layers={spec.num_layers}")
    elif pp > 1 and spec.num_layers % stages:
        problems.append(f"num_layers={spec.num_layers} must be divisible by pp*pp_virtual_stages={stages} "
                        f"(or give layout.pp_stage_layers: --pipeline-model-parallel-layout)")
    if layout.pp_virtual_stages > 1 and layout.grad_accum % pp:
        problems.append(f"interleaved 1F1B: number of micro-batches grad_accum={layout.grad_accum} must be a "
                        f"multiple of pp={pp}")
    if layout.cp > 1 and layout.seq_len % (2 * layout.cp):
        problems.append(f"cp={layout.cp}: seq_len={layout.seq_len} must be divisible by 2*cp (causal load balancing)")
    if layout.tp > 1 and cfg.engine.sequence_parallel and layout.seq_len % tp:
        problems.append(f"--sequence-parallel: seq_len={layout.seq_len} must be divisible by tp={tp}")
    if spec.learned_positions and layout.seq_len > spec.max_positions:
        problems.append(f"seq_len={layout.seq_len} > max_position_embeddings={spec.max_positions} (learned positions)")
    return problems


def _expert_problems(spec: ModelSpec, cfg: RunConfig) -> List[str]:
    layout, problems = cfg.layout, []
    if layout.ep == 1:
        return problems
    if not spec.is_moe:
        problems.append(f"layout.ep={layout.ep} needs a MoE model (num_moe_experts), {spec.name} is dense")
        return problems
    if spec.num_experts % layout.ep:
        problems.append(f"ep={layout.ep} must divide num_experts={spec.num_experts}")
    if (ParallelDims.of(cfg.layout).dp * layout.cp) % layout.ep:
        problems.append(f"ep={layout.ep} must divide dp*cp={ParallelDims.of(cfg.layout).dp * layout.cp} "
                        f"(experts are sharded within the data-parallel x context-parallel ranks)")
    if layout.tp > 1 and not cfg.engine.sequence_parallel:
        problems.append(f"ep={layout.ep} with tp={layout.tp}: Megatron requires --sequence-parallel "
                        f"(engine.sequence_parallel=true)")
    return problems


def model_problems(cfg: RunConfig) -> List[str]:
    """The model families the export cannot write arguments for, whatever the layout."""
    model_type = spec_for(cfg.model).model_type
    if model_type not in MEGATRON_FAMILIES:
        return [f"model_type={model_type!r}: the Megatron-LM export knows {', '.join(MEGATRON_FAMILIES)}"]
    return []


def check(cfg: RunConfig) -> Tuple[List[str], List[str]]:
    """(errors, warnings): Megatron-LM's argument rules this layout could break, each naming field and value."""
    spec = spec_for(cfg.model)
    family = model_problems(cfg)
    if family:
        return family, []
    errors = _layout_problems(spec, cfg) + _shape_problems(spec, cfg) + _expert_problems(spec, cfg)
    warnings: List[str] = []
    if cfg.engine.sequence_parallel and cfg.layout.tp == 1:
        warnings.append("engine.sequence_parallel with tp=1: Megatron disables it")
    if cfg.engine.grad_reduce_in_bf16 and cfg.layout.precision not in ("bf16", "fp8"):
        warnings.append(f"engine.grad_reduce_in_bf16 with precision={cfg.layout.precision}: no effect (it applies "
                        "to bf16 and fp8 runs; the export does not render it)")
    sizes = window_sizes(spec.attention_windows)
    if len(sizes) > 1:
        errors.append(f"sliding windows of {', '.join(map(str, sizes))} keys in one model: Megatron-LM takes one "
                      "--window-size")
    if spec.activation in TANH_GELU:
        warnings.append(f"activation={spec.activation} (GELU's tanh approximation): Megatron-core's layers run exact "
                        "GELU (TransformerConfig has no tanh-GELU switch; --openai-gelu reaches no layer)")
    if vocab_divisor(spec.vocab_size, cfg.layout.tp) == 1 and spec.vocab_size % cfg.layout.tp:
        warnings.append(f"vocab_size={spec.vocab_size} is not divisible by tp={cfg.layout.tp}: Megatron pads it")
    return errors, warnings
