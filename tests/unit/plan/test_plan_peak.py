"""Peak FLOP/s table: dense datasheet figures, cited, and no silent default."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.plan import peak
from harness.plan.peak import DEVICE_MEMORY_GIB, PEAK_FLOPS, device_memory_gib, peak_flops

REQUIRED = ("a100_sxm", "a100_pcie", "h100_sxm", "h100_pcie", "h100_nvl", "h200", "b200", "gb200", "mi300x",
            "mi325x", "mi355x", "l40s")


@pytest.mark.parametrize("accelerator", REQUIRED)
def test_required_accelerators_have_bf16_fp16_fp32_and_memory(accelerator):
    row = PEAK_FLOPS[accelerator]
    assert row["bf16"] == row["fp16"] > row["fp32"] > 0
    assert DEVICE_MEMORY_GIB[accelerator] > 0
    assert peak_flops(accelerator, "bf16").source == f"datasheet:{accelerator}:bf16"


def test_dense_not_sparse():
    # NVIDIA prints 1,979 (H100 SXM), 4.5 PF (B200), 5 PF (GB200) "with sparsity": dense is half.
    assert PEAK_FLOPS["h100_sxm"]["bf16"] == 989.5e12
    assert PEAK_FLOPS["b200"]["bf16"] == 2.25e15
    assert PEAK_FLOPS["gb200"]["bf16"] == 2.5e15
    assert PEAK_FLOPS["a100_sxm"]["bf16"] == 312e12
    assert PEAK_FLOPS["mi300x"]["bf16"] == 1307.4e12
    for row in PEAK_FLOPS.values():
        assert row["bf16"] <= 2.6e15  # no dense bf16 part beyond MI355X / GB200 in this table


def test_every_entry_names_its_datasheet():
    text = Path(peak.__file__).read_text()
    tables = text.split("DEVICE_MEMORY_GIB: Dict")
    for table, keys in ((tables[0], PEAK_FLOPS), (tables[1], DEVICE_MEMORY_GIB)):
        lines = table.splitlines()
        for key in keys:
            index = next(i for i, line in enumerate(lines) if f'"{key}": ' in line)
            context = " ".join(lines[max(0, index - 3):index + 1]).lower()
            assert "datasheet" in context or "data sheet" in context, key


def test_unknown_accelerator_gives_none_and_a_warning():
    result = peak_flops("tpu_v9", "bf16")
    assert result.flops is None and result.source == "unknown"
    assert "tpu_v9" in result.warning and "MFU not computed" in result.warning
    assert device_memory_gib("tpu_v9") is None


def test_cpu_peak_is_measured_only():
    result = peak_flops("cpu", "fp32")
    assert result.flops is None and "measured" in result.warning
    measured = peak_flops("cpu", "fp32", measured=1.5e11)
    assert measured.flops == 1.5e11 and measured.source == "measured:cpu-matmul" and measured.warning is None


def test_missing_dtype_is_not_defaulted():
    result = peak_flops("mi355x", "tf32")  # CDNA 4 has no TF32
    assert result.flops is None and "tf32" in result.warning
