"""torchao's import-time lines that say nothing about a run on a torch without CUDA are dropped where they are
logged; a real load failure, and the same records under a CUDA torch, still pass."""

import logging
import subprocess
import sys

import pytest
import torch

from harness import REPO_ROOT
from harness.library_logs import TORCHAO_CUDA_LIBRARIES

CPU_TORCH = torch.version.cuda is None and torch.version.hip is None


@pytest.mark.skipif(not CPU_TORCH, reason="the dropped lines are those of a torch without CUDA")
def test_importing_the_harness_then_torchao_prints_nothing():
    """What every rank and `harness plan` do: transformers imports torchao (its quantizer) when it is installed."""
    code = "import harness, transformers.quantizers.auto, torchao.float8, torchao.kernel.intmm"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout + out.stderr == ""


def records_passed(logger_name, message, *args):
    """The records a handler on `logger_name` receives for one warning (the harness's filters installed)."""
    import harness  # noqa: F401  (installs the filters)

    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        logger.warning(message, *args)
    finally:
        logger.removeHandler(handler)
    return seen


@pytest.mark.skipif(not CPU_TORCH, reason="the CUDA kernels' failure is dropped under a torch without CUDA only")
@pytest.mark.parametrize("stem", TORCHAO_CUDA_LIBRARIES)
def test_cuda_kernel_libraries_failing_on_a_cpu_torch_are_dropped(stem):
    assert records_passed("torchao", f"Failed to load /x/torchao/{stem}.abi3.so: Could not load this library") == []


def test_other_load_failures_and_messages_pass():
    assert len(records_passed("torchao", "Failed to load /x/torchao/_C.abi3.so: undefined symbol: foo")) == 1
    assert len(records_passed("torchao", "Skipping import of cpp extensions due to incompatible torch version")) == 1
    assert len(records_passed("torch.utils._pytree", "%s is an Enum subclass and ...", logging.Formatter)) == 1


def test_cuda_kernel_failure_passes_under_a_cuda_torch(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert len(records_passed("torchao", "Failed to load /x/torchao/_C_mxfp8.so: libcudart.so: not found")) == 1
