"""A DeepSpeed engine on one CPU rank (gloo, no JIT-compiled ops) for the probes of
tests/integration/test_deepspeed_device_buffers.py, each run in a process of its own."""

import os


def one_rank_engine(model, zero: dict, precision: str, port: str):
    """deepspeed.initialize over `model` with this zero_optimization section, micro-batch 1, torch's AdamW."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # gloo, no JIT compile
    deepspeed.init_distributed(dist_backend="gloo")
    config = {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "bf16": {"enabled": precision == "bf16"}, "zero_optimization": zero,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    return engine
