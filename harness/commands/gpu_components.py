"""The time model's parts measured one at a time on this machine's accelerator, each beside its prediction
(harness.plan.compute_time, the chip's datasheet profile): bf16 weight GEMMs at decoder-layer shapes (forward,
input gradient, weight gradient; tensor parallel 1 and 8 for wave quantization), a fused causal attention call
(torch SDPA, its default backend and FlashAttention forced) forward and backward by sequence length and head dim
(FlashAttention-2's benchmark shapes: 16k tokens a batch, hidden 2048), and one transformers decoder layer
forward and backward (GEMMs, attention and the elementwise chain together). A stage of `make gpu-check`;
`--cpu` runs tiny shapes on CPU (the suite's check of the plumbing), predicted by this host's calibrated
profile where one is cached."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from harness.rundir import write_json

SCHEMA = "gpu-components/1"


class Shapes(NamedTuple):
    """What one mode measures: models (hf_config shapes), token counts and TP degrees for the GEMMs;
    (head dim, sequence lengths, tokens a batch, hidden size) for attention; (model, sequence) decoder layers."""

    gemm_models: Tuple[str, ...]
    gemm_tokens: Tuple[int, ...]
    gemm_tp: Tuple[int, ...]
    head_dims: Tuple[int, ...]
    attention_seq: Tuple[int, ...]
    attention_tokens: int
    attention_hidden: int
    layers: Tuple[Tuple[str, int], ...]
    warmup: int
    iters: int


GPU_SHAPES = Shapes(("llama3_1_8b", "llama3_1_70b"), (4096, 8192), (1, 8), (128, 64),
                    (512, 1024, 2048, 4096, 8192, 16384), 16384, 2048,
                    (("llama3_1_8b", 2048), ("llama3_1_8b", 4096), ("llama3_1_8b", 8192), ("llama3_1_70b", 4096)),
                    warmup=3, iters=10)
CPU_SHAPES = Shapes(("tiny_llama",), (128,), (1, 2), (32,), (64, 128), 256, 128, (("tiny_llama", 128),),
                    warmup=1, iters=3)


class Row(NamedTuple):
    component: str  # gemm, attention, layer
    shape: str
    direction: str  # forward, backward (input / weight gradient for GEMMs)
    measured_s: float
    predicted_s: Optional[float]
    tflops: float  # measured, counting what the time model counts
    dims: Dict[str, Any]  # what predict() reads: a GEMM's m, k, n; attention's head dim, sequence, batch ...

    @property
    def error(self) -> Optional[float]:
        """measured time / predicted time - 1: the published tables' predicted / measured tokens/s - 1, so +
        means the model is optimistic."""
        return None if self.predicted_s is None else self.measured_s / self.predicted_s - 1


# --- timing -----------------------------------------------------------------------------------------------


def timer(device: str) -> Callable[[Callable[[], Any], int, int], float]:
    """Median seconds of one call: CUDA events around each call on a GPU, the wall clock on CPU."""
    import torch

    def cuda(fn: Callable[[], Any], warmup: int, iters: int) -> float:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    def cpu(fn: Callable[[], Any], warmup: int, iters: int) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
        return statistics.median(times)

    return cuda if device == "cuda" else cpu


def forward_and_backward_s(clock, forward: Callable[[], Any], both: Callable[[], Any], shapes: Shapes):
    """(forward, backward) seconds: the backward alone cannot be launched, so it is forward + backward less
    the forward."""
    fwd = clock(forward, shapes.warmup, shapes.iters)
    return fwd, max(clock(both, shapes.warmup, shapes.iters) - fwd, 1e-9)


# --- the predictions (one function per part; the suite holds them to recorded GPU timings) ----------------


GEMM_ORIENTATION = {"forward": lambda m, k, n: (m, k, n), "input_grad": lambda m, k, n: (m, n, k),
                    "weight_grad": lambda m, k, n: (k, m, n)}


def predict(component: str, direction: str, dims: Dict[str, Any], hw, peak: float) -> float:
    """compute_time's seconds for one timed part: a weight GEMM (m x k) @ (k x n) in the direction's
    orientation; a causal attention call of `batch` sequences of `seq` at head dim `head_dim`, `hidden` wide;
    one decoder layer of `model` on one sequence of `seq` tokens."""
    from harness.plan.compute_time import attention_time, gemm_time, layer_time

    backward = direction == "backward"
    if component == "gemm":
        return gemm_time(*GEMM_ORIENTATION[direction](dims["m"], dims["k"], dims["n"]), 2, hw, peak)
    if component == "attention":
        spec = attention_spec(dims["head_dim"], dims["hidden"])
        return attention_time(spec, dims["batch"] * dims["seq"], dims["seq"], 1, 2, hw, peak, backward)
    spec = spec_of(dims["model"], model_hf_config(dims["model"]))
    return layer_time(spec, dims["seq"], dims["seq"], 1, 2, hw, peak, backward).total


# --- the parts --------------------------------------------------------------------------------------------


def model_hf_config(name: str) -> Dict[str, Any]:
    from harness.config.compose import compose_run_config

    return dict(compose_run_config([f"model={name}"]).model.hf_config)


def spec_of(name: str, hf_config: Dict[str, Any]):
    from harness.plan.model_spec import model_spec_from_hf

    return model_spec_from_hf(name, hf_config)


def gemm_rows(shapes: Shapes, device: str, hw, peak: Optional[float], clock) -> List[Row]:
    """Every distinct weight GEMM of a layer (compute_time.layer_gemms) at each token count and TP degree:
    the forward x @ W^T, the input gradient g @ W and the weight gradient g^T @ x, as autograd runs them."""
    import torch

    from harness.plan.compute_time import layer_gemms

    rows, seen = [], set()
    for name in shapes.gemm_models:
        spec = spec_of(name, model_hf_config(name))
        for tokens in shapes.gemm_tokens:
            for tp in shapes.gemm_tp:
                for m, k, n, _ in layer_gemms(spec, tokens, tp):
                    m, k, n = int(m), int(k), int(n)
                    if (m, k, n) in seen:
                        continue
                    seen.add((m, k, n))
                    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                    w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
                    g = torch.randn(m, n, device=device, dtype=torch.bfloat16)
                    label, dims = f"{name} tp{tp} {m}x{k}x{n}", {"m": m, "k": k, "n": n}
                    for direction, fn in (("forward", lambda: x @ w.t()), ("input_grad", lambda: g @ w),
                                          ("weight_grad", lambda: g.t() @ x)):
                        seconds = clock(fn, shapes.warmup, shapes.iters)
                        predicted = predict("gemm", direction, dims, hw, peak) if hw and peak else None
                        rows.append(Row("gemm", label, direction, seconds, predicted, 2 * m * k * n / seconds / 1e12,
                                        dims))
                    del x, w, g
    return rows


def attention_spec(head_dim: int, hidden: int):
    """A one-layer Llama whose attention has hidden / head_dim heads of head_dim (FlashAttention-2's benchmark
    shape: hidden 2048, no grouped keys)."""
    heads = hidden // head_dim
    return spec_of(f"attention_d{head_dim}", {"model_type": "llama", "hidden_size": hidden, "head_dim": head_dim,
                                              "num_attention_heads": heads, "num_key_value_heads": heads,
                                              "intermediate_size": 4 * hidden, "num_hidden_layers": 1,
                                              "vocab_size": 1024})


def sdpa_backends(device: str) -> Tuple[Tuple[str, Any], ...]:
    """(label, backend or None for torch's own choice): on a GPU FlashAttention is also forced."""
    if device != "cuda":
        return (("sdpa", None),)
    from torch.nn.attention import SDPBackend

    return (("sdpa", None), ("flash", SDPBackend.FLASH_ATTENTION))


def attention_rows(shapes: Shapes, device: str, hw, peak: Optional[float], clock) -> List[Row]:
    """Causal SDPA forward, and forward + backward less the forward, at tokens / T sequences of T: TFLOP/s
    counting the causal half (4 T^2 d heads / 2 per sequence forward, 2.5x that backward), as the
    FlashAttention-2 charts the profile cites."""
    import contextlib

    import torch
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    rows = []
    for d in shapes.head_dims:
        heads = shapes.attention_hidden // d
        for seq in shapes.attention_seq:
            batch = max(1, shapes.attention_tokens // seq)
            q, k, v = (torch.randn(batch, heads, seq, d, device=device, dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            grad = torch.randn(batch, heads, seq, d, device=device, dtype=torch.bfloat16)
            flops = 4.0 * seq * seq * d * heads * batch / 2
            for label, backend in sdpa_backends(device):
                context = (lambda: sdpa_kernel(backend)) if backend is not None else contextlib.nullcontext

                def forward():
                    with context():
                        return sdpa(q, k, v, is_causal=True)

                def both():
                    with context():
                        sdpa(q, k, v, is_causal=True).backward(grad)

                fwd, bwd = forward_and_backward_s(clock, forward, both, shapes)
                shape = f"{label} d{d} T{seq} b{batch}"
                dims = {"backend": label, "head_dim": d, "seq": seq, "batch": batch, "hidden": shapes.attention_hidden}
                for direction, seconds, work in (("forward", fwd, flops), ("backward", bwd, 2.5 * flops)):
                    predicted = predict("attention", direction, dims, hw, peak) if hw and peak else None
                    rows.append(Row("attention", shape, direction, seconds, predicted, work / seconds / 1e12, dims))
            del q, k, v, grad
    return rows


def decoder_layer(hf_config: Dict[str, Any], device: str):
    """transformers' own Llama decoder layer in bf16 with SDPA attention, and its rotary embedding."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(**{k: v for k, v in hf_config.items() if k != "model_type"})
    config._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(config, layer_idx=0).to(device=device, dtype=torch.bfloat16)
    return layer, LlamaRotaryEmbedding(config).to(device)


def layer_rows(shapes: Shapes, device: str, hw, peak: Optional[float], clock) -> List[Row]:
    """One decoder layer on one micro-batch of one sequence: forward, and forward + backward less the forward,
    against compute_time.layer_time (GEMMs + attention + elementwise)."""
    import torch

    rows = []
    for name, seq in shapes.layers:
        hf_config = model_hf_config(name)
        spec = spec_of(name, hf_config)
        layer, rotary = decoder_layer(hf_config, device)
        x = torch.randn(1, seq, spec.hidden_size, device=device, dtype=torch.bfloat16, requires_grad=True)
        positions = torch.arange(seq, device=device).unsqueeze(0)
        with torch.no_grad():
            embeddings = rotary(x, positions)
        grad = torch.randn_like(x)

        def forward():
            return layer(x, position_embeddings=embeddings, position_ids=positions)

        def both():
            layer(x, position_embeddings=embeddings, position_ids=positions).backward(grad)

        fwd, bwd = forward_and_backward_s(clock, forward, both, shapes)
        flops = 2.0 * seq * spec.layer_params
        dims = {"model": name, "seq": seq}
        for direction, seconds, work in (("forward", fwd, flops), ("backward", bwd, 2 * flops)):
            predicted = predict("layer", direction, dims, hw, peak) if hw and peak else None
            rows.append(Row("layer", f"{name} T{seq}", direction, seconds, predicted, work / seconds / 1e12, dims))
        del layer, x, grad
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


# --- the whole check --------------------------------------------------------------------------------------


def profile_here(device: str) -> Tuple[Any, Optional[float], str]:
    """(profile, achievable bf16 FLOP/s, accelerator key): the datasheet row of this GPU, or on CPU the
    host's calibrated profile where `harness calibrate` cached one (None otherwise)."""
    from harness.plan.hardware import HARDWARE, achievable_peak, cpu_profile_name, load_profile, profile_path

    if device == "cuda":
        import torch

        from harness.doctor import accelerator_key

        key = accelerator_key(torch.cuda.get_device_name(0)) or ""
        hw = HARDWARE.get(key)
        return hw, achievable_peak(hw, key, "bf16") if hw else None, key
    hw = load_profile(profile_path(cpu_profile_name()))
    return hw, achievable_peak(hw, "cpu", "bf16") if hw else None, "cpu"


def summary_by_component(rows: Sequence[Row]) -> Dict[str, Dict[str, Any]]:
    """Per component and direction: how many rows, median and max |error|, median signed error."""
    out: Dict[str, Dict[str, Any]] = {}
    for key in sorted({(r.component, r.direction) for r in rows}):
        errors = [r.error for r in rows if (r.component, r.direction) == key and r.error is not None]
        out[f"{key[0]}/{key[1]}"] = {
            "rows": len(errors),
            "median_abs_error": statistics.median(abs(e) for e in errors) if errors else None,
            "max_abs_error": max(abs(e) for e in errors) if errors else None,
            "median_error": statistics.median(errors) if errors else None}
    return out


def table_lines(rows: Iterable[Row]) -> List[str]:
    lines = [f"{'component':<10}{'shape':<36}{'direction':<12}{'measured ms':>12}{'predicted ms':>13}"
             f"{'error':>8}{'TFLOP/s':>9}"]
    for r in rows:
        predicted = f"{1e3 * r.predicted_s:.3f}" if r.predicted_s is not None else "-"
        error = f"{100 * r.error:+.1f}%" if r.error is not None else "-"
        lines.append(f"{r.component:<10}{r.shape:<36}{r.direction:<12}{1e3 * r.measured_s:>12.3f}{predicted:>13}"
                     f"{error:>8}{r.tflops:>9.1f}")
    return lines


def measure(device: str, shapes: Shapes, say: Callable[[str], None] = print) -> Dict[str, Any]:
    """Every part measured, one progress line each; the summary (rows, per-component errors)."""
    import torch

    hw, peak, key = profile_here(device)
    clock = timer(device)
    rows: List[Row] = []
    for part, measure_part in (("gemm", gemm_rows), ("attention", attention_rows), ("layer", layer_rows)):
        began = time.monotonic()
        found = measure_part(shapes, device, hw, peak, clock)
        rows += found
        say(f"[gpu-components] {part}: {len(found)} timings in {time.monotonic() - began:.0f} s")
    return {"schema": SCHEMA, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "accelerator": key, "profile": getattr(hw, "name", None), "achievable_peak_flops": peak,
            "torch": torch.__version__, "rows": [{**r._asdict(), "error": r.error} for r in rows],
            "summary": summary_by_component(rows), "table": table_lines(rows)}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.commands.gpu_components", description=__doc__)
    parser.add_argument("--cpu", action="store_true", help="tiny shapes on CPU")
    parser.add_argument("--out", default="results/gpu_check/components.json", help="the JSON file written")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] = ()) -> int:
    args = parse_args(argv)
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu-components: skipped: no CUDA device visible (--cpu measures tiny shapes on CPU)")
        return 0
    result = measure("cpu" if args.cpu else "cuda", CPU_SHAPES if args.cpu else GPU_SHAPES)
    write_json(Path(args.out), result)
    print("\n".join([*result["table"], "", *(f"{k}: {v}" for k, v in result["summary"].items()),
                     f"gpu-components: {args.out}"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
