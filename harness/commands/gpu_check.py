"""`make gpu-check`: one GPU, a few minutes. Each engine's CUDA branch at world size 1 on a ~1B Llama (DeepSpeed
ZeRO-3 with CPU offload, FSDP2 through Accelerate, nd built on the meta device) for a few steps, its losses
checked against one process and its state bytes against the plan; the time model's parts timed one at a time
(harness.commands.gpu_components); then a few shapes measured (tokens/s, MFU, peak memory) beside the time
model's prediction, and `harness calibrate`. One progress line per stage, one JSON
summary. Every stage is a `harness run` point (compose, prepare, launch, metrics.json), nothing measured or
planned twice. `--cpu` runs the same stages on a tiny model on CPU (the suite's check of this plumbing);
without a GPU it skips, in one line."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from harness.rundir import write_json

SCHEMA = "gpu-check/1"
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
# The whole check stays under 8.5 minutes of the ten a GPU machine is lent for one command: 7.5 minutes of
# stages, the rest for the wheels' install, the last reference and the summary. A stage that would start
# after the budget is skipped (named in the summary), and each run's own time limit is what the budget has
# left. On an H200 the stages took 351 s with one reference per run length; the second reference adds ~50 s.
BUDGET_S = 450
LIBRARIES = ("torch", "transformers", "accelerate", "deepspeed", "hydra-core", "omegaconf", "pydantic")


@dataclass(frozen=True)
class Stage:
    """One step of the check: `engine` (trained, checked against one process and the plan), `shape`
    (measured beside the prediction), `components` (harness.commands.gpu_components) or `calibrate`."""

    name: str
    kind: str
    overrides: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Mode:
    """What differs between the GPU check and its CPU rehearsal: the model, the cluster, the sequences."""

    name: str
    device: str
    common: Tuple[str, ...]
    shapes: Tuple[Tuple[str, Tuple[str, ...]], ...]
    accelerator: str  # the peak table's key the runs plan with
    # shapes measured on another engine than SHAPE_ENGINE (their overrides name it), after every other stage
    engine_shapes: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()


def gpu_mode(accelerator: str, host_memory_gib: float) -> Mode:
    """Llama-3.2-1B's shape (1.24e9 parameters, tied embeddings) on one GPU of this machine. The shapes
    step through micro-batch and sequence length (full checkpointing at the longest): GEMM-bound at 2k
    tokens, 8k tokens a step, and attention's share grown at 4k (predicted to fit 80 GB: `--dry-run`)."""
    common = ("model=llama3_2_1b", "cluster=gpu_h100_1x8", "cluster.name=gpu_check",
              "cluster.accelerators_per_node=1", f"cluster.accelerator={accelerator}",
              f"cluster.host_memory_gib={host_memory_gib:.0f}", "layout.seq_len=1024")
    shapes = (("seq2048_mb1", ("layout.seq_len=2048", "layout.micro_batch=1")),
              ("seq2048_mb4", ("layout.seq_len=2048", "layout.micro_batch=4")),
              ("seq4096_mb2_ckpt", ("layout.seq_len=4096", "layout.micro_batch=2",
                                    "layout.activation_checkpointing=full")))
    return Mode("gpu", "cuda", common, shapes, accelerator, DEEPSPEED_SHAPES)


def cpu_mode() -> Mode:
    """The tiny Llama with tied embeddings (as the 1B model) on one CPU process: the same stages, one shape."""
    common = ("model=tiny_llama", "model.hf_config.tie_word_embeddings=true", "cluster=cpu",
              "cluster.accelerators_per_node=1", "layout.seq_len=64")
    shapes = (("seq128_mb2_ckpt", ("layout.seq_len=128", "layout.micro_batch=2",
                                   "layout.activation_checkpointing=full")),)
    return Mode("cpu", "cpu", common, shapes, "cpu")


# Every run: one local process, no tracking, bf16, at least two warm-up steps (more until step time is steady;
# the last is where state bytes and saved activations are read) and three timed ones. Learning rate 1e-4, not
# the default 1e-3: at 1e-3 Adam moves every weight of the 1B model by 5 % of its initial scale a step and its
# loss rises (12.13 -> 12.27 in six steps on an H200), a regime where two single-process references, same seed
# and data, parted by 6e-3 at step 6 (the GPU's kernels do not sum in a fixed order): no engine can be held to them.
RUN = ("launcher=local", "tracking=disabled", "sweep_name=gpu_check", "layout.dp_shard=1", "layout.dp_replicate=1",
       "layout.micro_batch=1", "layout.grad_accum=2", "layout.precision=bf16", "bench.warmup_steps=2",
       "bench.steps=3", "bench.lr=1e-4")
# The engines' CUDA branches at world size 1. DeepSpeed keeps its states on the host and steps them with
# torch's AdamW (engine.compiled_ops=false: no compiler needed on the machine); FSDP2 goes through
# `accelerate launch` (fully_shard over one rank); nd builds on the meta device and materialises it.
ENGINES = (
    Stage("deepspeed_zero3_offload", "engine", ("engine=deepspeed", "layout.name=zero3_offload", "layout.zero_stage=3",
                                                "layout.offload_optimizer=cpu", "layout.offload_params=cpu",
                                                "engine.compiled_ops=false", "model.init=full")),
    Stage("fsdp2", "engine", ("engine=fsdp", "engine.fsdp_version=2", "layout.name=fsdp2", "layout.zero_stage=3",
                              "model.init=full")),
    Stage("nd_meta", "engine", ("engine=nd", "layout.name=nd_meta", "layout.zero_stage=3", "model.init=meta")),
)  # fmt: skip
# Shapes are measured on nd: at world size 1 the model itself under bf16 autocast, fp32 weights and AdamW
# (nd wraps nothing when every data axis has size 1), the least engine machinery between model and GPU.
SHAPE_ENGINE = ("engine=nd", "layout.zero_stage=3", "model.init=full", "layout.grad_accum=1", "bench.steps=5")
# DeepSpeed ZeRO-3 at the device-bound shape of nd's shape_seq2048_mb4, its states on the GPU: at world size 1 its
# gathers and reduce-scatters move nothing, while its hooks, its parameter coordinator (which lets the host run at
# most a few fetches ahead of the device) and its bf16 weights all run. Published ZeRO-3 runs on one node miss the
# model by 15-35%, a gap that shrinks with the tokens of a micro-batch, not with the traffic
# (tests/data/flagperf_deepspeed_bf16.csv): this run says how much of it is DeepSpeed's own at no traffic. Last,
# so that it never takes an earlier stage's budget.
DEEPSPEED_SHAPES = (("deepspeed_zero3_seq2048_mb4",
                     ("engine=deepspeed", "layout.zero_stage=3", "engine.compiled_ops=false", "model.init=full",
                      "layout.grad_accum=1", "bench.steps=5", "layout.seq_len=2048", "layout.micro_batch=4")),)


def stages(mode: Mode) -> List[Stage]:
    shapes = [Stage(f"shape_{name}", "shape", (*SHAPE_ENGINE, f"layout.name={name}", *extra))
              for name, extra in mode.shapes]
    others = [Stage(name, "shape", (f"layout.name={name}", *overrides)) for name, overrides in mode.engine_shapes]
    return [*ENGINES, Stage("components", "components"), *shapes, Stage("calibrate", "calibrate"), *others]


def stage_overrides(mode: Mode, stage: Stage, results: Path, timeout_s: int) -> List[str]:
    return [*RUN, *mode.common, *stage.overrides, f"results_dir={results}", f"launcher.timeout_s={timeout_s}"]


# --- one stage ------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a stage leaves in the summary."""

    name: str
    kind: str
    status: str = PASSED
    reason: str = ""
    wall_s: float = 0.0
    run_dir: str = ""
    checks: Dict[str, Any] = field(default_factory=dict)
    predicted: Dict[str, Any] = field(default_factory=dict)
    measured: Dict[str, Any] = field(default_factory=dict)
    measured_over_predicted: Dict[str, Optional[float]] = field(default_factory=dict)

    def fail(self, reason: str) -> None:
        self.status = FAILED
        self.reason = "; ".join(filter(None, (self.reason, reason)))


def prepare_stage(overrides: Sequence[str], run_dir: Path):
    """The composed, planned, rendered point (RunRejected names what the plan or engine refused)."""
    from harness.config.compose import compose_run_config
    from harness.launch.prepare import prepare_run

    return prepare_run(compose_run_config(list(overrides)), run_dir)


def launch_stage(prepared, run_dir: Path, say: Callable[[str], None]) -> Tuple[str, str, Dict[str, Any]]:
    """(final state, reason, metrics.json) of one prepared point run here, rank 0's step lines printed."""
    from harness.launch.run import run_prepared
    from harness.rundir import METRICS_FILE, load_json

    state, reason = run_prepared(run_dir, prepared.cfg, prepared.rendered, label=run_dir.name, say=say)
    return state, reason, load_json(run_dir / METRICS_FILE) or {}


def planned_state_bytes(cfg, predicted: Dict[str, Any], rank: int) -> Dict[str, int]:
    """The plan's bytes for one rank: nd plans every rank (stages and shards differ); FSDP and DeepSpeed
    split evenly, so the plan's one figure."""
    from harness.engines import nd_plans

    if cfg.engine.name == "nd":
        return nd_plans.predicted_state_bytes(cfg.model.hf_config, cfg.layout, rank)
    return {key: predicted[key] for key in ("param_bytes", "grad_bytes", "optimizer_bytes", "host_bytes")}


def state_bytes_check(cfg, metrics: Dict[str, Any]) -> Tuple[bool, Dict[str, Any]]:
    """Every rank's measured state bytes equal to the plan's, exactly."""
    rows, ok = {}, True
    for record in metrics["measured"]["per_rank"]:
        planned = planned_state_bytes(cfg, metrics["predicted"], record["rank"])
        measured = {key: record.get(key, 0) for key in planned}
        ok = ok and measured == planned
        rows[str(record["rank"])] = {"planned": planned, "measured": measured}
    return ok, rows


# A run's loss may stray from the reference by the engine's tolerance plus this many times the reference's
# own spread: the run is one more draw of the same non-repeating sums, and the spread seen between two
# references is one sample of how far such draws part.
REPEAT_MARGIN = 2.0


class References:
    """Single-process reference losses, computed once per (layout, steps) on the runs' own device. On a GPU
    twice: its kernels (split-K GEMMs, attention's backward) do not add in a fixed order, so the reference does
    not repeat itself exactly, and how far the two part bounds what a run can be held to (CPU kernels repeat)."""

    def __init__(self, device: str):
        self.device, self.cache = device, {}

    def losses(self, cfg, n_steps: int) -> List[float]:
        return self._pair(cfg, n_steps)[0]

    def spread(self, cfg, n_steps: int) -> List[float]:
        """Per step, the largest relative distance between the two references up to that step (0 on CPU)."""
        first, second = self._pair(cfg, n_steps)
        parted = [abs(a - b) / abs(a) for a, b in zip(first, second)]
        return [max(parted[:i + 1]) for i in range(len(parted))]

    def _pair(self, cfg, n_steps: int) -> Tuple[List[float], List[float]]:
        """Both references over the most steps a run can take (its warm-up grows until step time is steady), so
        runs of other lengths share them: step i's loss does not depend on how many steps follow."""
        layout = cfg.layout
        key = (layout.micro_batch, layout.grad_accum, layout.seq_len, layout.precision)
        if key not in self.cache or len(self.cache[key][0]) < n_steps:
            most = max(n_steps, cfg.bench.warmup_max_steps + cfg.bench.steps)
            first = self._compute(cfg, most)
            self.cache[key] = (first, self._compute(cfg, most) if self.device == "cuda" else first)
        first, second = self.cache[key]
        return first[:n_steps], second[:n_steps]

    def _compute(self, cfg, n_steps: int) -> List[float]:
        import torch

        from harness.runtime.reference import reference_precision, single_process_losses

        layout = cfg.layout
        losses, model = single_process_losses(cfg, cfg.model.hf_config, layout.micro_batch, layout.grad_accum,
                                              n_steps, bf16=reference_precision(layout.precision) == "bf16",
                                              device=self.device)
        del model
        if self.device == "cuda":
            torch.cuda.empty_cache()  # the next run's allocator peak is its own
        return losses


def loss_check(cfg, model_init: str, losses: List[float], references: References) -> Tuple[bool, Dict[str, Any]]:
    """A full build trains as one process does (the engine's bf16 tolerance); a sharded (meta) build draws
    other weights, so it is held to an initialised model's losses on uniform tokens."""
    from harness.runtime.reference import META_INIT_RTOL, initialised_loss_band, loss_rtol

    if not losses or not all(math.isfinite(x) for x in losses):
        return False, {"losses": losses, "rule": "finite losses"}
    if model_init == "meta":
        low, high = initialised_loss_band(cfg.model.hf_config)
        # how far each loss lies outside [low, high], relative to the bound it passed
        error = max(max(low - x, 0.0) / low + max(x - high, 0.0) / high for x in losses)
        return error <= META_INIT_RTOL, {"rule": "initialised model", "rtol": META_INIT_RTOL, "max_rel_error": error,
                                         "losses": losses, "reference": [low, high]}
    want, spread = references.losses(cfg, len(losses)), references.spread(cfg, len(losses))
    rtol = loss_rtol(cfg)
    errors = [abs(a - b) / abs(b) for a, b in zip(losses, want)]
    ok = all(error <= rtol + REPEAT_MARGIN * parted for error, parted in zip(errors, spread))
    return ok, {"rule": "single process", "rtol": rtol, "max_rel_error": max(errors), "losses": losses,
                "reference": want, "reference_spread": spread, "repeat_margin": REPEAT_MARGIN}


PREDICTED_KEYS = ("step_time_s", "tokens_per_s", "mfu", "total_bytes", "state_activation_bytes")
MEASURED_KEYS = ("step_time_s", "tokens_per_s", "mfu", "peak_allocated_bytes", "state_activation_bytes")


def side_by_side(metrics: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(predicted, measured) in the keys the table prints. Memory: the plan's total per rank against the
    CUDA allocator's peak (None on CPU), and parameters + gradients + optimizer + saved activations, which
    both sides count exactly."""
    from harness.rundir import Measured, Predicted

    predicted, measured = Predicted.from_dict(metrics.get("predicted")), Measured.from_dict(metrics["measured"])
    device_bytes = measured.param_bytes + measured.grad_bytes + measured.optimizer_bytes + measured.activation_bytes
    values = {**measured.to_dict(), "state_activation_bytes": device_bytes}
    shown = {**{key: getattr(predicted, key) for key in PREDICTED_KEYS},
             "tokens_per_s_band": predicted.tokens_per_s_band}
    return shown, {key: values[key] for key in MEASURED_KEYS}


def ratios(predicted: Dict[str, Any], measured: Dict[str, Any]) -> Dict[str, Optional[float]]:
    """Measured / predicted per column of the table (None where either side is missing): the time model's
    error at this point, in the summary."""
    return {m: (measured[m] / predicted[p] if measured.get(m) is not None and predicted.get(p) else None)
            for p, m in zip(PREDICTED_KEYS, MEASURED_KEYS)}


def run_stage(stage: Stage, overrides: Sequence[str], run_dir: Path, references: References,
              say: Callable[[str], None]) -> Outcome:
    """Plan, launch and check one engine or shape point."""
    from harness.launch.prepare import RunRejected
    from harness.rundir import PLAN_FILE, load_json

    outcome = Outcome(stage.name, stage.kind, run_dir=str(run_dir))
    try:
        prepared = prepare_stage(overrides, run_dir)
    except RunRejected as error:
        outcome.fail(str(error).replace("\n", " "))
        return outcome
    state, reason, metrics = launch_stage(prepared, run_dir, say)
    if state != "COMPLETED" or "measured" not in metrics:
        outcome.fail(f"{state} {reason}".strip())
        return outcome
    outcome.predicted, outcome.measured = side_by_side(metrics)
    outcome.measured_over_predicted = ratios(outcome.predicted, outcome.measured)
    if stage.kind == "engine":
        model_init = (load_json(run_dir / PLAN_FILE) or {}).get("model_init", "full")
        bytes_ok, outcome.checks["state_bytes"] = state_bytes_check(prepared.cfg, metrics)
        loss_ok, outcome.checks["loss"] = loss_check(prepared.cfg, model_init, metrics["measured"]["losses"],
                                                     references)
        if not bytes_ok:
            outcome.fail("state bytes differ from the plan")
        if not loss_ok:
            outcome.fail(f"losses off the {outcome.checks['loss']['rule']} reference")
    return outcome


def run_tool(outcome: Outcome, what: str, command: Sequence[str], out: Path, timeout_s: int) -> Optional[Dict]:
    """Run a stage's own process; the JSON file it writes, or None with the outcome failed and why."""
    try:
        proc = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        outcome.fail(f"{what} ran past {timeout_s} s")
        return None
    if proc.returncode != 0 or not out.exists():
        outcome.fail(f"{what} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        return None
    return json.loads(out.read_text())


def run_calibrate(out: Path, timeout_s: int) -> Outcome:
    """`harness calibrate` on this machine (one rank), as a user runs it; its profile kept beside the runs."""
    outcome = Outcome("calibrate", "calibrate", run_dir=str(out.parent))
    command = [sys.executable, "-m", "harness.cli", "calibrate", "--ranks", "1", "--name", "gpu_check",
               "--out", str(out)]
    profile = run_tool(outcome, "harness calibrate", command, out, timeout_s)
    if profile is not None:
        outcome.measured = {key: profile.get(key) for key in ("measured_peak_flops", "matmul_efficiency",
                                                              "memory_bandwidth", "op_latency_s",
                                                              "cpu_adam_params_per_s", "version")}
    return outcome


def run_components(mode: Mode, out: Path, timeout_s: int) -> Outcome:
    """The time model's parts measured one at a time (harness.commands.gpu_components) in a process of its own;
    the per-part errors in the summary, every timing in its JSON file."""
    outcome = Outcome("components", "components", run_dir=str(out.parent))
    command = [sys.executable, "-m", "harness.commands.gpu_components", "--out", str(out),
               *(["--cpu"] if mode.device == "cpu" else [])]
    found = run_tool(outcome, "gpu_components", command, out, timeout_s)
    if found is not None:
        outcome.measured = found["summary"]
    return outcome


# --- the whole check ------------------------------------------------------------------------------------


def versions() -> Dict[str, Optional[str]]:
    found = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def version_line(found: Dict[str, Optional[str]], pinned: Dict[str, str]) -> str:
    """The libraries this machine has, each with the version the harness is tested with where it differs."""
    def one(name: str) -> str:
        tested = pinned.get(name)
        differs = tested and found[name] and found[name].split("+")[0] != tested
        return f"{name} {found[name] or 'missing'}" + (f" (tested {tested})" if differs else "")

    return "[gpu-check] " + ", ".join(one(name) for name in found)


def device_facts(mode: Mode) -> Dict[str, Any]:
    import torch

    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "count": 0, "name": None,
             "accelerator": mode.accelerator}
    if mode.device == "cuda":
        facts.update(count=torch.cuda.device_count(), name=torch.cuda.get_device_name(0))
    return facts


def runs_folder(out_dir: Path) -> Path:
    """This invocation's run directories (a new folder each time: an earlier check's runs stay as they were)."""
    return out_dir / "runs" / time.strftime("%Y%m%d-%H%M%S")


def check_stages(mode: Mode, runs: Path, budget_s: float, say: Callable[[str], None],
                 only: Sequence[str] = ()) -> List[Outcome]:
    """Every stage in order (or those named), each announced and concluded on one line; one that fails
    does not stop the rest."""
    plan = [stage for stage in stages(mode) if not only or stage.name in only]
    references, start, outcomes = References(mode.device), time.monotonic(), []
    for index, stage in enumerate(plan, 1):
        tag = f"[gpu-check {index}/{len(plan)}] {stage.kind} {stage.name}"
        left = budget_s - (time.monotonic() - start)
        if left < 1:
            outcomes.append(Outcome(stage.name, stage.kind, SKIPPED, f"time budget of {budget_s:.0f} s spent"))
            say(f"{tag}: {SKIPPED} (time budget spent)")
            continue
        say(f"{tag}: started ({left:.0f} s of the budget left)")
        began = time.monotonic()
        outcome = guarded(stage, lambda: (run_calibrate(runs / "calibrate" / "profile.json", int(left))
                                          if stage.kind == "calibrate" else
                                          run_components(mode, runs / "components" / "components.json", int(left))
                                          if stage.kind == "components" else
                                          run_stage(stage, stage_overrides(mode, stage, runs, int(left)),
                                                    runs / stage.name, references, say)))
        outcome.wall_s = round(time.monotonic() - began, 1)
        say(f"{tag}: {outcome.status} in {outcome.wall_s:.0f} s{conclusion(outcome)}")
        outcomes.append(outcome)
    return outcomes


def guarded(stage: Stage, body: Callable[[], Outcome]) -> Outcome:
    """A stage's own outcome, or a failed one naming the exception: the other stages still run."""
    try:
        return body()
    except Exception as error:  # noqa: BLE001 - the summary names it; the next stage still runs
        outcome = Outcome(stage.name, stage.kind)
        outcome.fail(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        return outcome


def conclusion(outcome: Outcome) -> str:
    if outcome.status != PASSED:
        return f": {outcome.reason}"
    loss = outcome.checks.get("loss")
    if loss:
        spread = max(loss.get("reference_spread") or [0.0])
        repeat = f" + {loss['repeat_margin']:g} x the reference's own spread {spread:.1e}" if spread else ""
        return (f" (losses within {loss['rtol']:g}{repeat} of {loss['rule']}: {loss['max_rel_error']:.2e}; "
                "state bytes as planned)")
    return ""


def fmt(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "MiB":
        return f"{value / 2**20:,.1f}"
    if unit == "%":
        return f"{100 * value:.1f}"
    if unit == "ms":
        return f"{1e3 * value:.1f}"
    return f"{value:,.0f}"


def comparison_lines(outcomes: Sequence[Outcome]) -> List[str]:
    """Predicted beside measured for every run that measured: step time, tokens/s, MFU, memory."""
    columns = (("step ms", "step_time_s", "step_time_s", "ms"), ("tokens/s", "tokens_per_s", "tokens_per_s", ""),
               ("MFU %", "mfu", "mfu", "%"), ("mem MiB", "total_bytes", "peak_allocated_bytes", "MiB"),
               ("state+act MiB", "state_activation_bytes", "state_activation_bytes", "MiB"))
    header = f"{'run':<28}" + "".join(f"{name + ' pred/meas':>26}" for name, *_ in columns) + f"{'tokens/s band':>20}"
    lines = [header]
    for outcome in outcomes:
        if outcome.measured and outcome.predicted:  # calibrate and components measure, predicting nothing
            cells = [f"{fmt(outcome.predicted.get(p), unit)} / {fmt(outcome.measured.get(m), unit)}"
                     for _, p, m, unit in columns]
            lines.append(f"{outcome.name:<28}" + "".join(f"{cell:>26}" for cell in cells)
                         + f"{band_cell(outcome.predicted, outcome.measured):>20}")
    return lines


def band_cell(predicted: Dict[str, Any], measured: Dict[str, Any]) -> str:
    """The predicted tokens/s band and where the measurement fell: `±41% inside` (harness.plan.uncertainty)."""
    from harness.plan.uncertainty import versus_band
    from harness.rundir.vocabulary import format_band

    width = predicted.get("tokens_per_s_band")
    verdict = versus_band(predicted.get("tokens_per_s"), measured.get("tokens_per_s"), width)
    return " ".join(filter(None, (format_band(width), verdict)))


def summary(mode: Mode, outcomes: Sequence[Outcome], wall_s: float, budget_s: float) -> Dict[str, Any]:
    from harness.doctor import pinned_versions

    failed = [o.name for o in outcomes if o.status == FAILED]
    skipped = [o.name for o in outcomes if o.status == SKIPPED]
    status = FAILED if failed or skipped else PASSED
    reason = "; ".join(filter(None, (f"failed: {', '.join(failed)}" if failed else "",
                                     f"skipped: {', '.join(skipped)}" if skipped else "")))
    return {"schema": SCHEMA, "mode": mode.name, "status": status, "reason": reason, "device": device_facts(mode),
            "versions": versions(), "tested_with": pinned_versions(), "budget_s": budget_s,
            "wall_s": round(wall_s, 1), "stages": [o.__dict__ for o in outcomes],
            "comparison": comparison_lines(outcomes)}


def skip_reason() -> Optional[str]:
    """Why the GPU check cannot run here (one line), or None when a CUDA device is visible."""
    try:
        import torch
    except ImportError as error:
        return f"torch cannot be imported ({error})"
    if not torch.cuda.is_available():
        return f"no CUDA device visible to torch {torch.__version__} (CUDA build {torch.version.cuda})"
    return None


def gpu_mode_here() -> Mode:
    """The GPU mode for this machine's first GPU and host memory (the peak table's key for its name)."""
    import psutil
    import torch

    from harness.doctor import accelerator_key

    name = torch.cuda.get_device_name(0)
    key = accelerator_key(name)
    if key is None:
        raise SystemExit(f"gpu-check: {name!r} has no row in harness/plan/peak.py; nothing was run")
    return gpu_mode(key, psutil.virtual_memory().total / 2**30)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.commands.gpu_check", description=__doc__)
    parser.add_argument("--cpu", action="store_true", help="the same stages on a tiny model on CPU")
    parser.add_argument("--out", default="results/gpu_check", help="folder for the runs and summary.json")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="seconds for all stages")
    parser.add_argument("--dry-run", action="store_true", help="compose, plan and render every run; launch none")
    parser.add_argument("--only", default="", help="comma-separated stage names (default: all)")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] = ()) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out).resolve()
    summary_file = out_dir / "summary.json"
    os.environ.setdefault("WANDB_MODE", "disabled")
    if not args.cpu and not args.dry_run:
        reason = skip_reason()
        if reason:
            print(f"gpu-check: {SKIPPED}: {reason}; nothing was run (--cpu rehearses it on CPU)", flush=True)
            write_json(summary_file, {"schema": SCHEMA, "mode": "gpu", "status": SKIPPED, "reason": reason,
                                      "versions": versions(), "stages": []})
            return 0
    mode = cpu_mode() if args.cpu else (gpu_mode_here() if not args.dry_run else gpu_mode("h100_sxm", 128))
    if args.dry_run:
        return dry_run(mode, out_dir)
    only = [name for name in args.only.split(",") if name]
    unknown = sorted(set(only) - {stage.name for stage in stages(mode)})
    if unknown:
        print(f"gpu-check: --only={args.only}: no stage named {', '.join(unknown)} (stages: "
              f"{', '.join(stage.name for stage in stages(mode))})", file=sys.stderr)
        return 2
    from harness.doctor import pinned_versions

    print(version_line(versions(), pinned_versions()), flush=True)
    start = time.monotonic()
    outcomes = check_stages(mode, runs_folder(out_dir), args.budget_s, lambda line: print(line, flush=True), only)
    result = summary(mode, outcomes, time.monotonic() - start, args.budget_s)
    write_json(summary_file, result)
    print("\n".join(["", "predicted / measured per rank (mem: the plan's total against the CUDA allocator's peak; "
                     "state+act: parameters, gradients, optimizer state and saved activations):",
                     *result["comparison"], f"gpu-check: {result['status']}"
                     f"{': ' + result['reason'] if result['reason'] else ''}; summary: {summary_file}"]), flush=True)
    return 0 if result["status"] == PASSED else 1


def dry_run(mode: Mode, out_dir: Path) -> int:
    """Every run point composed, planned (fit on the device) and rendered, without launching: the check's
    configs proven on a machine without the GPU."""
    from harness.launch.prepare import RunRejected

    problems, runs = [], runs_folder(out_dir)
    for stage in stages(mode):
        if stage.kind in ("calibrate", "components"):
            continue
        try:
            prepared = prepare_stage(stage_overrides(mode, stage, runs, 60), runs / stage.name)
            plan = prepared.plan
            print(f"[gpu-check dry-run] {stage.name}: {plan.memory.total_bytes / 2**30:.2f} GiB per rank of "
                  f"{plan.device_memory_bytes / 2**30:.0f}, step {plan.step_time_s:.3f} s predicted", flush=True)
        except RunRejected as error:
            problems.append(f"{stage.name}: {error}")
            print(f"[gpu-check dry-run] {stage.name}: refused: {error}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
