"""DeepSpeed ZeRO-3 on one CPU rank at a given stage3_max_reuse_distance: prints (last line, JSON) what is still
gathered (AVAILABLE) when the backward starts, once the parameter trace is complete (third step).

Usage: python -m tests.integration.deepspeed_reuse_probe <max_reuse_distance> linear 0 <port>
       python -m tests.integration.deepspeed_reuse_probe <max_reuse_distance> '<hf_config JSON>' <recompute> <port>
The first: eight 64 x 64 linear layers, the indices of those gathered. The second: a transformers decoder built from
the config (gradient checkpointing when <recompute> is 1), the elements gathered at the lm_head's backward."""

import json
import sys

from tests.integration.deepspeed_one_rank import one_rank_engine

LAYERS, WIDTH = 8, 64


def main(reuse: int, port: str, model_arg: str, recompute: bool) -> None:
    import torch
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    torch.manual_seed(0)
    if model_arg == "linear":
        model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)])
        last, batch = model[-1], lambda: (torch.randn(1, WIDTH),)
        loss_of = lambda out: out.pow(2).mean()  # noqa: E731
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        fields = json.loads(model_arg)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**fields))
        if recompute:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        last, tokens = model.lm_head, torch.randint(0, fields["vocab_size"], (1, 16))
        batch = lambda: (tokens,)  # noqa: E731
        loss_of = lambda out: out.logits.float().pow(2).mean()  # noqa: E731
    # no prefetch and no persistent small parameters: what stays gathered is what the reuse rule keeps
    zero = {"stage": 3, "stage3_max_reuse_distance": reuse, "stage3_prefetch_bucket_size": 0,
            "stage3_param_persistence_threshold": 0}
    engine = one_rank_engine(model, zero, "fp32", port)
    seen = {}

    def at_backward_start(module, grad_output):
        available = [p for p in model.parameters() if p.ds_status == ZeroParamStatus.AVAILABLE]
        seen["numel"] = sum(p.ds_numel for p in available)
        if model_arg == "linear":
            seen["layers"] = [i for i, layer in enumerate(model) if layer.weight.ds_status == ZeroParamStatus.AVAILABLE]

    last.register_full_backward_pre_hook(at_backward_start)
    for _ in range(3):  # the first step records the trace; the reuse rule applies once it is complete
        engine.backward(loss_of(engine(*batch())))
        engine.step()
    print(json.dumps({"gathered_layers": seen.get("layers"), "gathered_numel": seen["numel"]}))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[4], sys.argv[2], sys.argv[3] == "1")
