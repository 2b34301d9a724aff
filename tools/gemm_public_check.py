"""The time model's GEMM rate (compute_time.gemm_time) beside public per-shape GEMM measurements it was not fitted
to (printed, never calibrated on, never a test): what the model gives each product on the datasheet profile.

1. A100: tests/data/gemm_a100_eleuther_fp16.csv (its header cites it): 2,844 products of a GPT layer at hidden
   128-32640 and tensor parallelism 1-8, 8192 tokens, FP16 (the same tensor-core rate as BF16 on A100), each timed
   by its slowest of 200 calls. The A100 profile has no shape fall (gemm_half_rate_dim 0): the fit below is the
   fall these points imply once a common scale (the slowest-call timing, the unnamed A100's clocks) is set free:
   an upper bound, as the slowest-call timing slows short kernels (thin ones) most. llm-foundry's A100 rows
   (tests/data, unfitted) agree with the profile without a fall within their own repeat's noise (test
   test_the_model_is_as_near_one_of_a_layouts_two_measurements_as_they_are_to_each_other); D = 160 breaks that.
2. H100: openxla's default matmul performance table (tensorflow/tensorflow
   third_party/xla/xla/service/gpu/model/matmul_interpolator_data.h @ 372d578b, kDefaultMatmulPTable, key
   "sm_90", entries with b: 1, "bf16xbf16->bf16" FLOP/s): 19 products (m, n, k) from 256 to 4096. The H100 profile's
   fall (D = 320) was fitted on one H200's products at Llama layer shapes (hardware.py, "GEMM shape").

Usage: .venv/bin/python tools/gemm_public_check.py (part of `make bench`)
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Optional

from harness.plan.compute_time import gemm_time
from harness.plan.hardware import HARDWARE, achievable_peak

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "gemm_a100_eleuther_fp16.csv"
# (m, n, k, TFLOP/s): the sm_90 table's b = 1 entries, output m x n, reduction k
XLA_SM90 = [(4096, 4096, 256, 392.16), (4096, 4096, 4096, 783.33), (2048, 2048, 2048, 631.98), (4096, 512, 512, 238.82),
            (4096, 1024, 512, 343.71), (4096, 2048, 512, 447.02), (1024, 2048, 2048, 524.29),
            (2048, 1024, 2048, 523.27), (4096, 512, 1024, 370.77), (1024, 1024, 2048, 349.98),
            (2048, 512, 2048, 347.71), (4096, 256, 2048, 304.69), (512, 4096, 1024, 373.35),
            (256, 4096, 2048, 324.59), (2048, 4096, 2048, 715.35), (1024, 2048, 4096, 653.53),
            (4096, 256, 512, 137.24), (512, 512, 512, 40.72), (512, 1024, 512, 80.47)]
BUCKETS = ((0, 512), (512, 1024), (1024, 2048), (2048, 4096), (4096, 1 << 30))


def model_tflops(m: int, k: int, n: int, accelerator: str, half_rate_dim: Optional[float] = None) -> float:
    """The rate gemm_time gives one (m x k) @ (k x n) BF16 product on the accelerator's datasheet profile."""
    hw = HARDWARE[accelerator]
    if half_rate_dim is not None:
        hw = replace(hw, gemm_half_rate_dim=half_rate_dim)
    return 2.0 * m * k * n / gemm_time(m, k, n, 2, hw, achievable_peak(hw, accelerator, "bf16")) / 1e12


def a100_points():
    with DATA.open() as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return [(int(r["m"]), int(r["k"]), int(r["n"]), float(r["tflops"])) for r in rows]


def bucket_label(low: int, high: int) -> str:
    return f"d >= {low}" if high > 1 << 20 else f"{low} <= d < {high}"


def a100_report() -> None:
    points = a100_points()
    print(f"A100 (EleutherAI's sweep, {len(points)} FP16 products) beside the a100_sxm profile; d = the smallest "
          "dimension; error = model / measured - 1")
    for low, high in BUCKETS:
        errors = [model_tflops(m, k, n, "a100_sxm") / t - 1 for m, k, n, t in points if low <= min(m, k, n) < high]
        if errors:
            print(f"  {bucket_label(low, high):18} {len(errors):5} products  median {statistics.median(errors):+6.1%}")
    fits = []
    for dim in range(0, 801, 20):
        logs = [math.log(t / model_tflops(m, k, n, "a100_sxm", dim)) for m, k, n, t in points if min(m, k, n) >= 512]
        mean = statistics.fmean(logs)
        fits.append((statistics.fmean([(x - mean) ** 2 for x in logs]), dim, math.exp(mean)))
    square, dim, scale = min(fits)
    flat = next(f for f in fits if f[1] == 0)
    print(f"  a fall d / (d + D) with a free common scale (d >= 512): D = {dim} (mean square of log {square:.4f}, "
          f"{flat[0]:.4f} without a fall), the measured rates x {scale:.3f} of the model's at that D")


def h100_report() -> None:
    print("H100 (openxla's sm_90 matmul table, BF16) beside the h100_sxm profile (D = 320) and without its fall")
    for label, dim in (("D = 320", None), ("D = 0", 0.0)):
        errors = [model_tflops(m, k, n, "h100_sxm", dim) / t - 1 for m, n, k, t in XLA_SM90]
        large = [e for e, (m, n, k, _) in zip(errors, XLA_SM90) if min(m, n, k) >= 2048]
        print(f"  {label:8} median {statistics.median(errors):+6.1%} over {len(errors)} products, "
              f"{statistics.median(large):+6.1%} over the {len(large)} with d >= 2048")


if __name__ == "__main__":
    a100_report()
    h100_report()
