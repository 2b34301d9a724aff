"""One DeepSpeed ZeRO step on one CPU rank with a given zero_optimization section; prints (last line, JSON) the
bytes of the gradient reduction buckets the optimizer holds while the backward runs.

Usage: python -m tests.integration.deepspeed_bucket_probe '<zero section JSON>' <bf16|fp32> <port>"""

import json
import os
import sys


def main(zero: dict, precision: str, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed
    import torch

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # gloo, no JIT compile
    deepspeed.init_distributed(dist_backend="gloo")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    config = {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "bf16": {"enabled": precision == "bf16"}, "zero_optimization": zero,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    seen = []

    def during_backward(module, grad_output):
        # the first layer's backward runs last: every later gradient has reached the buckets by then
        total = 0
        for bucket in engine.optimizer.ipg_buckets.values():
            buffers = bucket.buffer if isinstance(bucket.buffer, list) else [bucket.buffer]
            total += sum(b.numel() * b.element_size() for b in buffers if b is not None)
        seen.append(total)

    model[0].register_full_backward_pre_hook(during_backward)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    loss = engine(torch.randn(1, 64, dtype=dtype, requires_grad=True)).float().pow(2).mean()
    engine.backward(loss)
    engine.step()
    print(json.dumps({"bucket_bytes_in_backward": max(seen)}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2], sys.argv[3])
