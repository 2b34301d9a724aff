"""Whether DeepSpeed's JIT-built ops can load on this machine (its own `is_compatible`, its chatter silenced)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import Iterator, Tuple

# The builders the harness's layouts need: CPU Adam (offloaded optimizer with compiled ops), fused Adam,
# async I/O (NVMe offload swaps through libaio).
DEEPSPEED_OPS = ("CPUAdamBuilder", "FusedAdamBuilder", "AsyncIOBuilder")
ASYNC_IO = "AsyncIOBuilder"


@functools.lru_cache(maxsize=None)
def op_compatible(builder_name: str) -> Tuple[str, bool]:
    """(the op's name, whether it can build here), as `ds_report` decides it."""
    with _silenced_fds():
        from deepspeed.ops import op_builder

        builder = getattr(op_builder, builder_name)()
        return builder.NAME, bool(builder.is_compatible(verbose=False))


@contextlib.contextmanager
def _silenced_fds() -> Iterator[None]:
    """stdout and stderr to /dev/null at the file-descriptor level: DeepSpeed's checks compile a probe with
    their output sent to `sys.stderr.fileno()`, so a Python-level redirect to a StringIO (no fileno) makes
    every check fail, and the compiler's chatter is not Python's to catch anyway."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)
