"""layout.precision=fp8 on the CPU stand-in of a GPU recipe, torchao's float8 training on torch's CPU scaled
matmul: nd (tensor parallel x FSDP2) and fsdp (FSDP2 under `accelerate launch`) convert the planned linears,
train within the FP8 tolerance of the bf16 single-process reference, and hold the plan's state bytes.

What runs and what does not (measured here, torch 2.13 CPU, torchao 0.18, the tensorwise recipe):
- torchao's Float8Linear runs as on a GPU: dynamic per-tensor scales, e4m3 casts of the input and weight,
  e5m2 casts of the output gradient, and one torch._scaled_mm per GEMM (3 a linear a step).
- torch._scaled_mm's CPU kernel multiplies the FP8 values at fp32 precision: its result equals the fp32 product
  of the same FP8 values bit for bit. ONEDNN_VERBOSE=1 shows the forward GEMM (e4m3 x e4m3) executed by
  oneDNN's reference matmul (`matmul,ref:any`, f8_e4m3 operands), the backward GEMMs (an e5m2 operand) by
  no oneDNN primitive. So FP8 quantisation is executed; FP8 GEMM arithmetic on FP8 hardware is not (the
  stand-in's not_executed list says so), and an FP8 step is slower here than a bf16 one.

The loss tolerance is harness.runtime.reference.fp8_loss_rtol (e4m3's unit roundoff 2^-4 carried to the loss;
its comment derives it): 1.1e-3 for the nd run (hidden 128, 128 tokens a step), 3.8e-4 for the fsdp run
(hidden 64, 512 tokens); measured at most 3.9e-4 and 1.1e-4. bf16 itself stays within 9e-5 of fp32 on them.
"""

import subprocess
import sys

import pytest
import torch

from harness import REPO_ROOT
from harness.commands.gpu_check import planned_state_bytes
from harness.config.compose import compose_run_config
from harness.engines.float8 import convert_to_float8, float8_linear_count
from harness.modeling.model import build_model
from harness.plan.parallel_dims import ParallelDims
from harness.plan.regime import torchao_float8_config
from harness.runtime.reference import fp8_gemm_error, loss_rtol, reference_precision
from tests.integration.reference import single_process_losses
from tests.integration.runs import prepare_and_launch

pytestmark = pytest.mark.integration

# Two warm-up steps (the second measures state bytes) and one timed step, each ~10 s of emulated FP8 here.
PINNED = ["tracking=disabled", "bench.warmup_steps=2", "bench.warmup_max_steps=2", "bench.steps=1"]
TIMEOUT_S = 900
FP8_GAP = "FP8 tensor-core GEMMs"


def tiny_llama(layers: int = 2):
    """The default tiny Llama with FP8's GEMM multiple: head_dim 16, widths divisible by 16."""
    hf_config = dict(compose_run_config([]).model.hf_config)
    hf_config.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=1,
                     head_dim=16, num_hidden_layers=layers)
    return build_model(hf_config, 0)


def decoder_linears(model) -> int:
    """The linears FP8 converts: every nn.Linear of the decoder layers (the LM head stays bf16)."""
    return sum(isinstance(m, torch.nn.Linear) for m in model.model.layers.modules())


def test_converter_swaps_the_decoder_linears_and_keeps_the_head():
    model = tiny_llama()
    planned = decoder_linears(model)
    convert_to_float8(model, torchao_float8_config())
    assert planned == 2 * 7 and float8_linear_count(model) == planned  # q k v o gate up down, per layer
    assert type(model.lm_head) is torch.nn.Linear


def test_cpu_scaled_mm_is_called_per_gemm_and_multiplies_fp8_values_exactly(monkeypatch):
    """3 torch._scaled_mm calls per converted linear a step; the CPU kernel's product of the FP8 operands is the
    fp32 product of their values, bit for bit."""
    model = tiny_llama(layers=1).to(torch.bfloat16)
    convert_to_float8(model, torchao_float8_config())
    calls, real = [], torch._scaled_mm

    def spy(a, b, scale_a, scale_b, **kwargs):
        one = torch.ones((), dtype=torch.float32)
        unscaled = real(a, b, one, one, out_dtype=torch.float32)  # the same operands, no scaling or rounding
        calls.append((a.dtype, b.dtype, torch.equal(unscaled, a.float() @ b.float())))
        return real(a, b, scale_a, scale_b, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", spy)
    tokens = torch.randint(0, model.config.vocab_size, (2, 16))
    model(input_ids=tokens, labels=tokens).loss.backward()
    assert len(calls) == 3 * float8_linear_count(model)
    assert all(exact for _, _, exact in calls)
    assert {(a, b) for a, b, _ in calls} >= {(torch.float8_e4m3fn, torch.float8_e4m3fn),
                                            (torch.float8_e5m2, torch.float8_e4m3fn)}


def test_one_fp8_gemm_is_off_by_the_roundoff_the_tolerance_assumes():
    """The premise of fp8_loss_rtol: an e4m3 GEMM's output is off by u / sqrt(4 ln 2) RMS (u = 2^-4)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 256, bias=False)
    x = torch.randn(512, 256)
    want = linear(x)
    converted = torch.nn.Sequential(linear)
    convert_to_float8(converted, {**torchao_float8_config(), "skip_modules": []})
    assert float8_linear_count(converted) == 1
    fp8 = converted(x)
    rms = ((fp8 - want).pow(2).mean() / want.pow(2).mean()).sqrt().item()
    assert rms == pytest.approx(fp8_gemm_error(), rel=0.15)


def run_standin(recipe_overrides, run_dir):
    """The stand-in of a GPU recipe made FP8, launched on this machine; returns (cfg, metrics, plan)."""
    cfg = compose_run_config([*recipe_overrides, "layout.precision=fp8", "standin=cpu", "launcher=local", *PINNED])
    result, plan, _ = prepare_and_launch(cfg, run_dir, TIMEOUT_S)
    return cfg, result, plan


def check_fp8_standin(cfg, result):
    measured, layout = result["measured"], cfg.layout
    assert layout.precision == "fp8" and any(FP8_GAP in item for item in result["standin"]["not_executed"])
    by_rank = {record["rank"]: record for record in measured["per_rank"]}
    assert sorted(by_rank) == list(range(ParallelDims.of(layout).world_size))
    # (a) every rank converted every decoder linear it holds (no pipeline here: all of them).
    planned_linears = decoder_linears(build_model(cfg.model.hf_config, 0))
    assert [by_rank[r]["float8_linears"] for r in sorted(by_rank)] == [planned_linears] * len(by_rank)
    # (b) the losses of the bf16 single-process reference, within FP8's tolerance.
    rows = layout.micro_batch * ParallelDims.of(layout).dp
    want, _ = single_process_losses(cfg, cfg.model.hf_config, rows, layout.grad_accum, len(measured["losses"]),
                                    bf16=reference_precision(layout.precision) == "bf16")
    assert measured["losses"] == pytest.approx(want, rel=loss_rtol(cfg))
    # (c) the plan's state bytes, on every rank.
    for rank, record in by_rank.items():
        planned = planned_state_bytes(cfg, result["predicted"], rank)
        assert {key: record.get(key, 0) for key in planned} == planned, f"rank {rank}"
    return by_rank


def test_nd_tp2_fsdp2_fp8_on_cpu_standin_trains_like_bf16(results_root):
    """gpu_llama8b_nd_tp4_cp2's stand-in in FP8: tp2 x dp_shard2 (its cp ranks shard with FSDP2)."""
    cfg, result, _ = run_standin(["recipes=gpu_llama8b_nd_tp4_cp2"], results_root / "nd_fp8")
    assert (cfg.layout.tp, cfg.layout.dp_shard) == (2, 2)
    check_fp8_standin(cfg, result)


def test_fsdp2_fp8_on_cpu_standin_trains_like_bf16(results_root):
    """gpu_llama8b_fsdp_8gpu's stand-in in FP8: FULL_SHARD over 2 ranks, Accelerate's fp8 mixed precision."""
    cfg, result, _ = run_standin(["recipes=gpu_llama8b_fsdp_8gpu"], results_root / "fsdp_fp8")
    assert (cfg.engine.name, cfg.layout.dp_shard) == ("fsdp", 2)
    by_rank = check_fp8_standin(cfg, result)
    measured = result["measured"]
    for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        assert measured[key] == result["predicted"][key] == by_rank[0][key], key


def test_accelerates_own_torchao_recipe_accepts_fp8_on_cpu():
    """What `fp8_config: {backend: AO}` asks of Accelerate: its Accelerator takes mixed_precision=fp8 on a CPU
    and prepare() converts linears to torchao's Float8Linear (its default filter keeps the first and last
    linear in high precision). The harness's fsdp ranks convert with the same torchao call before sharding."""
    code = """
import harness, torch
from accelerate import Accelerator
from accelerate.utils import AORecipeKwargs
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
model = accelerator.prepare(model)
print(accelerator.device.type, accelerator.state.mixed_precision, [type(m).__name__ for m in model])
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "cpu fp8 ['Linear', 'Float8Linear', 'Float8Linear', 'Linear']"
