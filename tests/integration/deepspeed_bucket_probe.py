"""One DeepSpeed ZeRO step on one CPU rank with a given zero_optimization section; prints (last line, JSON) the
bytes of the gradient reduction buckets the optimizer holds while the backward runs.

Usage: python -m tests.integration.deepspeed_bucket_probe '<zero section JSON>' <bf16|fp32> <port>"""

import json
import sys

from tests.integration.deepspeed_one_rank import one_rank_engine


def main(zero: dict, precision: str, port: str) -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    engine = one_rank_engine(model, zero, precision, port)
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
