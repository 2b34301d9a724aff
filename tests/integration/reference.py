"""The single-process reference every multi-rank loss is compared with: one process that sees every
data-parallel rank's micro-batches at once, with the harness's optimizer and clipping."""

import copy
from typing import Any, Dict, List, Optional, Tuple

import torch

from harness.engines.optimizer import ADAMW_BETAS, ADAMW_EPS
from harness.modeling.model import build_model
from harness.runtime.data import micro_batches, token_source


def single_process_losses(cfg: Any, hf_config: Dict[str, Any], rows: int, grad_accum: int, n_steps: int,
                          bf16: bool = False, lr: Optional[float] = None,
                          grad_clip: Optional[float] = None) -> Tuple[List[float], torch.nn.Module]:
    """(per-step mean losses, the trained fp32 model). `rows`: sequences per micro-batch over all ranks.
    bf16: the forward and backward run on a bf16 copy whose gradients accumulate into fp32 master weights
    (buffers such as rotary inv_freq stay fp32), as FSDP's and DeepSpeed's mixed precision do."""
    bench = cfg.bench
    model = build_model(hf_config, bench.seed)
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
