"""Where the device time of a GPU step goes, kernel by kernel: gpu-check's device-bound shape (the 1B Llama, four
micro-batches' worth of tokens in one: 4 x 2,048, no checkpointing, fp32 weights under bf16 autocast, as nd runs it
at world size one) under torch.profiler, in two phases (the forward + backward; the harness's clip + torch's AdamW
step), each CUDA kernel's time summed into the time model's parts:
  - gemm:        cuBLAS / CUTLASS matrix kernels (nvjet, sm90_xmma, cutlass, gemm);
  - attention:   the fused attention kernels (flash, fmha, cudnn's sdpa);
  - loss:        the cross-entropy's softmax and gather kernels over the vocabulary;
  - elementwise: everything else (norms, activations, casts, copies, reductions).
The 40 longest kernels by name are kept with their part. Beside them the wall time of the forward + backward
and of the clip + step, and the idle share (wall - kernels).
The kernel names come from a Chrome trace (`cat: kernel` events, `dur` in microseconds): stable across torch
versions, where FunctionEvent's time fields are not.
Usage (on the GPU machine, repository root):  PYTHONPATH=$PWD python tools/gpu_kernel_breakdown.py OUT.json [MB SEQ]
                                               (--cpu: the same flow on the CPU, CPU ops in place of kernels)
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Tuple

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_host_overhead import LLAMA_1B  # noqa: E402

from harness.engines.grad_norm import clip_grad_norm  # noqa: E402
from harness.engines.lm_loss import causal_lm_loss, shifted_labels  # noqa: E402
from harness.engines.stage_module import StageModule  # noqa: E402

# first match wins: attention before gemm (FlashAttention's kernels are CUTLASS templates)
PARTS = (("attention", re.compile(r"flash|fmha|sdpa|attention", re.I)),
         ("loss", re.compile(r"softmax|nll_loss|cross_entropy", re.I)),
         ("gemm", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|matmul|\bmm\b|addmm|bmm", re.I)))


TOP_KERNELS = 40  # the longest kernels by name, with their part: what a part's time is made of


def part_of(name: str) -> str:
    return next((part for part, pattern in PARTS if pattern.search(name)), "elementwise")


def kernel_seconds(prof, kernel_category: str) -> Dict[str, Tuple[float, int]]:
    """Seconds and count per kernel name, from the profile's Chrome trace."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text()).get("traceEvents", [])
    out: Dict[str, Tuple[float, int]] = {}
    for e in events:
        if e.get("cat") == kernel_category and "dur" in e:
            seconds, count = out.get(e["name"], (0.0, 0))
            out[e["name"]] = (seconds + e["dur"] * 1e-6, count + 1)
    return out


def by_part(kernels: Dict[str, Tuple[float, int]]) -> Dict[str, Dict[str, float]]:
    parts: Dict[str, Dict[str, float]] = {}
    for name, (seconds, count) in kernels.items():
        part = parts.setdefault(part_of(name), {"seconds": 0.0, "kernels": 0})
        part["seconds"] += seconds
        part["kernels"] += count
    return dict(sorted(parts.items()))


def timed_profile(fn: Callable[[], None], sync: Callable[[], None], activities, iters: int):
    """Median wall seconds of `iters` synchronised calls, and a profile of one more."""
    walls = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        sync()
        walls.append(time.perf_counter() - t)
    with profile(activities=activities) as prof:
        fn()
        sync()
    return statistics.median(walls), prof


def main(path: str, device: str = "cuda", micro_batch: int = 4, seq: int = 2048, iters: int = 5,
         config=LLAMA_1B) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29535")
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
    dev = torch.device(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
    category = "kernel" if device == "cuda" else "cpu_op"
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa")).to(dev)
    stage = StageModule(model, list(range(config["num_hidden_layers"])), embedding=True, head=True)
    params = list(stage.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    tokens = torch.randint(0, config["vocab_size"], (micro_batch, seq), device=dev)

    def micro():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = causal_lm_loss(stage(tokens), shifted_labels(tokens))
        loss.backward()

    def step():
        clip_grad_norm([p.grad for p in params], 1.0, ranks_per_model=1, device=dev)
        opt.step()

    micro()
    step()  # AdamW's states exist from here on
    out = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "micro_batch": micro_batch, "seq": seq, "phases": {}}
    for name, fn in (("forward_backward", micro), ("clip_and_optimizer", step)):
        wall, prof = timed_profile(fn, sync, activities, iters)
        kernels = kernel_seconds(prof, category)
        busy = sum(seconds for seconds, _ in kernels.values())
        top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:TOP_KERNELS]
        out["phases"][name] = {"wall_s": wall, "kernel_s": busy, "idle_share": 1 - busy / wall,
                               "parts": by_part(kernels),
                               "top_kernels": [{"name": k[:160], "part": part_of(k), "seconds": s, "calls": n}
                                               for k, (s, n) in top]}
        print(name, json.dumps({k: v for k, v in out["phases"][name].items() if k != "top_kernels"}), flush=True)
        opt.zero_grad(set_to_none=False)
    Path(path).write_text(json.dumps(out, indent=1))
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    cpu = "--cpu" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--cpu"]
    if not args or (not cpu and not torch.cuda.is_available()):
        sys.exit("usage: gpu_kernel_breakdown.py OUT.json [MB SEQ] on a CUDA machine, or OUT.json --cpu"
                 if args else "usage: gpu_kernel_breakdown.py OUT.json [MB SEQ] | OUT.json --cpu")
    if cpu:
        main(args[0], device="cpu", micro_batch=1, seq=64, iters=1,
             config={**LLAMA_1B, "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024, "head_dim": 64})
    else:
        main(args[0], micro_batch=int(args[1]) if len(args) > 1 else 4, seq=int(args[2]) if len(args) > 2 else 2048)
