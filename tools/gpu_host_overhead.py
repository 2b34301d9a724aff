"""Host-side cost of an eager training step on a GPU machine: how long the host takes to issue a micro-batch's
kernels, against how long the device takes to run them. At short sequences the host is the bottleneck and
the step time stops falling with the token count: that floor, per micro-batch, is what this measures.

Measured with plain torch and transformers (no harness code on the timed path), on the 1B Llama shape of
`make gpu-check` (hidden 2048, 16 layers, SDPA, fp32 weights under bf16 autocast, as nd runs it at world size
one), and FSDP2's fully_shard over one rank (its pre / post hooks):
  - op_chain:   seconds per small op of a chain of y * 1.0001 with autograd (calibrate.op_latency on the GPU);
  - ops:        aten ops of one forward + backward, counted with a TorchDispatchMode (compute and view ops);
  - steps:      forward + backward seconds by sequence length (mb 1), wall clock around a synchronised step,
                and the host's issue time (until backward() returns, before the synchronize);
  - optimizer:  AdamW step seconds over the model's fp32 parameters (foreach, torch's CUDA default).
Usage (on the GPU machine):  python tools/gpu_host_overhead.py OUT.json
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

DEV = "cuda"
MODEL_YAML = Path(__file__).resolve().parents[1] / "hydra_configs" / "model" / "llama3_2_1b.yaml"


def llama_1b_config() -> dict:
    """gpu-check's model: Llama-3.2-1B's shape from the harness's model preset (its hf_config)."""
    hf_config = dict(yaml.safe_load(MODEL_YAML.read_text())["hf_config"])
    hf_config.pop("model_type")
    return hf_config


LLAMA_1B = llama_1b_config()
SEQS = (32, 128, 512, 1024, 2048, 4096)


def op_chain(n: int = 2000, grad: bool = True) -> float:
    x = torch.randn(64, device=DEV, requires_grad=grad)

    def run():
        y = x
        for _ in range(n):
            y = y * 1.0001
        if grad:
            y.sum().backward()

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        run()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best / ((2 if grad else 1) * n)


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.compute, self.view = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.view_copy in func.tags or func.is_view or "view" in func.__name__ or func.__name__.startswith(
                ("t.", "transpose", "expand", "unsqueeze", "squeeze", "slice", "select", "permute", "detach",
                 "alias", "_unsafe_view", "as_strided", "split", "unbind")):
            self.view += 1
        else:
            self.compute += 1
        return func(*args, **(kwargs or {}))


def step_fn(model, seq: int, mb: int = 1):
    ids = torch.randint(0, LLAMA_1B["vocab_size"], (mb, seq), device=DEV)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()

    return step


def timed(step, warmup: int = 3, iters: int = 6):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    walls, issues = [], []
    for _ in range(iters):
        t = time.perf_counter()
        step()
        issues.append(time.perf_counter() - t)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t)
    return {"wall_s": statistics.median(walls), "issue_s": statistics.median(issues), "walls": walls}


def count_ops(step):
    mode = Count()
    with mode:
        step()
    torch.cuda.synchronize()
    return {"compute": mode.compute, "view": mode.view}


def sweep(model, label, out, seqs=SEQS):
    rows = out.setdefault("steps", [])
    for seq in seqs:
        try:
            row = timed(step_fn(model, seq))
        except Exception as exc:  # keep what was measured
            row = {"error": repr(exc)[:300]}
        row.update(variant=label, seq=seq, mb=1)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "walls"}), flush=True)
    model.zero_grad(set_to_none=True)


def main(path: str) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    out = {"schema": "gpu-host/1", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cpu": platform.processor(), "cpu_count": os.cpu_count()}
    try:
        out["cpu"] = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")][0]
    except Exception:
        pass
    import transformers
    out["transformers"] = transformers.__version__

    def save():
        with open(path, "w") as fh:
            json.dump(out, fh, indent=1)

    out["op_chain_autograd_s"] = op_chain(grad=True)
    out["op_chain_no_grad_s"] = op_chain(grad=False)
    print("op chain", out["op_chain_autograd_s"], out["op_chain_no_grad_s"], flush=True)
    save()

    torch.manual_seed(0)
    config = LlamaConfig(**LLAMA_1B, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).to(DEV)
    out["ops_eager_seq32"] = count_ops(step_fn(model, 32))
    print("ops", out["ops_eager_seq32"], flush=True)
    model.zero_grad(set_to_none=True)
    sweep(model, "eager", out)
    save()

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step_fn(model, 32)()
    out["adamw_foreach"] = timed(lambda: opt.step(), warmup=2, iters=5)
    print("adamw", out["adamw_foreach"]["wall_s"], flush=True)
    del opt
    model.zero_grad(set_to_none=True)
    save()

    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    out["ops_recompute_seq32"] = count_ops(step_fn(model, 32))
    sweep(model, "full_recompute", out, seqs=(32, 512, 2048))
    model.gradient_checkpointing_disable()
    save()

    try:
        import torch.distributed as dist
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1)
        torch.manual_seed(0)
        fmodel = LlamaForCausalLM(config).to(DEV)
        del model
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in fmodel.model.layers:
            fully_shard(layer, mp_policy=policy)
        fully_shard(fmodel, mp_policy=policy)
        out["ops_fsdp2_seq32"] = count_ops(step_fn(fmodel, 32))
        print("fsdp2 ops", out["ops_fsdp2_seq32"], flush=True)
        sweep(fmodel, "fsdp2", out, seqs=(32, 512, 1024, 2048))
        dist.destroy_process_group()
    except Exception as exc:
        out["fsdp2_error"] = repr(exc)[:500]
        print("fsdp2 failed", exc, flush=True)
    save()


if __name__ == "__main__":
    main(sys.argv[1])
