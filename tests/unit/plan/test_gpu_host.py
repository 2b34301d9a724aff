"""The host side of a GPU step: the dispatch of transformers' eager ops (host_work.dispatch_s), torch's AdamW and
the harness's clip, against one H200 machine's timings (tests/data: gpu_host_h200.json from
tools/gpu_host_overhead.py, gpu_step_phases_h200.json from tools/gpu_step_phases.py), and the whole steps of
`make gpu-check` on it (gpu_check_h200_summary.json, and gpu_check_h200_summary_2.json from a second lease of the
same kind) predicted again now. The op counts behind the constants
are counted again here, on CPU, in the transformers installed. Error = predicted / measured - 1."""

import json
import statistics
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness import REPO_ROOT
from harness.plan.hardware import HARDWARE, US
from harness.plan.host_work import (EAGER_LAYER_DISPATCHES, EAGER_OUTSIDE_DISPATCHES, GPU_HOST_OPS_PER_TENSOR,
                                    dispatch_s)
from harness.plan.time_model import (FUSED_ADAM_BYTES_PER_PARAM, TORCH_ADAMW_BYTES_PER_PARAM, adam_bytes_per_param,
                                     optimizer_time)

DATA = REPO_ROOT / "tests" / "data"
HOST = json.loads((DATA / "gpu_host_h200.json").read_text())
PHASES = json.loads((DATA / "gpu_step_phases_h200.json").read_text())
CHECK = json.loads((DATA / "gpu_check_h200_summary.json").read_text())
CHECK_2 = json.loads((DATA / "gpu_check_h200_summary_2.json").read_text())
FLOOR = json.loads((DATA / "gpu_engine_floor_h200.json").read_text())
H200 = HARDWARE["h200"]
LAYERS, TENSORS, PARAMS = 16, 146, 1.2358e9  # the 1B Llama: 16 x 9 tensors + embedding + final norm, tied head


class Dispatches(TorchDispatchMode):
    """Every aten op that reaches the dispatcher, compute and view ops alike."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def dispatches(layers: int, checkpointed: bool) -> int:
    """Ops of one forward + backward of a small Llama of `layers` layers (the 1B model's layer code) under bf16
    autocast, as nd's stage runs it: StageModule, causal_lm_loss, torch's non-reentrant checkpoint per layer."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.engines.lm_loss import causal_lm_loss, shifted_labels
    from harness.engines.stage_module import StageModule

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    stage = StageModule(LlamaForCausalLM(config), list(range(layers)), embedding=True, head=True)
    if checkpointed:
        for key, layer in list(stage.layers.items()):
            stage.layers[key] = checkpoint_wrapper(layer, preserve_rng_state=False)
    tokens = torch.randint(0, 256, (1, 16))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            causal_lm_loss(stage(tokens), shifted_labels(tokens)).backward()

    step()
    mode = Dispatches()
    with mode:
        step()
    return mode.count


@pytest.fixture(scope="module")
def counted():
    """{checkpointed: (per layer, outside)} from a 2- and a 4-layer model."""
    out = {}
    for checkpointed in (False, True):
        two, four = dispatches(2, checkpointed), dispatches(4, checkpointed)
        out[checkpointed] = ((four - two) / 2, two - (four - two))
    return out


def test_a_layer_without_checkpointing_costs_the_ops_it_dispatches_counted_here_within_8_percent(counted):
    per_layer, outside = counted[False]
    print(f"\n  counted: {per_layer:.0f} ops a layer, {outside:.0f} outside; constants "
          f"{EAGER_LAYER_DISPATCHES['none']} / {EAGER_OUTSIDE_DISPATCHES}")
    assert per_layer == pytest.approx(EAGER_LAYER_DISPATCHES["none"], rel=0.08)
    assert outside == pytest.approx(EAGER_OUTSIDE_DISPATCHES, rel=0.15)


def test_a_checkpointed_layer_dispatches_more_ops_and_its_cost_is_above_them(counted):
    """The checkpoint reruns the forward (more ops); its measured cost (547) is above its own op count: its
    saved-tensor hooks are Python work beside the dispatcher."""
    per_layer, _ = counted[True]
    assert counted[False][0] * 1.3 < per_layer < EAGER_LAYER_DISPATCHES["checkpointed"]


def test_the_h200_profile_takes_the_op_chain_measured_on_its_host():
    assert H200.host_op_latency_s == pytest.approx(HOST["op_chain_autograd_s"], rel=0.01)
    assert HARDWARE["h100_sxm"].host_op_latency_s == H200.host_op_latency_s


def test_an_eager_micro_batch_on_the_h200_host_is_its_dispatched_ops_at_the_op_chain_rate_within_10_percent():
    """transformers' 1B model without checkpointing, 32 to 1,024 tokens (host-bound: the step time does not
    fall with the tokens): the measured floor against 16 x 256 + 71 op-equivalents at the chain's rate, and
    against the ops counted on the GPU itself."""
    floor = statistics.median(r["wall_s"] for r in HOST["steps"] if r["variant"] == "eager" and r["seq"] <= 1024)
    ops_on_gpu = HOST["ops_eager_seq32"]["compute"] + HOST["ops_eager_seq32"]["view"]
    modelled = (LAYERS * EAGER_LAYER_DISPATCHES["none"] + EAGER_OUTSIDE_DISPATCHES) * H200.host_op_latency_s
    print(f"\n  floor {1e3 * floor:.1f} ms, modelled {1e3 * modelled:.1f} ms, {ops_on_gpu} ops counted on the GPU")
    assert modelled == pytest.approx(floor, rel=0.10)
    assert ops_on_gpu == pytest.approx(LAYERS * EAGER_LAYER_DISPATCHES["none"] + EAGER_OUTSIDE_DISPATCHES, rel=0.05)


def test_the_checkpointed_constant_is_nds_measured_micro_batch_over_the_op_chain():
    """547 op-equivalents a layer: nd's step pieces (tools/gpu_step_phases.py) per micro-batch, one of 2,048 tokens
    and two of 1,024 (host-bound: the same time), over the op chain's rate, less the outside, over 16 layers."""
    per_micro = statistics.median(r["micro_batches"] for r in PHASES["rows"])
    implied = (per_micro / H200.host_op_latency_s - EAGER_OUTSIDE_DISPATCHES) / LAYERS
    assert implied == pytest.approx(EAGER_LAYER_DISPATCHES["checkpointed"], rel=0.03)


def test_fsdp2s_hooks_on_a_gpu_host_are_the_measured_difference_per_tensor():
    """fully_shard over one rank: its micro-batch floor less the plain model's, per parameter tensor."""
    def floor(variant):
        return statistics.median(r["wall_s"] for r in HOST["steps"] if r["variant"] == variant and r["seq"] <= 1024)

    per_tensor = (floor("fsdp2") - floor("eager")) / TENSORS / H200.host_op_latency_s
    assert per_tensor == pytest.approx(GPU_HOST_OPS_PER_TENSOR["fsdp2"], rel=0.25)


def _layout(**kw):
    base = dict(activation_checkpointing="full", zero_stage=3, tp=1, pp=1, dp_shard=1, cp=1, dp_replicate=1,
                reshard_after_forward=None)
    return SimpleNamespace(**{**base, **kw})


def _engine(name, compiled=False, fsdp_version=2, compiled_ops=False):
    return SimpleNamespace(name=name, compile=compiled, fsdp_version=fsdp_version, compiled_ops=compiled_ops)


def test_dispatch_counts_only_eager_transformers_code_on_a_gpu_host():
    assert dispatch_s(_engine("megatron_lm"), _layout(), H200, 16, True, TENSORS) == 0.0
    nd = dispatch_s(_engine("nd"), _layout(), H200, 16, True, TENSORS)
    assert nd == pytest.approx((16 * 547 + 71) * 14.7 * US)
    eager = dispatch_s(_engine("nd"), _layout(activation_checkpointing="none"), H200, 16, True, TENSORS)
    assert eager < nd
    compiled = dispatch_s(_engine("nd", compiled=True), _layout(), H200, 16, True, TENSORS)
    assert compiled == pytest.approx(71 * 14.7 * US)  # the head and loss stay eager
    middle = dispatch_s(_engine("nd"), _layout(), H200, 16, False, TENSORS)
    assert middle == pytest.approx(16 * 547 * 14.7 * US)
    no_host = replace(H200, host_op_latency_s=0.0)  # a CPU profile's: its host is the device
    assert dispatch_s(_engine("nd"), _layout(), no_host, 16, True, TENSORS) == 0.0


def test_torch_adamw_moves_72_bytes_a_parameter_a_fused_adam_28():
    assert adam_bytes_per_param(_engine("fsdp")) == adam_bytes_per_param(_engine("nd")) == TORCH_ADAMW_BYTES_PER_PARAM
    assert adam_bytes_per_param(_engine("deepspeed")) == TORCH_ADAMW_BYTES_PER_PARAM  # torch_adam without ops
    assert adam_bytes_per_param(_engine("deepspeed", compiled_ops=True)) == FUSED_ADAM_BYTES_PER_PARAM
    assert adam_bytes_per_param(_engine("megatron_lm")) == FUSED_ADAM_BYTES_PER_PARAM


def test_torch_adamw_over_the_1b_model_on_the_h200_within_25_percent():
    """torch's AdamW (foreach, weight decay 0 as the harness runs it) over 1.24e9 fp32 parameters inside nd's step:
    26.0 ms measured, 20.6 ms predicted (-21%; 28 bytes a parameter predicted 8 ms, -69%)."""
    layout = SimpleNamespace(offload_optimizer="none")
    predicted = optimizer_time(layout, _engine("nd"), H200, PARAMS, TENSORS, 2, 4)["optimizer"]
    measured = statistics.median(r["optimizer"] for r in PHASES["rows"])
    print(f"\n  AdamW: predicted {1e3 * predicted:.1f} ms, measured {1e3 * measured:.1f} ms")
    assert predicted == pytest.approx(measured, rel=0.25)


def gpu_check_predictions(stages=None, measured=None, check=CHECK):
    """(stage, predicted step s, measured step s) for every engine and shape stage of a recorded gpu-check
    (or the `stages` given with their `measured` step times), planned now from the same overrides."""
    from harness.commands import gpu_check
    from harness.config.compose import compose_run_config
    from harness.plan.planner import make_plan

    mode = gpu_check.gpu_mode(check["device"]["accelerator"], 128)
    if stages is None:
        stages = gpu_check.stages(mode)
        measured = {s["name"]: s["measured"]["step_time_s"] for s in check["stages"]
                    if s["kind"] in ("engine", "shape")}
    rows = []
    for stage in stages:
        if stage.name in measured:
            cfg = compose_run_config([*gpu_check.RUN, *mode.common, *stage.overrides])
            rows.append((stage.name, make_plan(cfg).time.step_time_s, measured[stage.name]))
    return rows


# The offloaded step waits for the host: DeepSpeed steps the 1.24e9 fp32 master weights with torch's AdamW on the
# CPU (engine.compiled_ops=false), one op at a time over the flat fp32 partition, each a pass over host memory.
# Two leases of the same kind measured that run at 2.54 s and 3.29 s a step (the second's three timed steps 3.31,
# 3.29 and 2.87 s), and the second's `harness calibrate` stage measured its host 12% slower at Adam and 21% slower
# at a small op: the host, not the model, moved. It is held to 30%, the rest to 16%.
HOST_BOUND_STAGE, HOST_BOUND_REL = "deepspeed_zero3_offload", 0.30


@pytest.mark.parametrize("check", [CHECK, CHECK_2], ids=["first lease", "second lease"])
def test_gpu_checks_whole_steps_on_the_h200_within_16_percent(check):
    """The six runs of one `make gpu-check` (1B Llama, one H200): DeepSpeed ZeRO-3 offloaded, FSDP2 and nd with two
    micro-batches of 1k tokens (host-bound: 4-5x the device time), and nd's shapes up to 8k tokens a micro-batch
    (device-bound). nd_meta and the 2k shape share their host figure with gpu_step_phases (the checkpointed
    constant); FSDP2 (accelerate, its hooks per tensor) and the device-bound shapes are independent of it.
    First lease: +1.0%, -11.4%, +2.8%, +11.3%, -6.8%, -4.8% (before the host was modelled: -1%, -81%, -73%, -56%,
    -24%, -21%; before autocast's traffic over fp32 weights was: the shapes at -15.3% and -12.9%); the second lease:
    -22.0%, -14.4%, -3.5%, +4.3%, -5.9%, -3.7% (the shapes -14.5% and -11.9% before). The device-bound shapes' parts
    are in test_gpu_kernel_breakdown.py."""
    rows = gpu_check_predictions(check=check)
    assert len(rows) == 6
    errors = {}
    for name, predicted, measured in rows:
        errors[name] = predicted / measured - 1
        print(f"\n  {name:<26} predicted {1e3 * predicted:7.1f} ms  measured {1e3 * measured:7.1f} ms  "
              f"{100 * errors[name]:+.1f}%")
    assert abs(errors.pop(HOST_BOUND_STAGE)) <= HOST_BOUND_REL
    assert max(map(abs, errors.values())) <= 0.16


def test_nds_host_bound_step_without_checkpointing_within_25_percent():
    """nd at 64 tokens a micro-batch, two of them, no checkpointing (tools/gpu_engine_floor.py): 200.8 ms measured,
    156.4 ms predicted (-22%). The 256 a layer are transformers' own forward (56-69 ms a micro-batch); nd's stage
    costs about 78 ms a micro-batch once its optimizer and clip (26 + 18 ms) are taken off: not measured alone."""
    import importlib.util

    from harness.commands import gpu_check

    spec = importlib.util.spec_from_file_location("gpu_engine_floor", REPO_ROOT / "tools" / "gpu_engine_floor.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    stages = [gpu_check.Stage(name, "shape", (*extra, *tool.COMMON, f"layout.name={name}"))
              for name, extra in tool.POINTS if name.startswith("nd")]
    measured = {r["name"]: r["measured"]["step_time_s"] for r in FLOOR["rows"]}
    ((name, predicted, actual),) = gpu_check_predictions(stages, measured)
    print(f"\n  {name}: predicted {1e3 * predicted:.1f} ms, measured {1e3 * actual:.1f} ms, "
          f"{100 * (predicted / actual - 1):+.1f}%")
    assert predicted == pytest.approx(actual, rel=0.25)
