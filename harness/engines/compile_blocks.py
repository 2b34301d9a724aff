"""torch.compile per decoder block, placed as torchtitan's apply_compile places it: after tensor parallelism and
activation checkpointing, before FSDP2's fully_shard.

Compiling each block rather than the whole model reuses one compiled graph for every identical block and keeps the
embedding and head (and the pipeline's stage plumbing) eager. fully_shard then wraps the compiled module, so its
all-gather and reduce-scatter hooks run outside the compiled region.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch._dynamo.eval_frame import OptimizedModule


def compile_modules(root: torch.nn.Module, blocks: Iterable[torch.nn.Module]) -> int:
    """Replace each of `blocks` inside `root` by torch.compile(block) (inductor, default options); the count."""
    targets = {id(block) for block in blocks}
    replaced = 0
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in targets:
                parent.register_module(name, torch.compile(child))
                replaced += 1
    return replaced


def is_compiled(module: torch.nn.Module) -> bool:
    return isinstance(module, OptimizedModule)
