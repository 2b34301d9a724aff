"""Known-harmless import-time log lines of the libraries the harness loads, dropped where they are logged.

transformers imports torchao whenever it is installed (its torchao quantizer), so every process that builds a
model — `harness plan`'s shape reader and every rank — imports torchao. Two of its records say nothing about
the run on a machine whose torch has no CUDA:
- torchao/__init__.py tries `torch.ops.load_library` on each bundled `_C*.so` and logs "Failed to load <file>"
  for those that cannot load. `_C_mxfp8` (MX FP8 kernels) and `_C_cutlass_90a` (CUTLASS sm90a kernels) link
  libtorch_cuda / libc10_cuda, which a CPU build of torch lacks (`ldd`), so they cannot load there. Their
  failure is dropped only when the torch in the process has no CUDA (`torch.version.cuda is None`); any other
  library's failure, or theirs under a CUDA torch, is a real error and passes.
- torchao/kernel/intmm.py warns "Detected no triton" when triton does not import. Triton compiles GPU kernels
  and ships with CUDA / ROCm builds of torch only, so on a torch without CUDA its absence is expected; the
  warning is dropped there alone.
- torch.utils._pytree warns that `register_constant()` on an Enum subclass is deprecated; torchao registers its
  own enums (KernelPreference, ScaleCalculationMode) that way at import. Dropped only for torchao's classes.
These are Python logging records, so a logger filter removes them at their source (no descriptor redirect)."""

from __future__ import annotations

import logging
import sys

# torchao's bundled CUDA kernel libraries (file stems before the first dot).
TORCHAO_CUDA_LIBRARIES = ("_C_mxfp8", "_C_cutlass_90a")


def _torch_without_cuda() -> bool:
    torch = sys.modules.get("torch")
    version = getattr(torch, "version", None)
    return version is not None and getattr(version, "cuda", "") is None and getattr(version, "hip", None) is None


def _cuda_library_failure(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    if not message.startswith("Failed to load "):
        return False
    path = message[len("Failed to load "):].split(":", 1)[0]
    stem = path.rsplit("/", 1)[-1].split(".", 1)[0]
    return stem in TORCHAO_CUDA_LIBRARIES and _torch_without_cuda()


def _no_triton_on_cpu(record: logging.LogRecord) -> bool:
    return "Detected no triton" in record.getMessage() and _torch_without_cuda()


def _torchao_enum_deprecation(record: logging.LogRecord) -> bool:
    args = record.args if isinstance(record.args, tuple) else ()
    return (str(record.msg).startswith("%s is an Enum subclass") and len(args) == 1
            and getattr(args[0], "__module__", "").startswith("torchao"))


def quiet_library_logs() -> None:
    """Install the filters (idempotent: a filter already on a logger is not added twice)."""
    for name, drop in (("torchao", _cuda_library_failure), ("torchao.kernel.intmm", _no_triton_on_cpu),
                       ("torch.utils._pytree", _torchao_enum_deprecation)):
        logger = logging.getLogger(name)
        if not any(getattr(f, "__harness_drop__", None) is drop for f in logger.filters):
            def keep(record, drop=drop):
                return not drop(record)
            keep.__harness_drop__ = drop
            logger.addFilter(keep)
