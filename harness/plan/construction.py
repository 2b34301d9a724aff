"""Where ranks build the model: every weight on every rank, or on the meta device with each rank then
materialising only its own share (models whose full fp32 copy per local rank would crowd the host)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Tuple

from harness.plan.model_spec import model_spec_from_hf
from harness.plan.support import ENGINE_SUPPORT

GIB = 2**30
# `auto` builds on the meta device once the full copies would take more than this share of host memory:
# the rest is the engine's own host state (offload, buffers), the data loader and the OS.
FULL_BUILD_HOST_FRACTION = 0.5

Found = Tuple[Tuple[str, ...], Tuple[str, ...]]


def full_build_bytes(total_params: int, ranks_per_node: int) -> int:
    """Host bytes of `model.init=full` on one node: each local rank builds every weight in fp32
    (from_config initialises in fp32, 4 bytes per parameter) before the engine shards it."""
    return 4 * total_params * ranks_per_node


def _crowds_host(total_params: int, ranks_per_node: int, host_memory_gib: float) -> bool:
    return full_build_bytes(total_params, ranks_per_node) > FULL_BUILD_HOST_FRACTION * host_memory_gib * GIB


def _builds_sharded(engine: str, zero_stage: int) -> bool:
    support = ENGINE_SUPPORT.get(engine)
    return support is not None and zero_stage in support.meta_init_stages


def model_init_mode(engine: str, zero_stage: int, requested: str, total_params: int, ranks_per_node: int,
                    host_memory_gib: float, offload_params: str = "none") -> str:
    """`full` or `meta`: the requested mode, or for `auto` meta when the engine builds sharded at this ZeRO
    stage and either the full copies would take more than FULL_BUILD_HOST_FRACTION of host memory or the
    parameters live on NVMe. NVMe: zero.Init then creates the parameter swapper from the DeepSpeed config's
    precision; a model built whole is converted by DeepSpeed with an explicit dtype, which its
    `_set_dtype` (0.19) replaces with bf16 on accelerators without fp16 (the CPU one here), so an fp32
    run would swap bf16 weights."""
    if requested != "auto":
        return requested
    if _builds_sharded(engine, zero_stage) and (
            offload_params == "nvme" or _crowds_host(total_params, ranks_per_node, host_memory_gib)):
        return "meta"
    return "full"


def resolved_model_init(cfg: Any) -> str:
    """`full` or `meta` for a composed RunConfig: model_init_mode at its model's size, on its cluster."""
    spec = model_spec_from_hf(cfg.model.name, cfg.model.hf_config)
    return model_init_mode(cfg.engine.name, cfg.layout.zero_stage, cfg.model.init, spec.total_params,
                           cfg.cluster.accelerators_per_node, cfg.cluster.host_memory_gib, cfg.layout.offload_params)


@lru_cache(maxsize=None)
def check_model_init(engine: str, zero_stage: int, requested: str, total_params: int, ranks_per_node: int,
                     host_memory_gib: float, offload_params: str = "none") -> Found:
    """model.init against the engine, and the host memory a full build would take."""
    if engine not in ENGINE_SUPPORT or not ENGINE_SUPPORT[engine].builds_model:
        return (), ()
    if requested == "meta" and not _builds_sharded(engine, zero_stage):
        where = "; ".join(f"engine={name} at zero_stage {', '.join(map(str, s.meta_init_stages))}"
                          for name, s in ENGINE_SUPPORT.items() if s.meta_init_stages)
        return (f"model.init=meta: engine={engine} with zero_stage={zero_stage} builds the full model on every "
                f"rank before sharding it (sharded construction: {where})",), ()
    if model_init_mode(engine, zero_stage, requested, total_params, ranks_per_node, host_memory_gib,
                       offload_params) == "full" and \
            _crowds_host(total_params, ranks_per_node, host_memory_gib):
        need = full_build_bytes(total_params, ranks_per_node) / GIB
        words = (f"model.init={requested}: {ranks_per_node} ranks per node each build all "
                 f"{total_params / 1e9:.2f}B parameters in fp32 ({need:.1f} GiB) before sharding")
        if need > host_memory_gib:  # the node runs out of memory before the engine shards anything
            where = "; ".join(f"engine={name} at zero_stage {', '.join(map(str, s.meta_init_stages))}"
                              for name, s in ENGINE_SUPPORT.items() if s.meta_init_stages)
            return (f"{words}, more than cluster.host_memory_gib={host_memory_gib:g}: the host runs out of "
                    f"memory first (sharded construction: {where})",), ()
        return (), (f"{words}, more than {FULL_BUILD_HOST_FRACTION:.0%} of cluster.host_memory_gib="
                    f"{host_memory_gib:g}",)
    return (), ()
