"""Every rule a layout must satisfy, checked at once; each message names fields, values and the rule."""

from __future__ import annotations

from typing import Any, List, Tuple

from harness.config import schema
from harness.plan.conventions import state_convention
from harness.plan.model_spec import ModelSpec
from harness.plan.support import ENGINE_SUPPORT

SINGLE_STAGE_SCHEDULES = ("GPipe", "1F1B")
TWO_STAGE_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
_ENUMS = (
    ("engine.name", "engine", "name", schema.ENGINES),
    ("engine.launcher", "engine", "launcher", schema.LAUNCHERS),
    ("layout.precision", "layout", "precision", schema.PRECISIONS),
    ("layout.offload_optimizer", "layout", "offload_optimizer", schema.OFFLOAD_TARGETS),
    ("layout.offload_params", "layout", "offload_params", schema.OFFLOAD_TARGETS),
    ("layout.activation_checkpointing", "layout", "activation_checkpointing", schema.CHECKPOINTING),
    ("layout.pp_schedule", "layout", "pp_schedule", schema.PP_SCHEDULES),
    ("bench.flop_attention", "bench", "flop_attention", schema.FLOP_ATTENTION),
)
_DEGREES = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "pp_virtual_stages", "micro_batch",
            "grad_accum", "seq_len")


def validate(cfg: Any, spec: ModelSpec) -> Tuple[List[str], List[str]]:
    """(errors, warnings) of a RunConfig against its model; an empty error list means plannable."""
    errors: List[str] = []
    warnings: List[str] = []
    _check_enums(cfg, errors)
    layout = cfg.layout
    bad = [f"layout.{name}={getattr(layout, name)}" for name in _DEGREES if getattr(layout, name) < 1]
    if bad:
        errors.append(f"{', '.join(bad)}: degrees and batch fields must be >= 1")
        return errors, warnings  # the divisibility rules below would divide by them
    if layout.zero_stage not in (0, 1, 2, 3):
        errors.append(f"layout.zero_stage={layout.zero_stage} must be one of 0, 1, 2, 3")
    _check_world(layout, cfg.cluster, errors, warnings)
    _check_tensor_parallel(layout, cfg.engine, spec, errors, warnings)
    _check_pipeline(layout, spec, errors, warnings)
    _check_sequence(layout, cfg.engine, spec, cfg.cluster, errors, warnings)
    _check_experts(layout, spec, errors)
    _check_engine(layout, cfg.engine, cfg.cluster, errors, warnings)
    return errors, warnings


def _check_enums(cfg: Any, errors: List[str]) -> None:
    for label, group, name, allowed in _ENUMS:
        value = getattr(getattr(cfg, group), name)
        if value not in allowed:
            errors.append(f"{label}={value!r} must be one of {', '.join(allowed)}")


def _check_world(layout: Any, cluster: Any, errors: List[str], warnings: List[str]) -> None:
    # Every rank sits at one coordinate of the dp_replicate x dp_shard x cp x pp x tp mesh; experts
    # borrow their degree from inside dp_shard x cp (torchtitan ParallelDims), so ep does not multiply.
    world = layout.dp_replicate * layout.dp_shard * layout.tp * layout.pp * layout.cp
    devices = cluster.nodes * cluster.accelerators_per_node
    if cluster.nodes < 1 or cluster.accelerators_per_node < 1:
        errors.append(f"cluster.nodes={cluster.nodes}, cluster.accelerators_per_node="
                      f"{cluster.accelerators_per_node} must be >= 1")
    elif world != devices:
        errors.append(
            f"dp_replicate={layout.dp_replicate} x dp_shard={layout.dp_shard} x tp={layout.tp} x pp={layout.pp}"
            f" x cp={layout.cp} = {world} must equal cluster.nodes={cluster.nodes} x "
            f"cluster.accelerators_per_node={cluster.accelerators_per_node} = {devices}")
    if layout.tp > cluster.accelerators_per_node >= 1:
        warnings.append(f"tp={layout.tp} > cluster.accelerators_per_node={cluster.accelerators_per_node}: "
                        "tensor-parallel collectives cross the inter-node network")


def _check_tensor_parallel(layout: Any, engine: Any, spec: ModelSpec, errors: List[str],
                           warnings: List[str]) -> None:
    tp = layout.tp
    if tp == 1:
        if engine.sequence_parallel or engine.loss_parallel:
            warnings.append("engine.sequence_parallel / engine.loss_parallel have no effect with tp=1")
        return
    # Megatron-style TP splits heads, kv heads and ffn columns evenly across the tp ranks.
    for field, value in (("num_attention_heads", spec.num_heads), ("num_key_value_heads", spec.num_kv_heads),
                         ("intermediate_size", spec.ffn_size)):
        if value % tp:
            errors.append(f"tp={tp} must divide {field}={value}")
    if spec.vocab_size % tp:
        warnings.append(f"tp={tp} does not divide vocab_size={spec.vocab_size}: vocabulary shards are "
                        "padded or uneven")


def _check_pipeline(layout: Any, spec: ModelSpec, errors: List[str], warnings: List[str]) -> None:
    pp, v, m, schedule = layout.pp, layout.pp_virtual_stages, layout.grad_accum, layout.pp_schedule
    explicit = list(layout.pp_stage_layers)
    if pp == 1:
        if explicit and (len(explicit) != 1 or explicit[0] != spec.num_layers):
            errors.append(f"pp_stage_layers={explicit} given with pp=1")
        if v > 1:
            errors.append(f"pp_virtual_stages={v} needs pp > 1")
        return
    stages = pp * v
    if schedule in SINGLE_STAGE_SCHEDULES and v != 1:
        errors.append(f"pp_schedule={schedule} runs one stage per rank: pp_virtual_stages={v} must be 1")
    if schedule in TWO_STAGE_SCHEDULES and v != 2:
        errors.append(f"pp_schedule={schedule} runs exactly two stages per rank: pp_virtual_stages={v} must be 2")
    if explicit:
        if len(explicit) != stages:
            errors.append(f"pp_stage_layers has {len(explicit)} entries; pp={pp} x pp_virtual_stages={v} "
                          f"= {stages} stages need one each")
        elif sum(explicit) != spec.num_layers or min(explicit) < 0:
            errors.append(f"pp_stage_layers={explicit} must be >= 0 and sum to num_hidden_layers="
                          f"{spec.num_layers} (sum {sum(explicit)})")
        else:
            warnings.append(f"pp_stage_layers={explicit}: uneven split, the largest stage sets the pace")
    elif spec.num_layers % stages:
        errors.append(f"pp={pp} x pp_virtual_stages={v} = {stages} must divide num_hidden_layers="
                      f"{spec.num_layers} (or give pp_stage_layers)")
    # torch.distributed.pipelining: 1F1B and DualPipeV need as many micro-batches as stages; the
    # interleaved schedules need a whole number of rounds (n_microbatches % (n // pp) == 0).
    if schedule == "1F1B" and m < pp:
        errors.append(f"pp_schedule=1F1B needs grad_accum (micro-batches)={m} >= pp={pp}")
    if schedule == "DualPipeV" and m < stages:
        errors.append(f"pp_schedule=DualPipeV needs grad_accum (micro-batches)={m} >= pp x 2 = {stages}")
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, m // pp)
        if m % rounds:
            errors.append(f"pp_schedule={schedule} needs grad_accum={m} to be a multiple of its "
                          f"{rounds} rounds (grad_accum // pp)")
    if m < pp and schedule not in ("1F1B", "DualPipeV"):
        warnings.append(f"grad_accum={m} < pp={pp}: the pipeline never fills (bubble > 50%)")


def _check_sequence(layout: Any, engine: Any, spec: ModelSpec, cluster: Any, errors: List[str],
                    warnings: List[str]) -> None:
    seq, cp = layout.seq_len, layout.cp
    # Load-balanced causal context parallelism cuts the sequence into 2 x cp chunks (rank i takes
    # chunks i and 2cp-1-i), so each rank does the same share of the causal triangle.
    if cp > 1 and seq % (2 * cp):
        errors.append(f"cp={cp}: seq_len={seq} must be divisible by 2 x cp = {2 * cp} (load-balanced causal)")
    if cp > 1 and spec.attn_implementation == "eager":
        errors.append(f"cp={cp} needs an SDPA/flash attention kernel, not attn_implementation='eager'")
    if engine.sequence_parallel and layout.tp > 1 and (seq // cp) % layout.tp:
        errors.append(f"sequence_parallel: seq_len / cp = {seq // cp} must be divisible by tp={layout.tp}")
    if spec.learned_positions and seq > spec.learned_positions:
        errors.append(f"seq_len={seq} exceeds the learned position table n_positions={spec.learned_positions}")
    elif seq > spec.max_positions:
        warnings.append(f"seq_len={seq} > max_position_embeddings={spec.max_positions}")


def _check_experts(layout: Any, spec: ModelSpec, errors: List[str]) -> None:
    ep = layout.ep
    if ep == 1:
        return
    if not spec.is_moe:
        errors.append(f"ep={ep} needs a mixture-of-experts model; {spec.name} is dense")
        return
    if spec.num_experts % ep:
        errors.append(f"ep={ep} must divide num_experts={spec.num_experts}")
    if (layout.dp_shard * layout.cp) % ep:
        errors.append(f"ep={ep} must divide dp_shard={layout.dp_shard} x cp={layout.cp} = "
                      f"{layout.dp_shard * layout.cp} (experts are sharded inside the data axis)")


def _check_engine(layout: Any, engine: Any, cluster: Any, errors: List[str], warnings: List[str]) -> None:
    name = engine.name
    support = ENGINE_SUPPORT.get(name)
    if support is None:
        return
    zero = layout.zero_stage
    if zero not in support.zero_stages:
        reason = f" ({support.zero_reason})" if support.zero_reason else ""
        errors.append(f"engine={name} does not support zero_stage={zero}{reason}")
    for degree, ok in (("tp", support.tp), ("cp", support.cp), ("ep", support.ep)):
        if getattr(layout, degree) > 1 and not ok:
            errors.append(f"engine={name} does not support {degree}={getattr(layout, degree)}")
    if layout.pp > 1:
        if not support.pp_schedules:
            errors.append(f"engine={name} does not support pp={layout.pp}")
        else:
            if layout.pp_schedule not in support.pp_schedules:
                errors.append(f"engine={name} supports pp_schedule in {', '.join(support.pp_schedules)}, "
                              f"not {layout.pp_schedule}")
            if zero not in support.pp_zero_stages:
                errors.append(f"engine={name} rejects zero_stage={zero} with pp={layout.pp} (allowed: "
                              f"{', '.join(map(str, support.pp_zero_stages))})")
    if layout.dp_replicate > 1 and zero not in support.hybrid_zero_stages:
        errors.append(f"engine={name} cannot shard over dp_shard only (dp_replicate={layout.dp_replicate}) "
                      f"at zero_stage={zero} (hybrid sharding: "
                      f"{', '.join(map(str, support.hybrid_zero_stages)) or 'none'})")
    if name == "fsdp" and engine.fsdp_version not in (1, 2):
        errors.append(f"engine.fsdp_version={engine.fsdp_version} must be 1 or 2")
    if name == "fsdp" and engine.fsdp_version == 1 and (layout.tp > 1 or layout.cp > 1):
        errors.append(f"engine=fsdp fsdp_version=1 cannot compose tp={layout.tp} / cp={layout.cp} (needs FSDP2)")
    if layout.cp > 1 and cluster.accelerator == "cpu":
        errors.append(f"cp={layout.cp} on accelerator=cpu: context parallelism does not run on CPU")
    if layout.precision == "fp16" and cluster.accelerator == "cpu":
        errors.append("precision=fp16 on accelerator=cpu: fp16 training is not supported on CPU")
    if state_convention(name, layout.precision, zero) is None and layout.precision in schema.PRECISIONS:
        errors.append(f"no memory convention for engine={name} precision={layout.precision}")
    _check_offload(layout, name, support, errors)


def _check_offload(layout: Any, name: str, support: Any, errors: List[str]) -> None:
    zero = layout.zero_stage
    for state, target, table in (("offload_optimizer", layout.offload_optimizer, support.offload_optimizer),
                                 ("offload_params", layout.offload_params, support.offload_params)):
        if target == "none" or target not in schema.OFFLOAD_TARGETS:
            continue
        stages = table.get(target, ())
        if zero not in stages:
            allowed = f"zero_stage in {', '.join(map(str, stages))}" if stages else "never"
            errors.append(f"engine={name}: {state}={target} at zero_stage={zero} is not supported ({allowed})")
    if support.offload_together and layout.offload_optimizer != layout.offload_params:
        errors.append(f"engine={name} offloads parameters, gradients and optimizer together: "
                      f"offload_optimizer={layout.offload_optimizer} must equal "
                      f"offload_params={layout.offload_params}")
    if "nvme" in (layout.offload_optimizer, layout.offload_params) and not layout.nvme_path:
        errors.append("offload to nvme needs layout.nvme_path")
