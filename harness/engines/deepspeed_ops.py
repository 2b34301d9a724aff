"""Whether DeepSpeed's JIT-built ops can load on this machine (its own `is_compatible`, its chatter silenced)."""

from __future__ import annotations

import contextlib
import functools
import io
from typing import Tuple

# The builders the harness's layouts need: CPU Adam (offloaded optimizer with compiled ops), fused Adam,
# async I/O (NVMe offload swaps through libaio).
DEEPSPEED_OPS = ("CPUAdamBuilder", "FusedAdamBuilder", "AsyncIOBuilder")
ASYNC_IO = "AsyncIOBuilder"


@functools.lru_cache(maxsize=None)
def op_compatible(builder_name: str) -> Tuple[str, bool]:
    """(the op's name, whether it can build here), as `ds_report` decides it."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from deepspeed.ops import op_builder

        builder = getattr(op_builder, builder_name)()
        return builder.NAME, bool(builder.is_compatible(verbose=False))
