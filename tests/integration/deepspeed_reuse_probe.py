"""DeepSpeed ZeRO-3 on one CPU rank, a stack of eight 64 x 64 linear layers, a given stage3_max_reuse_distance:
prints (last line, JSON) which layers' weights are still gathered (AVAILABLE) when the backward starts, once the
parameter trace is complete (third step).

Usage: python -m tests.integration.deepspeed_reuse_probe <max_reuse_distance> <port>"""

import json
import os
import sys

LAYERS, WIDTH = 8, 64


def main(reuse: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed
    import torch
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # gloo, no JIT compile
    deepspeed.init_distributed(dist_backend="gloo")
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)])
    # no prefetch and no persistent small parameters: what stays gathered is what the reuse rule keeps
    zero = {"stage": 3, "stage3_max_reuse_distance": reuse, "stage3_prefetch_bucket_size": 0,
            "stage3_param_persistence_threshold": 0}
    config = {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "zero_optimization": zero, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    seen = {}

    def at_backward_start(module, grad_output):
        seen["gathered"] = [i for i, layer in enumerate(model) if layer.weight.ds_status == ZeroParamStatus.AVAILABLE]

    model[-1].register_full_backward_pre_hook(at_backward_start)
    for _ in range(3):  # the first step records the trace; the reuse rule applies once it is complete
        engine.backward(engine(torch.randn(1, WIDTH)).pow(2).mean())
        engine.step()
    print(json.dumps({"gathered_at_backward_start": seen["gathered"]}))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
