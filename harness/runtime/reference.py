"""The single-process reference every multi-rank loss is compared with: one process that sees every
data-parallel rank's micro-batches at once, with the harness's optimizer and clipping."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Tuple

import torch

from harness.engines.optimizer import ADAMW_BETAS, ADAMW_EPS
from harness.modeling.model import build_model
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
# of an initialised model on uniform tokens, ln(vocab), within 2 % (tests/integration/test_meta_init.py).
META_INIT_RTOL = 0.02


def loss_rtol(engine: str, precision: str) -> float:
    return BF16_RTOL[engine] if precision == "bf16" else FP32_RTOL


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
