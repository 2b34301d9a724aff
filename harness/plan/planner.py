"""Turn a RunConfig into a Plan: validate, predict per-rank memory, FLOPs per token and MFU."""

from __future__ import annotations

from dataclasses import asdict, dataclass, is_dataclass, replace
from typing import Any, Dict, Iterable, List, Optional, Tuple

from harness.plan.flops import FlopConvention, flops_per_token, recompute_flops_per_token
from harness.plan.hardware import (ATTENTION_KERNEL_RATES, DEFAULT_ATTENTION_KERNEL, achievable_peak,
                                   attention_kernel_rates, hardware_profile)
from harness.plan.memory import Allowance, MemoryBreakdown, memory_per_rank
from harness.plan.model_spec import ModelSpec, model_spec_from_hf
from harness.plan.parallel_dims import ParallelDims
from harness.plan.peak import Peak, device_memory_gib, peak_flops
from harness.plan.records import build
from harness.plan.regime import compute_precision, fp8_gemm_speedup, mfu_by_peak
from harness.plan.support import ENGINE_SUPPORT
from harness.plan.time_model import StepTime, predict_step_time
from harness.plan.uncertainty import Band, band, regime_of
from harness.plan.utilization import hfu, mfu, tokens_per_step
from harness.plan.validate import validate

GIB = 1024**3


@dataclass(frozen=True)
class Plan:
    """One layout, judged before launch. `layout`, `cluster` and `engine` are the config objects the
    plan was made from (harness.config.schema); treat them as read-only."""

    model: Optional[ModelSpec]
    layout: Any
    cluster: Any
    engine: Any
    world_size: int
    errors: Tuple[str, ...]
    warnings: Tuple[str, ...]
    memory: Optional[MemoryBreakdown]  # None when the layout is invalid
    device_memory_bytes: Optional[int]
    device_memory_source: str  # "config", "datasheet:<accelerator>", "host/ranks" (cpu), "unknown"
    fits: Optional[bool]  # None when device memory is unknown or the layout invalid
    margin_bytes: Optional[int]  # device memory - predicted total (negative: OOM)
    flop_convention: str
    flops_per_token: Optional[float]
    hfu_flops_per_token: Optional[float]  # + activation recomputation
    tokens_per_step: int
    peak_flops_per_device: Optional[float]
    peak_flops_source: str
    tokens_per_s: Optional[float] = None
    predicted_mfu: Optional[float] = None
    predicted_hfu: Optional[float] = None
    time: Optional[StepTime] = None  # predicted step time and its breakdown (None: no hardware profile)
    time_source: str = "none"  # the hardware profile the time came from
    # where the measured tokens/s should lie around the predicted (harness.plan.uncertainty; None: no prediction)
    prediction_band: Optional[Band] = None

    @property
    def step_time_s(self) -> Optional[float]:
        return self.time.step_time_s if self.time else None

    @property
    def tflop_per_s_per_device(self) -> Optional[float]:
        """Predicted model TFLOP/s per device, as the runtime measures it: tokens/s x FLOPs per token / world."""
        return _tflops(self)

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def global_batch(self) -> int:
        return self.tokens_per_step // self.layout.seq_len if self.layout.seq_len > 0 else 0

    def mfu(self, tokens_per_s: float) -> Optional[float]:
        """MFU at a measured global throughput (None: invalid plan or unknown peak)."""
        if self.flops_per_token is None:
            return None
        return mfu(tokens_per_s, self.flops_per_token, self.peak_flops_per_device, self.world_size)

    @property
    def mfu_by_peak(self) -> Dict[str, Optional[float]]:
        """An FP8 plan's predicted MFU against the bf16 and the FP8 dense peaks (harness.plan.regime.mfu_by_peak;
        `predicted_mfu` is the FP8-peak one); empty for other precisions."""
        if self.layout.precision != "fp8" or self.tokens_per_s is None or self.flops_per_token is None:
            return {}
        accelerator = self.cluster.accelerator
        return mfu_by_peak(self.mfu_at_peak, _peak(accelerator, "bf16", None).flops,
                           _peak(accelerator, "fp8", None).flops)

    def mfu_at_peak(self, peak: Optional[float]) -> Optional[float]:
        return mfu(self.tokens_per_s, self.flops_per_token, peak, self.world_size)

    def hfu(self, tokens_per_s: float) -> Optional[float]:
        """HFU at a measured global throughput: MFU plus the recomputed FLOPs."""
        if self.flops_per_token is None or self.hfu_flops_per_token is None:
            return None
        return hfu(tokens_per_s, self.flops_per_token, self.hfu_flops_per_token - self.flops_per_token,
                   self.peak_flops_per_device, self.world_size)

    def to_dict(self) -> Dict[str, Any]:
        """JSON-serialisable: plain dicts, lists, numbers, strings, booleans and None."""
        return {
            "valid": self.valid,
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "model": self.model.to_dict() if self.model else None,
            "layout": _as_dict(self.layout),
            "cluster": _as_dict(self.cluster),
            "engine": _as_dict(self.engine),
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "tokens_per_step": self.tokens_per_step,
            "memory": self.memory.to_dict() if self.memory else None,
            "device_memory_bytes": self.device_memory_bytes,
            "device_memory_source": self.device_memory_source,
            "fits": self.fits,
            "margin_bytes": self.margin_bytes,
            "flop_convention": self.flop_convention,
            "flops_per_token": self.flops_per_token,
            "hfu_flops_per_token": self.hfu_flops_per_token,
            "peak_flop_per_s_per_device": self.peak_flops_per_device,
            "peak_flops_source": self.peak_flops_source,
            "tokens_per_s": self.tokens_per_s,
            "predicted_mfu": self.predicted_mfu,
            "predicted_hfu": self.predicted_hfu,
            "step_time_s": self.step_time_s,
            "tflop_per_s_per_device": self.tflop_per_s_per_device,
            "time": self.time.to_dict() if self.time else None,
            "time_source": self.time_source,
            "prediction_band": self.prediction_band.to_dict() if self.prediction_band else None,
        }


def _tflops(plan: "Plan") -> Optional[float]:
    if plan.tokens_per_s is None or plan.flops_per_token is None or not plan.world_size:
        return None
    return plan.tokens_per_s * plan.flops_per_token / plan.world_size / 1e12


def _as_dict(config: Any) -> Dict[str, Any]:
    return asdict(config) if is_dataclass(config) else dict(config)


_SPECS: Dict[str, List[Tuple[Dict[str, Any], ModelSpec]]] = {}
_CONVENTIONS: Dict[Tuple[str, bool], FlopConvention] = {}
_FLOPS: Dict[tuple, Tuple[ModelSpec, float, float]] = {}
_PEAKS: Dict[Tuple[str, str], Any] = {}
_ALLOWANCES: Dict[Tuple[Any, ...], Allowance] = {}
_DEVICE_MEMORY: Dict[tuple, Tuple[Optional[int], str]] = {}


def spec_for(model_cfg: Any) -> ModelSpec:
    """The ModelSpec of a ModelConfig, built once per distinct (name, hf_config)."""
    entries = _SPECS.setdefault(model_cfg.name, [])
    hf_config = model_cfg.hf_config
    for fields, spec in entries:
        if fields == hf_config:
            return spec
    spec = model_spec_from_hf(model_cfg.name, hf_config)
    entries.append((dict(hf_config), spec))
    return spec


def _flops(spec: ModelSpec, seq_len: int, convention: FlopConvention, checkpointing: str,
           profile: str) -> Tuple[float, float]:
    # (model FLOPs, + recomputation) per token, memoised per (model, seq_len, convention, checkpointing, profile)
    key = (id(spec), seq_len, convention, checkpointing, profile)
    hit = _FLOPS.get(key)
    if hit is None or hit[0] is not spec:
        model = flops_per_token(spec, seq_len, convention)
        hit = _FLOPS[key] = (spec, model,
                             model + recompute_flops_per_token(spec, seq_len, convention, checkpointing, profile))
    return hit[1], hit[2]


def clear_caches() -> None:
    """Forget every memoised spec, rule result and state breakdown (after editing a table at run time)."""
    from harness.plan import activations, hardware, states, uncertainty, validate as rules

    for cache in (_SPECS, _CONVENTIONS, _FLOPS, _PEAKS, _ALLOWANCES, _DEVICE_MEMORY, _PROFILES, states._RANK_PARAMS,
                  states._RANK_STATES, activations._TOKEN_ACTIVATIONS, hardware._LOADED):
        cache.clear()
    for rule in (rules.check_world, rules.check_tensor_parallel, rules.check_pipeline,
                 rules.check_sequence, rules.check_experts, rules.check_engine, rules.check_offload,
                 rules.check_model_init):
        rule.cache_clear()
    uncertainty.clear()
    from harness.plan import comm, compute_time, pipeline

    for memo in (activations.distinct_moments, comm.collective_time, comm.axis_group, compute_time.layer_time,
                 compute_time.outside_time, pipeline.rank_layers, pipeline.rank_stages, states.stage_kinds):
        memo.cache_clear()


def default_allowance(accelerator: str) -> Allowance:
    """10% for fragmentation and buckets; on GPUs 1 GiB more for the CUDA context and NCCL buffers."""
    return Allowance(0.10, 0 if accelerator == "cpu" else GIB)


def _device_memory(cluster: Any) -> Tuple[Optional[int], str]:
    key = (cluster.accelerator, cluster.memory_per_accelerator_gib, cluster.host_memory_gib,
           cluster.accelerators_per_node)
    hit = _DEVICE_MEMORY.get(key)
    if hit is None:
        hit = _DEVICE_MEMORY[key] = _device_memory_uncached(cluster)
    return hit


def _device_memory_uncached(cluster: Any) -> Tuple[Optional[int], str]:
    if cluster.memory_per_accelerator_gib is not None:
        return int(cluster.memory_per_accelerator_gib * GIB), "config"
    gib = device_memory_gib(cluster.accelerator)
    if gib is not None:
        return int(gib * GIB), f"datasheet:{cluster.accelerator}"
    if cluster.accelerator == "cpu" and cluster.accelerators_per_node > 0:
        return int(cluster.host_memory_gib * GIB / cluster.accelerators_per_node), "host/ranks"
    return None, "unknown"


def cluster_allowance(cluster: Any) -> Allowance:
    """The cluster's configured head-room, each part falling back to the default."""
    default = default_allowance(cluster.accelerator)
    fraction = cluster.memory_allowance_fraction
    fixed = cluster.memory_allowance_fixed_gib
    return Allowance(default.fraction if fraction is None else fraction,
                     default.fixed_bytes if fixed is None else int(fixed * GIB))


def _convention(bench: Any) -> Optional[FlopConvention]:
    """The FLOP convention the bench config names (cached), or None when it names none."""
    key = (bench.flop_attention, bench.flop_include_lm_head)
    if key not in _CONVENTIONS:
        try:
            _CONVENTIONS[key] = FlopConvention(bench.flop_attention, bool(bench.flop_include_lm_head))
        except ValueError:
            return None
    return _CONVENTIONS[key]


def _peak(accelerator: str, precision: str, measured: Optional[float]) -> Any:
    """Peak FLOP/s per device: a measured figure as given, else the datasheet table's entry (cached)."""
    if measured is not None:
        return peak_flops(accelerator, precision, measured)
    key = (accelerator, precision)
    if key not in _PEAKS:
        _PEAKS[key] = peak_flops(accelerator, precision, None)
    return _PEAKS[key]


def _allowance(cluster: Any) -> Allowance:
    """The cluster's memory allowance (cached per accelerator and allowance settings)."""
    key = (cluster.accelerator, cluster.memory_allowance_fraction, cluster.memory_allowance_fixed_gib)
    if key not in _ALLOWANCES:
        _ALLOWANCES[key] = cluster_allowance(cluster)
    return _ALLOWANCES[key]


def engine_spec(spec: ModelSpec, engine: str) -> ModelSpec:
    """The model as `engine` runs it: an engine with its own attention layer (EngineSupport.attention) runs that
    kernel whatever transformers' attn_implementation says (GPT-OSS builds in transformers with eager only)."""
    attention = ENGINE_SUPPORT[engine].attention if engine in ENGINE_SUPPORT else ""
    if not attention or spec.attn_implementation == attention:
        return spec
    # the same object for the same model: the memory and time memos key on the spec's identity
    hit = _ENGINE_SPECS.get((id(spec), attention))
    if hit is None or hit[0] is not spec:
        if len(_ENGINE_SPECS) > 64:
            _ENGINE_SPECS.clear()
        hit = _ENGINE_SPECS[(id(spec), attention)] = (spec, replace(spec, attn_implementation=attention))
    return hit[1]


_ENGINE_SPECS: Dict[tuple, Tuple[ModelSpec, ModelSpec]] = {}


def make_plan(cfg: Any, peak_flops_per_device: Optional[float] = None, tokens_per_s: Optional[float] = None,
              allowance: Optional[Allowance] = None, predict_time: bool = True) -> Plan:
    """Plan one RunConfig. `peak_flops_per_device` is a measured peak (the CPU matmul benchmark);
    without it the datasheet table is used. `tokens_per_s` (global) adds a predicted MFU / HFU."""
    layout, cluster, engine, bench = cfg.layout, cfg.cluster, cfg.engine, cfg.bench
    world = ParallelDims.of(layout).world_size
    tokens = tokens_per_step(layout.micro_batch, layout.grad_accum, layout.dp_replicate, layout.dp_shard,
                             layout.seq_len)
    convention = _convention(bench)
    try:
        spec = engine_spec(spec_for(cfg.model), engine.name)
    except (ValueError, KeyError, TypeError) as exc:
        return _invalid(cfg, None, world, tokens, [f"model {cfg.model.name!r}: {exc}"], [], convention)
    errors, warnings = validate(cfg, spec)
    peak = _peak(cluster.accelerator, layout.precision, peak_flops_per_device)
    if peak.warning:
        warnings.append(peak.warning)
    if errors or convention is None:
        return _invalid(cfg, spec, world, tokens, errors, warnings, convention, peak)
    model_flops, hardware_flops = _flops(spec, layout.seq_len, convention, layout.activation_checkpointing,
                                         ENGINE_SUPPORT[engine.name].activation_profile)
    if allowance is None:
        allowance = _allowance(cluster)
    memory = memory_per_rank(spec, layout, engine, cluster.accelerator, allowance)
    device_bytes, device_source = _device_memory(cluster)
    fits = margin = None
    if device_bytes is None:
        warnings.append(f"device memory of accelerator={cluster.accelerator!r} unknown: set "
                        "cluster.memory_per_accelerator_gib to judge fits/OOM")
    else:
        margin = device_bytes - memory.total_bytes
        fits = margin >= 0
    step, time_source, measured_peak = (_predict_time(spec, cfg, warnings) if tokens_per_s is None and predict_time
                                        else (None, "none", None))
    if step is not None:
        tokens_per_s = tokens / step.step_time_s
    peak = measured_when_missing(peak, measured_peak, time_source, warnings)
    return build(
        Plan, model=spec, layout=layout, cluster=cluster, engine=engine, world_size=world, errors=(),
        warnings=tuple(warnings), memory=memory, device_memory_bytes=device_bytes,
        device_memory_source=device_source, fits=fits, margin_bytes=margin, flop_convention=convention.name,
        flops_per_token=model_flops, hfu_flops_per_token=hardware_flops, tokens_per_step=tokens,
        peak_flops_per_device=peak.flops, peak_flops_source=peak.source, tokens_per_s=tokens_per_s,
        predicted_mfu=None if tokens_per_s is None else mfu(tokens_per_s, model_flops, peak.flops, world),
        predicted_hfu=None if tokens_per_s is None else hfu(tokens_per_s, model_flops,
                                                            hardware_flops - model_flops, peak.flops, world),
        time=step, time_source=time_source, prediction_band=band_of(cfg) if step is not None else None,
    )


_PROFILES: Dict[tuple, Any] = {}


def with_time(plan: Plan, cfg: Any) -> Plan:
    """A valid plan made with predict_time=False, completed with its predicted time, throughput and MFU."""
    warnings: List[str] = list(plan.warnings)
    step, source, measured_peak = _predict_time(plan.model, cfg, warnings)
    if step is None:
        return replace(plan, warnings=tuple(warnings))
    tokens_per_s = plan.tokens_per_step / step.step_time_s
    model, hardware = plan.flops_per_token, plan.hfu_flops_per_token
    missing = _peak(plan.cluster.accelerator, plan.layout.precision, None)
    peak = measured_when_missing(Peak(plan.peak_flops_per_device, plan.peak_flops_source, missing.warning),
                                 measured_peak, source, warnings)
    return replace(plan, time=step, time_source=source, tokens_per_s=tokens_per_s, prediction_band=band_of(cfg),
                   warnings=tuple(warnings),
                   peak_flops_per_device=peak.flops,
                   peak_flops_source=peak.source, predicted_mfu=mfu(tokens_per_s, model, peak.flops, plan.world_size),
                   predicted_hfu=hfu(tokens_per_s, model, hardware - model, peak.flops, plan.world_size))


def band_of(cfg: Any) -> Optional[Band]:
    """The band of a predicted throughput: the residuals of its engine in its regime (harness.plan.uncertainty)."""
    return band(cfg.engine.name, regime_of(cfg))


def measured_when_missing(peak: Peak, measured: Optional[float], time_source: str,
                          warnings: Optional[List[str]] = None) -> Peak:
    """A CPU has no datasheet peak: the peak its hardware profile measured stands in, named by the profile
    (whose source already reads `measured:<host>:<time>`), and the warning that MFU is not computed goes."""
    if peak.flops is None and measured:
        if warnings is not None and peak.warning in warnings:
            warnings.remove(peak.warning)
        return Peak(measured, time_source if time_source.startswith("measured:") else f"measured:{time_source}")
    return peak


def _fp8_speedup(accelerator: str, precision: str) -> float:
    """How much faster FP8 runs the converted GEMMs on this device (1 unless precision=fp8)."""
    if precision != "fp8":
        return 1.0
    return fp8_gemm_speedup(_peak(accelerator, "bf16", None).flops, _peak(accelerator, "fp8", None).flops)


def _predict_time(spec: ModelSpec, cfg: Any, warnings: List[str]) -> Tuple[Optional[StepTime], str, Optional[float]]:
    """(predicted step time, the profile it came from, the profile's measured peak) for a valid layout."""
    cluster = cfg.cluster
    kernel = getattr(cluster, "attention_kernel", DEFAULT_ATTENTION_KERNEL)
    key = (cluster.accelerator, getattr(cluster, "profile", None), cluster.accelerators_per_node,
           cluster.intra_node_gbps, cluster.inter_node_gbps, cfg.layout.precision, kernel)
    hit = _PROFILES.get(key)
    if hit is None:
        hw = hardware_profile(cluster)
        rate = achievable_peak(hw, cluster.accelerator, compute_precision(cfg.layout.precision)) if hw else None
        hit = (hw, rate)
        if hw is not None:  # a missing profile is looked for again (a calibration may write it)
            _PROFILES[key] = hit
    hw, rate = hit
    if hw is None and attention_kernel_rates(kernel, cluster.accelerator) is None:
        warnings.append(f"cluster.attention_kernel={kernel!r} has no measured rate on "
                        f"accelerator={cluster.accelerator!r}: step time not predicted (measured on "
                        f"{', '.join(sorted(ATTENTION_KERNEL_RATES.get(kernel, {}))) or 'none'})")
        return None, "none", None
    if hw is None or not rate:
        hint = ("run `harness calibrate` and set cluster.profile=host" if cluster.accelerator == "cpu"
                else "run `harness calibrate` and set cluster.profile")
        warnings.append(f"no hardware profile for accelerator={cluster.accelerator!r}: step time not predicted "
                        f"({hint})")
        return None, "none", None
    step = predict_step_time(spec, cfg.layout, cfg.engine, hw, rate, clip=cfg.bench.grad_clip > 0,
                             fp8_speedup=_fp8_speedup(cluster.accelerator, cfg.layout.precision))
    return step, hw.source, hw.measured_peak_flops


def _invalid(cfg: Any, spec: Optional[ModelSpec], world: int, tokens: int, errors: List[str],
             warnings: List[str], convention: Optional[FlopConvention], peak: Any = None) -> Plan:
    return build(
        Plan, model=spec, layout=cfg.layout, cluster=cfg.cluster, engine=cfg.engine, world_size=world,
        errors=tuple(errors) or ("invalid FLOP convention",), warnings=tuple(warnings), memory=None,
        device_memory_bytes=None, device_memory_source="unknown", fits=None, margin_bytes=None,
        flop_convention=convention.name if convention else "invalid", flops_per_token=None,
        hfu_flops_per_token=None, tokens_per_step=tokens,
        peak_flops_per_device=peak.flops if peak else None, peak_flops_source=peak.source if peak else "unknown",
        tokens_per_s=None, predicted_mfu=None, predicted_hfu=None, time=None, time_source="none",
        prediction_band=None,
    )


def _gib(value: Optional[int]) -> Optional[float]:
    return None if value is None else round(value / GIB, 2)


def plan_rows(plans: Iterable[Plan]) -> List[Dict[str, Any]]:
    """One table row per plan: the layout columns, validity, memory against the device, FLOPs, MFU."""
    rows = []
    for plan in plans:
        layout, memory = plan.layout, plan.memory
        rows.append({
            "model": plan.model.name if plan.model else None,
            "params": plan.model.total_params if plan.model else None,
            "active_params": plan.model.active_params if plan.model else None,
            "engine": plan.engine.name,
            "accelerator": plan.cluster.accelerator,
            "world": plan.world_size,
            "dp_replicate": layout.dp_replicate,
            "dp_shard": layout.dp_shard,
            "tp": layout.tp,
            "pp": layout.pp,
            "cp": layout.cp,
            "ep": layout.ep,
            "zero": layout.zero_stage,
            "offload": f"{layout.offload_optimizer}/{layout.offload_params}",
            "micro_batch": layout.micro_batch,
            "grad_accum": layout.grad_accum,
            "seq_len": layout.seq_len,
            "ckpt": layout.activation_checkpointing,
            "precision": layout.precision,
            "valid": plan.valid,
            "errors": "; ".join(plan.errors),
            "warnings": "; ".join(plan.warnings),
            "memory_per_rank(GiB)": _gib(memory.total_bytes) if memory else None,
            "states(GiB)": _gib(memory.state_bytes) if memory else None,
            "activations(GiB)": _gib(memory.activation_bytes) if memory else None,
            "device_memory(GiB)": _gib(plan.device_memory_bytes),
            "fits": plan.fits,
            "margin(GiB)": _gib(plan.margin_bytes),
            "host_per_rank(GiB)": _gib(memory.host_bytes) if memory else None,
            # six significant digits: a fixed number of decimals turns a small model's 0.000592 into 0.001
            "flops_per_token(GFLOP)": (None if plan.flops_per_token is None
                                       else float(f"{plan.flops_per_token / 1e9:.6g}")),
            "flop_convention": plan.flop_convention,
            "tokens_per_step": plan.tokens_per_step,
            "mfu": plan.predicted_mfu,
            "mfu(bf16 peak)": plan.mfu_by_peak.get("bf16_peak"),
            "peak_source": plan.peak_flops_source,
            "step_time(s)": plan.step_time_s,
            "tokens_per_s": plan.tokens_per_s,
            **band_columns(plan.prediction_band),
        })
    return rows


def band_columns(prediction_band: Optional[Band]) -> Dict[str, Any]:
    """The band of a plan's predicted tokens/s as export columns."""
    if prediction_band is None:
        return {"tokens_per_s_band": None, "band_regime": None, "band_source": None, "band_rows": None}
    return {"tokens_per_s_band": prediction_band.half_width, "band_regime": prediction_band.regime,
            "band_source": prediction_band.source, "band_rows": prediction_band.rows}
