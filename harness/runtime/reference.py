"""The single-process reference every multi-rank loss is compared with: one process that sees every
data-parallel rank's micro-batches at once, with the harness's optimizer and clipping."""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, List, Optional, Tuple

import torch

from harness.engines.optimizer import ADAMW_BETAS, ADAMW_EPS
from harness.modeling.model import build_model
from harness.plan.parallel_dims import ParallelDims
from harness.plan.regime import compute_precision
from harness.runtime.data import micro_batches, token_source

# Relative tolerances of a run's per-step losses against this reference (bf16 per engine, fp32 for all).
# FSDP and DeepSpeed as their integration suites (tests/integration/test_fsdp.py: one bf16 rounding of a
# gradient sum, 1e-4; test_deepspeed.py: bf16 gradients accumulated in bf16, 2e-3). nd adds tensor
# parallelism: a row-parallel projection's partial outputs are summed in bf16 across tp ranks, one more
# rounding (u = 2^-8) per output element, averaged over the tokens' logits: measured <= 1.5e-4 after
# four steps; 5e-4 leaves a 3x margin and stays 8x below one bf16 rounding of the loss itself.
BF16_RTOL = {"fsdp": 1e-4, "deepspeed": 2e-3, "nd": 5e-4}
FP32_RTOL = 1e-5
# A model built sharded (model.init=meta) draws other weights than a full build, so it is held to the loss
# of an initialised model on uniform tokens (initialised_loss_band), within 2 % (tests/integration/test_meta_init.py).
META_INIT_RTOL = 0.02


# FP8 (layout.precision=fp8) against the bf16 reference. The forward operands of a converted GEMM are e4m3:
# 3 mantissa bits, round to nearest, unit roundoff u = 2^-4. In the binade [2^e, 2^(e+1)) the absolute error
# is uniform on +-u * 2^e (RMS 2u * 2^e / sqrt 12); over values spread evenly in log scale, the mean of
# (2^e / x)^2 is 3 / (8 ln 2), so a cast's relative RMS error is u / sqrt(8 ln 2) = 2.7 %. A product of two
# casts: u / sqrt(4 ln 2) = 3.75 %; summed over K terms of random sign, error and value both grow as sqrt K,
# so a GEMM's output is off by u / sqrt(4 ln 2) RMS, zero mean (measured 3.7 %: tests/integration/test_fp8.py).
# The loss is a mean over T tokens of cross-entropy, whose gradient in the logits (softmax - one-hot) has
# l1 norm <= 2; a logit of an initialised model has RMS s = initializer_range * sqrt(hidden)
# (initialised_loss_band), so zero-mean errors of that relative size move the loss by about
# 2 * 3.75 % * s / sqrt(T), relative to the loss ln(vocab). FP8_MARGIN covers the tail of that RMS estimate
# and the backward's e5m2 gradients over a few steps (measured on the tiny Llamas: at most 1.4x the
# estimate over 3 to 8 steps).
FP8_UNIT_ROUNDOFF = 2.0 ** -4
FP8_MARGIN = 4


def fp8_gemm_error() -> float:
    """Relative RMS error of an e4m3 x e4m3 GEMM's output (the derivation above)."""
    return FP8_UNIT_ROUNDOFF / math.sqrt(4 * math.log(2))


def fp8_loss_rtol(hf_config: Dict[str, Any], tokens: int) -> float:
    """The relative tolerance of an FP8 run's losses against the bf16 reference, for `tokens` tokens a step."""
    from harness.config.model_shape import hf_config_object

    config = hf_config_object(hf_config)
    gemm_error = fp8_gemm_error()
    logit_rms = config.initializer_range * math.sqrt(config.hidden_size)
    return FP8_MARGIN * 2 * gemm_error * logit_rms / (math.sqrt(tokens) * math.log(config.vocab_size))


def reference_precision(precision: str) -> str:
    """The precision of the single-process reference: fp8's is bf16 (FP8 converts only the linears, and
    keeps bf16's states: harness.plan.regime.compute_precision)."""
    return compute_precision(precision)


def loss_rtol(cfg: Any) -> float:
    """The relative tolerance of a run's per-step losses against single_process_losses at
    reference_precision."""
    layout = cfg.layout
    if layout.precision == "fp8":
        tokens = layout.micro_batch * ParallelDims.of(layout).dp * layout.grad_accum * layout.seq_len
        return fp8_loss_rtol(cfg.model.hf_config, tokens)
    return BF16_RTOL[cfg.engine.name] if layout.precision == "bf16" else FP32_RTOL


def initialised_loss_band(hf_config: Dict[str, Any]) -> Tuple[float, float]:
    """(low, high) of the loss a freshly initialised causal LM with a Llama-style head reaches on uniform
    tokens, while its first steps train. The final RMSNorm (weight 1) leaves each hidden component of RMS 1,
    so a logit z_i = h . w_i with w_i ~ N(0, r^2) (transformers' init, r = initializer_range) is N(0, s^2),
    s^2 = r^2 * hidden_size. Over V classes E[logsumexp z] ~ ln V + s^2 / 2 (the mean of exp z is
    exp(s^2 / 2)) and the target's logit averages 0: the loss starts at ln V + s^2 / 2. On uniform tokens
    nothing better than ln V is learnable, and training moves the loss from the start towards it.
    Llama-3.2-1B: s^2 = 0.02^2 * 2048 = 0.82, 11.76 -> 12.17 (3.5 % above ln V); the tiny Llama: 0.2 %."""
    from harness.config.model_shape import hf_config_object

    config = hf_config_object(hf_config)
    uniform = math.log(config.vocab_size)
    return uniform, uniform + config.initializer_range ** 2 * config.hidden_size / 2


def single_process_losses(cfg: Any, hf_config: Dict[str, Any], rows: int, grad_accum: int, n_steps: int,
                          bf16: bool = False, lr: Optional[float] = None, grad_clip: Optional[float] = None,
                          device: str = "cpu") -> Tuple[List[float], torch.nn.Module]:
    """(per-step mean losses, the trained fp32 model). `rows`: sequences per micro-batch over all ranks.
    bf16: the forward and backward run on a bf16 copy whose gradients accumulate into fp32 master weights
    (buffers such as rotary inv_freq stay fp32), as FSDP's and DeepSpeed's mixed precision do. `device`:
    where the model and its batches live (the runs' own device, so their kernels are the reference's)."""
    bench = cfg.bench
    model = build_model(hf_config, bench.seed).to(device)
    compute = model
    if bf16:
        compute = copy.deepcopy(model)
        for param in compute.parameters():
            param.data = param.data.to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=bench.lr if lr is None else lr, betas=ADAMW_BETAS,
                                  eps=ADAMW_EPS, weight_decay=bench.weight_decay)
    source = token_source(cfg.data, hf_config["vocab_size"], cfg.layout.seq_len)
    losses = []
    for step in range(n_steps):
        if compute is not model:
            for master, working in zip(model.parameters(), compute.parameters()):
                working.data.copy_(master.data)
        step_losses = []
        for tokens in micro_batches(source, step, rows, grad_accum, 0, 1):
            tokens = tokens.to(device)
            loss = compute(input_ids=tokens, labels=tokens).loss
            (loss / grad_accum).backward()
            step_losses.append(float(loss.detach()))
            if compute is not model:
                for master, working in zip(model.parameters(), compute.parameters()):
                    grad = working.grad.float()
                    master.grad = grad if master.grad is None else master.grad + grad
                    working.grad = None
        torch.nn.utils.clip_grad_norm_(model.parameters(), bench.grad_clip if grad_clip is None else grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(sum(step_losses) / len(step_losses))
    return losses, model
