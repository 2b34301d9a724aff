"""Where the time of nd's step goes at world size one, phase by phase: the harness's own pieces (StageModule,
checkpoint_wrapper per layer, bf16 autocast over fp32 weights, causal_lm_loss, the harness's gradient clip and
torch's AdamW), each phase synchronised and timed apart, then the whole step unsynchronised as the engine runs
it. The 1B Llama of `make gpu-check`; one micro-batch of 2,048 tokens and two of 1,024.
Usage (on the GPU machine, from the repository root):  PYTHONPATH=$PWD python tools/gpu_step_phases.py OUT.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from harness.engines.grad_norm import clip_grad_norm
from harness.engines.lm_loss import causal_lm_loss, shifted_labels
from harness.engines.stage_module import StageModule

from gpu_host_overhead import LLAMA_1B  # noqa: E402  (this folder is on sys.path when run as a script)


def main(path: str, device: str = "cuda", config=LLAMA_1B, shapes=((1, 2048), (2, 1024)), iters: int = 5) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29534")
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
    dev = torch.device(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa")).to(dev)
    stage = StageModule(model, list(range(config["num_hidden_layers"])), embedding=True, head=True)
    for key, layer in list(stage.layers.items()):
        stage.layers[key] = checkpoint_wrapper(layer, preserve_rng_state=False)
    params = list(stage.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    out = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__}

    def micro(tokens, n):
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = causal_lm_loss(stage(tokens), shifted_labels(tokens))
            (loss / n).backward()
        return loss.detach().float()

    def clip():
        return clip_grad_norm([p.grad for p in params], 1.0, ranks_per_model=1, device=dev)

    def step_opt():
        opt.step()
        opt.zero_grad(set_to_none=True)

    for micro_batches, seq in shapes:
        batches = [torch.randint(0, config["vocab_size"], (1, seq)) for _ in range(micro_batches)]
        phases = {"micro_batches": [], "clip": [], "optimizer": [], "whole_step": []}
        for i in range(iters + 2):
            t = time.perf_counter()
            losses = []
            for tokens in batches:
                t0 = time.perf_counter()
                losses.append(micro(tokens.to(dev), micro_batches))
                sync()
                phases["micro_batches"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            clip()
            sync()
            phases["clip"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            step_opt()
            sync()
            phases["optimizer"].append(time.perf_counter() - t0)
            torch.stack(losses).mean().cpu()
        for i in range(iters + 2):  # as the engine runs it: no synchronisation until the loss comes back
            t = time.perf_counter()
            losses = [micro(tokens.to(dev), micro_batches) for tokens in batches]
            clip()
            step_opt()
            torch.stack(losses).mean().cpu()
            phases["whole_step"].append(time.perf_counter() - t)
        row = {k: statistics.median(v[2 * (len(v) // (iters + 2)):]) for k, v in phases.items()}
        row.update(micro_batch_count=micro_batches, seq=seq)
        out.setdefault("rows", []).append(row)
        print(json.dumps(row), flush=True)
        with open(path, "w") as fh:
            json.dump(out, fh, indent=1)
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    main(sys.argv[1])
