"""Dense peak FLOP/s per accelerator and dtype, and device memory, from vendor datasheets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

T = 1e12  # one TFLOP/s

# Dense figures only. Where a datasheet prints only the 2:4-sparsity figure (marked "*" by NVIDIA),
# the dense figure is half of it. "fp32" is the non-tensor-core FP32 rate: torch's default
# `float32_matmul_precision="highest"` does not use TF32; "tf32" is for runs that set "high".
# AMD's "fp32" is the FP32 *matrix* rate, which rocBLAS uses for fp32 GEMMs. "fp8" is the dense FP8 tensor-core
# rate (E4M3 / E5M2 alike); A100 and MI355X rows have none here (A100 has no FP8 tensor cores).
PEAK_FLOPS: Dict[str, Dict[str, float]] = {
    # NVIDIA A100 Tensor Core GPU datasheet (2021): BF16/FP16 312, TF32 156, FP32 19.5 (SXM and PCIe alike).
    "a100_sxm": {"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "fp32": 19.5 * T},
    "a100_sxm_40gb": {"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "fp32": 19.5 * T},
    "a100_pcie": {"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "fp32": 19.5 * T},
    # NVIDIA H100 Tensor Core GPU datasheet (2023), SXM column: BF16/FP16 1,979*, TF32 989*, FP32 67, FP8 3,958*.
    "h100_sxm": {"fp8": 1979 * T, "bf16": 989.5 * T, "fp16": 989.5 * T, "tf32": 494.5 * T, "fp32": 67 * T},
    # Same datasheet, PCIe column: BF16/FP16 1,513*, TF32 756*, FP32 51, FP8 3,026*.
    "h100_pcie": {"fp8": 1513 * T, "bf16": 756.5 * T, "fp16": 756.5 * T, "tf32": 378 * T, "fp32": 51 * T},
    # Same datasheet, H100 NVL column: BF16/FP16 1,671*, TF32 835*, FP32 60, FP8 3,341*.
    "h100_nvl": {"fp8": 1670.5 * T, "bf16": 835.5 * T, "fp16": 835.5 * T, "tf32": 417.5 * T, "fp32": 60 * T},
    # NVIDIA H200 Tensor Core GPU datasheet (2024), SXM column: BF16/FP16 1,979*, TF32 989*, FP32 67, FP8 3,958*.
    "h200": {"fp8": 1979 * T, "bf16": 989.5 * T, "fp16": 989.5 * T, "tf32": 494.5 * T, "fp32": 67 * T},
    # Same datasheet, H200 NVL column: BF16/FP16 1,671*, TF32 835*, FP32 60, FP8 3,341*.
    "h200_nvl": {"fp8": 1670.5 * T, "bf16": 835.5 * T, "fp16": 835.5 * T, "tf32": 417.5 * T, "fp32": 60 * T},
    # NVIDIA HGX B200 datasheet (2025), per GPU: FP16/BF16 4.5 PF*, TF32 2.2 PF*, FP32 75, FP8 9 PF*.
    "b200": {"fp8": 4500 * T, "bf16": 2250 * T, "fp16": 2250 * T, "tf32": 1100 * T, "fp32": 75 * T},
    # NVIDIA GB200 NVL72 datasheet (2025), per Blackwell GPU: FP16/BF16 5 PF*, TF32 2.5 PF*, FP32 80, FP8 10 PF*.
    "gb200": {"fp8": 5000 * T, "bf16": 2500 * T, "fp16": 2500 * T, "tf32": 1250 * T, "fp32": 80 * T},
    # AMD Instinct MI300X data sheet (2023): FP16/BF16 1,307.4, TF32 653.7, FP32 matrix 163.4, FP8 2,614.9.
    "mi300x": {"fp8": 2614.9 * T, "bf16": 1307.4 * T, "fp16": 1307.4 * T, "tf32": 653.7 * T, "fp32": 163.4 * T},
    # AMD Instinct MI325X data sheet (2024): same CDNA 3 compute as MI300X, more HBM.
    "mi325x": {"fp8": 2614.9 * T, "bf16": 1307.4 * T, "fp16": 1307.4 * T, "tf32": 653.7 * T, "fp32": 163.4 * T},
    # AMD Instinct MI355X data sheet (2025): FP16/BF16 2.5 PF dense (256 CUs x 4,096 FLOP/clk x 2.4 GHz
    # = 2,516.6 T), FP32 matrix 157.3 T (256 FLOP/clk/CU); CDNA 4 has no TF32.
    "mi355x": {"bf16": 2516.6 * T, "fp16": 2516.6 * T, "fp32": 157.3 * T},
    # NVIDIA L40S datasheet (2023): BF16/FP16 362.05 (733* sparse), TF32 183 (366*), FP32 91.6, FP8 733 (1,466*).
    "l40s": {"fp8": 733 * T, "bf16": 362.05 * T, "fp16": 362.05 * T, "tf32": 183 * T, "fp32": 91.6 * T},
}

# Device memory in GiB as the datasheets print it ("80GB" HBM parts expose 80 GiB of stacks; the
# driver keeps a few hundred MiB, which the planner's allowance absorbs).
DEVICE_MEMORY_GIB: Dict[str, float] = {
    "a100_sxm": 80, "a100_sxm_40gb": 40, "a100_pcie": 80,  # A100 datasheet
    "h100_sxm": 80, "h100_pcie": 80, "h100_nvl": 94,  # H100 datasheet
    "h200": 141, "h200_nvl": 141,  # H200 datasheet
    "b200": 180,  # HGX B200 datasheet: 1,440 GB per 8 GPUs
    "gb200": 186,  # GB200 NVL72 datasheet: per-GPU HBM3e
    "mi300x": 192, "mi325x": 256, "mi355x": 288,  # AMD Instinct data sheets
    "l40s": 48,  # L40S datasheet (GDDR6)
}

# `cpu` has no datasheet figure: its peak comes from a matmul micro-benchmark run by the runtime.
MEASURED_ONLY = ("cpu",)


@dataclass(frozen=True)
class Peak:
    """A peak FLOP/s figure and where it came from; `flops` is None when nothing honest is known."""

    flops: Optional[float]
    source: str  # "datasheet:<key>:<dtype>", "measured:<key>-matmul" or "unknown"
    warning: Optional[str] = None


def peak_flops(accelerator: str, dtype: str, measured: Optional[float] = None) -> Peak:
    """Dense peak per device: a measured figure when given, else the table; never a silent default."""
    if measured is not None:
        return Peak(float(measured), f"measured:{accelerator}-matmul")
    row = PEAK_FLOPS.get(accelerator)
    if row is None:
        why = ("its peak is measured by the runtime's matmul micro-benchmark and was not given"
               if accelerator in MEASURED_ONLY else f"not in the table ({', '.join(sorted(PEAK_FLOPS))})")
        return Peak(None, "unknown", f"no peak FLOP/s for accelerator={accelerator!r}: {why}; MFU not computed")
    if dtype not in row:
        return Peak(None, "unknown",
                    f"no {dtype} peak for accelerator={accelerator!r} in its datasheet; MFU not computed")
    return Peak(row[dtype], f"datasheet:{accelerator}:{dtype}")


def device_memory_gib(accelerator: str) -> Optional[float]:
    """Datasheet memory of one device, or None (cpu, unknown accelerator)."""
    return DEVICE_MEMORY_GIB.get(accelerator)


def accelerator_problem(accelerator: str) -> Optional[str]:
    """An accelerator the tables above do not hold cannot be planned honestly (no peak, no memory)."""
    from harness.config.errors import nearest

    known = sorted({*PEAK_FLOPS, *MEASURED_ONLY})
    if accelerator in known:
        return None
    return (f"cluster.accelerator={accelerator!r} is not in harness/plan/peak.py's table"
            f"{nearest(accelerator, known)}: one of {', '.join(known)}")
