"""How the training regime (torch.compile, FP8, autocast over fp32 weights) changes the time model's per-layer
work: one rule per effect."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

from harness.config import schema
from harness.plan.model_spec import ModelSpec
from harness.plan.parallel_dims import ParallelDims

# Kernels of one decoder layer's memory-bound work when its block is compiled (engine.compile). Inductor fuses
# producer/consumer chains of pointwise ops (vertical) and sibling ops on the same input (horizontal), and a
# reduction with its pointwise prologue and epilogue (Ansel et al., "PyTorch 2", ASPLOS 2024, section 5; PyTorch
# blog "Improving LayerNorm/RMSNorm performance with torch.compile", 2025: one kernel per norm). GEMMs stay
# library calls with no fused epilogue by default, so only the elementwise part moves. Forward: residual add +
# RMSNorm twice, rotary on q and k, SwiGLU: four kernels (eager: 30, compute_time.LAYER_ELEMENTWISE_OPS); the
# backward about two per forward one, as eager's.
COMPILED_LAYER_ELEMENTWISE_OPS: Dict[str, int] = {"forward": 4, "backward": 8}


def fused_elementwise(engine) -> bool:
    """Whether a layer's memory-bound work runs as fused kernels (the COMPILED_LAYER_ELEMENTWISE_OPS count and
    compiled_layer_elementwise_bytes): under torch.compile (engine.compile), and always on Megatron-LM, whose
    export runs Transformer Engine layers (--transformer-impl transformer_engine: the norm fused into
    LayerNormLinear / LayerNormMLP, one kernel each) with its default fusions left on (megatron/training/
    arguments.py: --no-bias-swiglu-fusion, --no-bias-gelu-fusion, --no-bias-dropout-fusion and --no-rope-fusion
    are store_false flags, so SwiGLU / GELU, the residual add and rotary each run as one kernel). Eager
    engines (DeepSpeed, Accelerate FSDP, nd without compile) run transformers' unfused ops."""
    return bool(engine.compile) or engine.name == "megatron_lm"


def compiled_layer_elementwise_bytes(spec: ModelSpec, tokens: float, tp: int, dtype_bytes: int,
                                     sp: bool = False) -> float:
    """Bytes one compiled layer's fused forward kernels read and write for `tokens` tokens on a TP rank.

    Each fused kernel reads its inputs and writes its outputs once; the intermediates (the fp32 upcast of
    RMSNorm, silu(gate), rotary's rotated halves) stay in registers. Residual add + RMSNorm: read the residual
    stream and the branch output, write the new stream and its normed copy (4e·h, against eager's
    (3e + 32)·h norm plus 3e·h add). Rotary: read and write q and k once (2e per element, eager 8e). SwiGLU:
    read gate and up, write their product (3e·f, eager 5e·f); a two-matrix MLP's activation reads and writes f.
    Under sequence parallelism (`sp`) the add + norm kernels run on 1 / tp of the tokens.
    """
    e, h = dtype_bytes, spec.hidden_size
    _, _, q, kv = spec.mean_attention()
    q, kv, f = q / tp, kv / tp, spec.ffn_size / tp
    norms = 2 * 4 * e * h / (tp if sp else 1)
    rotary = 2 * e * (q + kv) if not spec.learned_positions else 0
    act = (3 if spec.gated_mlp else 2) * e * f * (spec.experts_per_token if spec.is_moe else 1)
    return tokens * (norms + rotary + act)


# ---- FP8 (layout.precision=fp8) ----
# FP8 training converts the decoder layers' linear projections only: torchao's float8 training (torchtitan's
# float8 converter) swaps each nn.Linear for a Float8Linear whose three GEMMs (output, input gradient, weight
# gradient) run in FP8 with dynamic scales; attention, norms, the loss and the output projection stay bf16
# (torchtitan's filter keeps `output` in bf16). Megatron-LM's Transformer Engine path does the same with
# --fp8-format hybrid (E4M3 forward, E5M2 gradients). The high-precision weights stay what bf16 keeps, so the
# states are bf16's.
FP8_BASE_PRECISION = "bf16"
# The GEMM dimension multiple FP8 needs (torch._scaled_mm), defined with the precision choice.
FP8_DIM_MULTIPLE = schema.FP8_DIM_MULTIPLE
# Why an engine cannot train in FP8 (absent: it can).
FP8_ENGINE_REASONS = {
    "deepspeed": "DeepSpeed 0.19 has no FP8 training path of its own (its FP8 examples swap the model's layers "
                 "for Transformer Engine modules, which this harness does not build); use engine=nd, fsdp or "
                 "megatron_lm",
}
# torchao float8 recipes (torchao.float8.Float8LinearConfig.from_recipe_name): per-tensor dynamic scales, the
# default, or per-row scales (finer, slower; needs sm_89+ and a rowwise _scaled_mm).
FP8_RECIPE = "tensorwise"
# Transformer Engine's delayed scaling as Megatron-LM exposes it: amax history of the last 1024 steps, scale
# from its maximum (Megatron-LM arguments.py: --fp8-amax-history-len, --fp8-amax-compute-algo; NVIDIA's
# NeMo/Megatron GPT recipes use 1024 and max).
MEGATRON_FP8 = {"format": "hybrid", "amax_history_len": 1024, "amax_compute_algo": "max"}


def compute_precision(precision: str) -> str:
    """The precision of everything FP8 does not convert (and of the states): fp8 runs on bf16."""
    return FP8_BASE_PRECISION if precision == "fp8" else precision


def fp8_problems(engine: str, accelerator: str, fp8_peak: bool, dims: Dict[str, int],
                 standin: bool = False) -> List[str]:
    """Why layout.precision=fp8 cannot run: an engine without FP8, a device without FP8 tensor cores (no
    FP8 entry in its datasheet row: A100, CPUs), or linear dimensions `dims` (name -> per-rank size) that
    FP8 GEMMs cannot take.

    A device without FP8 is refused for a run of its own (it would train slower than bf16, not faster), but
    not for a GPU recipe's CPU stand-in (`standin`): there torchao's float8 training executes as it does on
    the GPU (the casts, the dynamic scales, the FP8 tensors) and torch._scaled_mm's CPU kernel multiplies the
    FP8 values at fp32 precision, so the recipe's FP8 path runs end to end with the device's GEMM speed-up
    the one thing not executed (harness.config.standin names it)."""
    problems = []
    if engine in FP8_ENGINE_REASONS:
        problems.append(f"layout.precision=fp8 with engine={engine}: {FP8_ENGINE_REASONS[engine]}")
    if not fp8_peak and not standin:
        problems.append(f"layout.precision=fp8 on accelerator={accelerator}: it has no FP8 tensor cores (FP8 "
                        "GEMMs need Hopper / Ada / Blackwell or MI300-class devices)")
    bad = [f"{name}={size}" for name, size in dims.items() if size % FP8_DIM_MULTIPLE]
    if bad:
        problems.append(f"layout.precision=fp8: {', '.join(bad)} must be divisible by {FP8_DIM_MULTIPLE} "
                        "(FP8 GEMMs, torch._scaled_mm)")
    return problems


# Which FP8 path an engine takes: torchao's float8 training swaps the model's nn.Linear modules (nd, fsdp), so
# what it converts is the model's own module types (ModelSpec.linear_attention_share / linear_mlp_share);
# Megatron-LM builds its layers from Transformer Engine, whose linears and grouped expert GEMMs all run FP8.
TORCHAO_FP8_ENGINES = ("nd", "fsdp")


def fp8_converted_shares(spec: ModelSpec, engine: str) -> Tuple[float, float]:
    """(attention block, MLP) shares of the layer's weight-GEMM FLOPs that FP8 runs on `engine`."""
    if engine in TORCHAO_FP8_ENGINES:
        return spec.linear_attention_share, spec.linear_mlp_share
    return 1.0, 1.0


def fp8_conversion_found(spec: ModelSpec, engine: str) -> Tuple[List[str], List[str]]:
    """(problems, warnings) of what FP8 would convert of this model on this engine: a model FP8 converts nothing
    of is refused (the run would be bf16 under an FP8 label); a part left bf16 is said, with the share of the
    layers' weight-GEMM FLOPs FP8 runs."""
    attention, mlp = fp8_converted_shares(spec, engine)
    if attention == mlp == 1.0:
        return [], []
    if attention == mlp == 0.0:
        return [f"layout.precision=fp8 with model={spec.name}: its decoder layers hold no nn.Linear (transformers "
                f"builds {spec.model_type}'s projections as Conv1D) and engine={engine} trains FP8 with torchao's "
                "float8 training, which converts nn.Linear modules only: the run would be bf16"], []
    # a token's weight FLOPs are 2 per active parameter: the blocks' active parameters weigh their shares
    mlp_params = spec.active_layer_params - spec.attention_params - spec.norm_params
    converted = (attention * spec.attention_params + mlp * mlp_params) / (spec.attention_params + mlp_params)
    left = "its routed experts (grouped tensors, not nn.Linear modules)" if spec.is_moe else "its non-Linear layers"
    return [], [f"layout.precision=fp8 with model={spec.name} on engine={engine}: torchao's float8 training converts "
                f"nn.Linear modules only, so {left} stay bf16: FP8 runs {converted:.0%} of the layers' weight-GEMM "
                "FLOPs"]


def fp8_linear_dims(spec: ModelSpec, tp: int) -> Dict[str, int]:
    """The per-rank dimensions of the linear layers FP8 converts (hidden, q / kv widths and ffn split by tp)."""
    _, _, q, kv = spec.mean_attention()
    return {"hidden_size": spec.hidden_size, "q_width/tp": int(q) // tp, "kv_width/tp": int(kv) // tp,
            "intermediate_size/tp": spec.ffn_size // tp}


def fp8_gemm_speedup(bf16_peak: Optional[float], fp8_peak: Optional[float]) -> float:
    """How much faster a converted GEMM runs: the ratio of the datasheet's dense FP8 and BF16 peaks (2 on
    H100 / H200 / B200), at the same achievable fraction of peak. A device without an FP8 peak (a CPU
    stand-in: torch's CPU _scaled_mm multiplies the FP8 values at fp32 precision) gains nothing: 1."""
    if not fp8_peak or not bf16_peak:
        return 1.0
    return fp8_peak / bf16_peak


def fp8_cast_bytes(gemms, dtype_bytes: int, backward: bool, delayed_scaling: bool = False) -> float:
    """Bytes the FP8 casts of one layer move in one micro-batch. torchao's dynamic tensorwise recipe: per
    converted GEMM operand an amax pass (read e bytes per element) and a scaled cast (read e, write 1), 2e + 1
    bytes per element; forward casts the input (m x k) and the weight (k x n), backward the output gradient
    (m x n) and, for the transposed layouts of the two gradient GEMMs, the input and weight again.
    Transformer Engine's delayed scaling (`delayed_scaling`, Megatron-LM) scales by the amax history and records
    the new amax inside the cast kernel, e + 1 bytes per element, and casts a weight once a step, caching it for
    the step's other micro-batches (te.Linear's is_first_microbatch): activations and gradients alone here (the
    weights' one cast a step, e + 1 bytes a weight element, is left out: 2 ms of a 6 s step for Llama-70B on 32
    ranks)."""
    per_element = (dtype_bytes + 1) if delayed_scaling else 2 * dtype_bytes + 1
    total = 0.0
    for m, k, n, count in gemms:
        total += count * (m * k + (0 if delayed_scaling else k * n) + (m * n if backward else 0))
    return per_element * total


# The FP8 recipe each engine runs: Megatron-LM's Transformer Engine scales by its amax history (MEGATRON_FP8);
# torchao (nd, fsdp) computes each scale from the tensor at hand.
DELAYED_SCALING_ENGINES = ("megatron_lm",)


def fp8_scaling_state_bytes(engine: str, linear_weights: int) -> int:
    """Scaling state an FP8 recipe keeps between steps for `linear_weights` converted linear layers.

    torchao's dynamic recipes (tensorwise, rowwise) compute each scale from the tensor at hand and keep
    nothing. Transformer Engine's delayed scaling (Megatron-LM) keeps, per FP8 operand (input, weight,
    gradient: 3 a linear), an fp32 amax history of amax_history_len entries plus a scale and its inverse.
    """
    if engine != "megatron_lm":
        return 0
    return linear_weights * 3 * (MEGATRON_FP8["amax_history_len"] + 2) * 4


def mfu_by_peak(mfu_at: Callable[[Optional[float]], Optional[float]], bf16_peak: Optional[float],
                fp8_peak: Optional[float]) -> Dict[str, Optional[float]]:
    """Both MFU conventions of an FP8 run: model FLOPs against the bf16 dense peak (comparable with bf16
    runs; what torchtitan's MFU would mean) and against the FP8 dense peak (the device's ceiling for the
    converted GEMMs; torchtitan does not report MFU under float8 for this ambiguity)."""
    return {"bf16_peak": mfu_at(bf16_peak), "fp8_peak": mfu_at(fp8_peak)}


def torchao_float8_config() -> Dict[str, object]:
    """The torchao float8 training settings nd and fsdp render (torchao.float8.Float8LinearConfig.from_recipe_name
    and convert_to_float8_training's module filter, as torchtitan's float8 converter sets them): the recipe,
    the decoder layers' linears only (the LM head stays bf16), and bf16 all-gathers (FP8 all-gather off, so the
    gathered copies are what the memory model charges)."""
    return {"recipe_name": FP8_RECIPE, "skip_modules": ["lm_head"], "dim_multiple": FP8_DIM_MULTIPLE,
            "enable_fsdp_float8_all_gather": False}


def megatron_fp8_flags() -> Dict[str, object]:
    """Megatron-LM's FP8 arguments (arguments.py, Transformer Engine delayed scaling)."""
    return {"--fp8-format": MEGATRON_FP8["format"], "--fp8-amax-history-len": MEGATRON_FP8["amax_history_len"],
            "--fp8-amax-compute-algo": MEGATRON_FP8["amax_compute_algo"]}


# ---- bf16 autocast over fp32 weights ----
# nd with one data rank has no data-parallel wrapper, so no mixed-precision policy casts its weights to bf16 once
# per gather: it computes under torch.autocast over the fp32 weights (harness.engines.nd_plans). Then the embedding's
# output, and with it the residual stream and both RMSNorms, stay fp32; rotary multiplies by fp32 cos / sin; each
# linear casts its input and its weight to bf16, and its weight gradient back to fp32. Counted on transformers'
# Llama layer (TorchDispatchMode: bytes every non-GEMM, non-view op reads and writes; tests/unit/plan/
# test_autocast_traffic.py counts it again), the token-proportional traffic in units of the bf16 forward formula
# (compute_time.layer_elementwise_bytes at 2 bytes): forward 195 / 148, backward 442 / 148 (bf16 weights: 151 and
# 335); each linear weight moves 6 bytes forward (read fp32, write bf16) and 6 backward (read bf16, write fp32).
AUTOCAST_LAYER_TRAFFIC: Dict[str, float] = {"forward": 1.32, "backward": 2.98}
AUTOCAST_LAYER_ELEMENTWISE_OPS: Dict[str, int] = {"forward": 40, "backward": 71}
AUTOCAST_WEIGHT_CAST_BYTES = 6


def autocast_over_fp32_weights(engine_name: str, layout) -> bool:
    """Whether the run's bf16 compute is torch.autocast over fp32 weights: nd with one data rank (dp x cp = 1,
    any tp and pp). Every other bf16 path computes with bf16 weights: FSDP's param_dtype, DeepSpeed's bf16
    weights, Megatron-LM's, nd's own fully_shard / replicate policy over several data ranks."""
    return (engine_name == "nd" and compute_precision(layout.precision) == "bf16"
            and ParallelDims.of(layout).data_ranks == 1)
