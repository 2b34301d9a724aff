"""Every rule a layout must satisfy, checked at once; each message names fields, values and the rule."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, List, Optional, Tuple

from harness.plan.construction import check_model_init
from harness.plan.conventions import state_convention
from harness.plan.model_spec import ModelSpec
from harness.plan.parallel_dims import ParallelDims
from harness.plan.peak import accelerator_problem, peak_flops
from harness.plan.regime import fp8_conversion_found, fp8_linear_dims, fp8_problems
from harness.plan.pipeline import pipeline_problems
from harness.plan.support import ENGINE_SUPPORT, HYBRID_REASONS, compile_problem, unmet_parallel_options

# Each rule is a pure function of the few primitive fields it reads, returning (errors, warnings);
# memoised, since a sweep repeats the same sub-combinations many times.
Found = Tuple[Tuple[str, ...], Tuple[str, ...]]
OK: Found = ((), ())
_DEGREES = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "pp_virtual_stages", "micro_batch",
            "grad_accum", "seq_len")


def validate(cfg: Any, spec: ModelSpec) -> Tuple[List[str], List[str]]:
    """(errors, warnings) of a RunConfig against its model; an empty error list means plannable."""
    layout, engine, cluster = cfg.layout, cfg.engine, cfg.cluster
    unknown_accelerator = accelerator_problem(cluster.accelerator)
    if unknown_accelerator:  # every later rule reads the accelerator's table row
        return [unknown_accelerator], []
    found: List[Found] = []
    degrees = (layout.dp_replicate, layout.dp_shard, layout.tp, layout.pp, layout.cp, layout.ep,
               layout.pp_virtual_stages, layout.micro_batch, layout.grad_accum, layout.seq_len)
    if min(degrees) < 1:
        bad = ", ".join(f"layout.{n}={d}" for n, d in zip(_DEGREES, degrees) if d < 1)
        found.append(((f"{bad}: degrees and batch fields must be >= 1",), ()))
        return _merge(found)  # the divisibility rules below would divide by them
    stage_layers = tuple(layout.pp_stage_layers)
    found += [
        check_world(layout.dp_replicate, layout.dp_shard, layout.tp, layout.pp, layout.cp, cluster.nodes,
                    cluster.accelerators_per_node),
        check_tensor_parallel(layout.tp, engine.sequence_parallel, engine.loss_parallel, *spec.split_heads,
                              spec.ffn_size, spec.vocab_size),
        check_pipeline(layout.pp, layout.pp_virtual_stages, layout.grad_accum, layout.pp_schedule,
                       stage_layers, spec.num_layers),
        check_weight_shared(layout.pp, spec.layer_runs, spec.model_type),
        check_sequence(layout.seq_len, layout.cp, layout.tp, engine.sequence_parallel, spec.attn_implementation,
                       spec.learned_positions, spec.max_positions),
        check_experts(layout.ep, layout.dp_shard, layout.cp, spec.num_experts, spec.name),
        *support_found(cfg),
        check_model_init(engine.name, layout.zero_stage, cfg.model.init, spec.total_params,
                         cluster.accelerators_per_node, cluster.host_memory_gib, layout.offload_params),
        check_fp8(engine.name, cluster.accelerator, tuple(fp8_linear_dims(spec, layout.tp).items()),
                  cfg.standin.of is not None)
        if layout.precision == "fp8" else OK,
        check_fp8_conversion(spec, engine.name) if layout.precision == "fp8" else OK,
    ]
    return _merge(found)


def support_found(cfg: Any) -> List[Found]:
    """The engine support table's rules (harness.plan.support) for one config; engines' own checks start here."""
    layout, engine = cfg.layout, cfg.engine
    return [
        check_engine(engine.name, unmet_parallel_options(engine), layout.zero_stage, layout.dp_replicate,
                     layout.tp, layout.pp, layout.cp, layout.ep, layout.pp_schedule, layout.precision,
                     cfg.cluster.accelerator),
        check_offload(engine.name, layout.zero_stage, layout.offload_optimizer, layout.offload_params,
                      bool(layout.nvme_path)),
        check_compile(engine.name, engine.compile, engine.fsdp_version, layout.pp, layout.pp_schedule, layout.tp,
                      layout.activation_checkpointing),
    ]


def support_problems(cfg: Any) -> List[str]:
    """The errors of support_found: what the table refuses of this config, one message per rule."""
    return _merge(support_found(cfg))[0]


def _merge(found: List[Found]) -> Tuple[List[str], List[str]]:
    errors: List[str] = []
    warnings: List[str] = []
    for errs, warns in found:
        if errs:
            errors += errs
        if warns:
            warnings += warns
    return errors, warnings


@lru_cache(maxsize=None)
def check_world(dp_replicate: int, dp_shard: int, tp: int, pp: int, cp: int, nodes: int,
                accelerators_per_node: int) -> Found:
    """The mesh covers the cluster's ranks exactly (harness.plan.parallel_dims)."""
    dims = ParallelDims(dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, pp=pp, cp=cp)
    errors, warnings = dims.world_problems(nodes, accelerators_per_node)
    return tuple(errors), tuple(warnings)


@lru_cache(maxsize=None)
def check_tensor_parallel(tp: int, sequence_parallel: bool, loss_parallel: bool, heads: int, kv_heads: int,
                          ffn: int, vocab: int) -> Found:
    """Megatron-style TP splits heads, kv heads and ffn columns evenly across the tp ranks."""
    if tp == 1:
        if sequence_parallel or loss_parallel:
            return (), ("engine.sequence_parallel / engine.loss_parallel have no effect with tp=1",)
        return OK
    fields = [("num_attention_heads", heads), ("intermediate_size", ffn)]
    if kv_heads != heads:  # grouped-query attention's own count (a multi-head model has no such field)
        fields.insert(1, ("num_key_value_heads", kv_heads))
    errors = [f"tp={tp} must divide {field}={value}" for field, value in fields if value % tp]
    warnings = [f"tp={tp} does not divide vocab_size={vocab}: vocabulary shards are padded or uneven"] \
        if vocab % tp else []
    return tuple(errors), tuple(warnings)


@lru_cache(maxsize=None)
def check_pipeline(pp: int, virtual: int, microbatches: int, schedule: str, stage_layers: Tuple[int, ...],
                   num_layers: int) -> Found:
    """Stages vs layers and schedule (harness.plan.pipeline)."""
    return pipeline_problems(pp, virtual, microbatches, schedule, stage_layers, num_layers)


@lru_cache(maxsize=None)
def check_weight_shared(pp: int, layer_runs: Tuple[Tuple[int, int], ...], model_type: str) -> Found:
    """Weight-shared stacks (HRM's H and L modules, ModelSpec.layer_runs) run their layers in a loop the model's
    own forward drives: z_L and z_H go back and forth between the stacks H_cycles x (L_cycles + 1) times. A
    pipeline stage runs its layers once per micro-batch and hands the result on: it cannot hold layers another
    stage's loop runs again, so pipeline parallelism is refused."""
    if pp == 1 or not layer_runs:
        return OK
    runs = sum(grad + no_grad for grad, no_grad in layer_runs)
    return (f"pp={pp}: {model_type} runs its {len(layer_runs)} weight-shared layers {runs} times a forward in a "
            "loop its own forward drives (two stacks passing states back and forth); a pipeline stage runs its "
            "layers once and hands them on, so the layers cannot be split into stages (use pp=1)",), ()


@lru_cache(maxsize=None)
def check_sequence(seq: int, cp: int, tp: int, sequence_parallel: bool, attn_implementation: str,
                   learned_positions: int, max_positions: int) -> Found:
    """Sequence length vs context parallelism, sequence parallelism and the position table."""
    errors, warnings = [], []
    # Load-balanced causal CP cuts the sequence into 2 x cp chunks (rank i takes chunks i and 2cp-1-i)
    # so every rank does the same share of the causal triangle.
    if cp > 1 and seq % (2 * cp):
        errors.append(f"cp={cp}: seq_len={seq} must be divisible by 2 x cp = {2 * cp} (load-balanced causal)")
    if cp > 1 and attn_implementation == "eager":
        errors.append(f"cp={cp} needs an SDPA/flash attention kernel, not attn_implementation='eager'")
    if sequence_parallel and tp > 1 and (seq // cp) % tp:
        errors.append(f"sequence_parallel: seq_len / cp = {seq // cp} must be divisible by tp={tp}")
    if learned_positions and seq > learned_positions:
        errors.append(f"seq_len={seq} exceeds the learned position table n_positions={learned_positions}")
    elif seq > max_positions:
        warnings.append(f"seq_len={seq} > max_position_embeddings={max_positions}")
    return tuple(errors), tuple(warnings)


@lru_cache(maxsize=None)
def check_experts(ep: int, dp_shard: int, cp: int, num_experts: int, model: str) -> Found:
    """Expert parallelism needs experts, divides them, and lives inside dp_shard x cp."""
    if ep == 1:
        return OK
    if not num_experts:
        return (f"ep={ep} needs a mixture-of-experts model; {model} is dense",), ()
    errors = []
    if num_experts % ep:
        errors.append(f"ep={ep} must divide num_experts={num_experts}")
    if (dp_shard * cp) % ep:
        errors.append(f"ep={ep} must divide dp_shard={dp_shard} x cp={cp} = {dp_shard * cp} (experts are "
                      "sharded inside the data axis)")
    return tuple(errors), ()


@lru_cache(maxsize=None)
def check_engine(engine: str, unmet_options: Tuple[Tuple[str, Any], ...], zero: int, dp_replicate: int, tp: int,
                 pp: int, cp: int, ep: int, schedule: str, precision: str, accelerator: str) -> Found:
    """The engine support matrix (harness.plan.support) and device limits; `unmet_options` are the engine
    options that keep tp / cp from composing (harness.plan.support.unmet_parallel_options)."""
    errors = []
    if cp > 1 and accelerator == "cpu":
        errors.append(f"cp={cp} on accelerator=cpu: context parallelism does not run on CPU")
    if precision == "fp16" and accelerator == "cpu":
        errors.append("precision=fp16 on accelerator=cpu: fp16 training is not supported on CPU")
    support = ENGINE_SUPPORT.get(engine)
    if support is None:
        return tuple(errors), ()
    if zero not in support.zero_stages:
        reason = f" ({support.zero_reason})" if support.zero_reason else ""
        errors.append(f"engine={engine} does not support zero_stage={zero}{reason}")
    for degree, value, ok in (("tp", tp, support.tp), ("cp", cp, support.cp), ("ep", ep, support.ep)):
        if value > 1 and not ok:
            errors.append(f"engine={engine} does not support {degree}={value}")
        elif value > 1 and accelerator == "cpu" and degree in support.gpu_only_axes:
            errors.append(f"engine={engine} runs {degree}={value} on GPU only, not accelerator={accelerator} "
                          f"({support.gpu_only_reason})")
    if cp > 1 and pp > 1 and not support.cp_with_pp:
        errors.append(f"layout.cp={cp} with pp={pp}: engine={engine} runs context parallelism without pipeline "
                      "parallelism")
    if pp > 1 and not support.pp_schedules:
        errors.append(f"engine={engine} does not support pp={pp}")
    elif pp > 1:
        if schedule not in support.pp_schedules:
            errors.append(f"engine={engine} supports pp_schedule in {', '.join(support.pp_schedules)}, "
                          f"not {schedule}")
        if zero not in support.pp_zero_stages:
            errors.append(f"engine={engine} rejects zero_stage={zero} with pp={pp} (allowed: "
                          f"{', '.join(map(str, support.pp_zero_stages))})")
    if dp_replicate > 1 and zero not in support.hybrid_zero_stages:
        why = HYBRID_REASONS.get(engine) or ("hybrid sharding: "
                                             f"{', '.join(map(str, support.hybrid_zero_stages)) or 'none'}")
        errors.append(f"engine={engine} cannot shard over dp_shard only (dp_replicate={dp_replicate}) at "
                      f"zero_stage={zero} ({why})")
    if tp > 1 and support.tp_zero_stages and zero not in support.tp_zero_stages:
        errors.append(f"engine={engine} rejects zero_stage={zero} with tp={tp} (allowed: "
                      f"{', '.join(map(str, support.tp_zero_stages))}: {support.tp_zero_reason})")
    if tp > 1 or cp > 1:
        errors += [f"engine={engine} {option}={value} cannot compose tp={tp} / cp={cp} ({support.tp_cp_reason})"
                   for option, value in unmet_options]
    if state_convention(engine, precision, zero) is None:
        errors.append(f"no memory convention for engine={engine} precision={precision}")
    return tuple(errors), ()


@lru_cache(maxsize=None)
def check_fp8(engine: str, accelerator: str, dims: Tuple[Tuple[str, int], ...], standin: bool = False) -> Found:
    """layout.precision=fp8 only on an engine and a device with FP8 (or as a GPU recipe's CPU stand-in), with
    GEMM dimensions FP8 takes (harness.plan.regime.fp8_problems; the device's FP8 figure is its datasheet row
    in harness.plan.peak)."""
    has_fp8 = peak_flops(accelerator, "fp8").flops is not None
    return tuple(fp8_problems(engine, accelerator, has_fp8, dict(dims), standin)), ()


@lru_cache(maxsize=None)
def check_fp8_conversion(spec: ModelSpec, engine: str) -> Found:
    """What layout.precision=fp8 converts of this model on this engine (harness.plan.regime.fp8_conversion_found)."""
    problems, warnings = fp8_conversion_found(spec, engine)
    return tuple(problems), tuple(warnings)


@lru_cache(maxsize=None)
def check_compile(engine: str, compile: bool, fsdp_version: int, pp: int = 1, pp_schedule: str = "1F1B", tp: int = 1,
                  checkpointing: str = "none") -> Found:
    """engine.compile only where the engine, its pipeline schedule and its checkpointing compile
    (harness.plan.support.compile_problem)."""
    problem = compile_problem(engine, compile, fsdp_version, pp, pp_schedule, tp, checkpointing)
    return ((problem,), ()) if problem else OK


@lru_cache(maxsize=None)
def check_offload(engine: str, zero: int, offload_optimizer: str, offload_params: str, has_nvme_path: bool) -> Found:
    """Offload only where the engine's sharding supports it, and NVMe only with a path."""
    support = ENGINE_SUPPORT.get(engine)
    errors = []
    if support is not None:
        for state, target, table in (("offload_optimizer", offload_optimizer, support.offload_optimizer),
                                     ("offload_params", offload_params, support.offload_params)):
            if target == "none":
                continue
            stages: Optional[Tuple[int, ...]] = table.get(target, ())
            if zero not in stages:
                allowed = f"zero_stage in {', '.join(map(str, stages))}" if stages else "never"
                errors.append(f"engine={engine}: {state}={target} at zero_stage={zero} is not supported "
                              f"({allowed})")
        if support.offload_together and offload_optimizer != offload_params:
            errors.append(f"engine={engine} offloads parameters, gradients and optimizer together: "
                          f"offload_optimizer={offload_optimizer} must equal offload_params={offload_params}")
    if "nvme" in (offload_optimizer, offload_params) and not has_nvme_path:
        errors.append("offload to nvme needs layout.nvme_path")
    return tuple(errors), ()
