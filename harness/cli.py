"""`harness run | plan | sweep | report`: the command line the Makefile drives."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import List, Optional, Tuple

USAGE = """usage: harness COMMAND [hydra overrides...]

  run     compose one config (or a Hydra -m grid), plan, render, launch, measure; prints the summary
          (launcher=slurm*: submitted to Slurm and followed; [--no-wait] [--poll=SECONDS])
  plan    predict memory / FLOPs / validity for one layout or a grid (no launch)
          [--why] every message, [--json | --csv] every column; layout.dp_shard=-1 fills the world
  sweep   run a grid: [sweep=<hydra_configs/sweep/NAME>] [multirun overrides] [launcher=slurm_local]
          [--dry-run] [--submit-pruned]; `sweep status|resume|cancel DIR` follow or mend one
  report  sweep dir(s) -> summary.csv/.parquet, report.html, W&B report spec (several dirs: compare)
  recommend  rank every layout of a model on a cluster by predicted tokens/s: --global-batch SEQS
          [--top K] [--name NAME] [--no-write] overrides; writes a sweep preset of the top K
  calibrate  measure this host (or a cluster) into a hardware profile: [--ranks N] [--out PATH]
             [--slurm --nodes N --tasks-per-node K: one Slurm job across nodes]
  doctor  environment facts, PASS / WARN per line (versions, CUDA / NCCL, GPUs, DeepSpeed ops, Slurm, W&B)
  sync    upload the offline W&B runs below sweep / run dirs (`wandb sync`; --dry-run lists them)

examples:
  harness run recipes=cpu_zero2
  harness run recipes=cpu_zero2 layout.zero_stage=3 --cfg job
  harness run recipes=gpu_llama70b_nd_tp8_pp4 standin=cpu   (the GPU recipe's CPU stand-in; overrides
          after standin=cpu apply to the stand-in, e.g. launcher=local)
  harness plan model=llama3_1_70b cluster=h100_8x8 layout.tp=8 layout.pp=4 layout.dp_shard=2
"""

_failed_runs: List[str] = []
# `harness run` on a Slurm backend: wait for the job (or only submit it) and how often to look.
_run_options = {"wait": True, "poll_s": None}
# The shell's code for a command ended by SIGINT (128 + 2); SIGTERM ends `run` and `sweep` the same way.
INTERRUPTED = 130


def _run_task(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig

    from harness.config.compose import to_run_config
    from harness.launch.prepare import RunRejected, prepare_run

    run = to_run_config(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        prepared = prepare_run(run, run_dir)
    except RunRejected as error:
        print(f"{run_dir.name}: {error}", file=sys.stderr)
        _failed_runs.append(run_dir.name)
        return
    run_dir = _follow_claim(cfg, prepared.run_dir)
    if run.standin.of:
        from harness.config.standin import standin_banner

        say(standin_banner(run.standin.of, run.standin.not_executed))
    try:
        state, _ = _launch(run_dir, prepared)
    except KeyboardInterrupt:  # the point is CANCELLED by now; the summary still covers it
        _failed_runs.append(run_dir.name)
        _write_summary(run_dir.parent)
        raise
    if state != "COMPLETED" and (_run_options["wait"] or state not in ("PENDING", "RUNNING")):
        _failed_runs.append(run_dir.name)
    _write_summary(run_dir.parent)


def _follow_claim(cfg, run_dir: Path) -> Path:
    """Hydra's record of this composition (.hydra/) and the cli.log handler go to the run directory this
    process claimed (another `harness run` may have claimed the folder Hydra composed, in the same second)."""
    import logging

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hydra = HydraConfig.get()
    if hydra.output_subdir is not None:
        record = run_dir / hydra.output_subdir
        record.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, record / "config.yaml", resolve=False)
        OmegaConf.save(OmegaConf.create({"hydra": hydra}), record / "hydra.yaml", resolve=False)
        OmegaConf.save(OmegaConf.create(list(hydra.overrides.task)), record / "overrides.yaml")
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent != run_dir:
            handler.close()
            handler.baseFilename = str(run_dir / Path(handler.baseFilename).name)
            handler.stream = handler._open()
    return run_dir


def _launch(run_dir: Path, prepared) -> Tuple[str, str]:
    """One prepared point: on this machine, or (launcher.backend=slurm) submitted and followed."""
    from hydra.core.hydra_config import HydraConfig

    from harness.launch.run import run_prepared
    from harness.launch.slurm_run import run_on_slurm
    from harness.launch.sweep import POLL_S

    if prepared.cfg.launcher.backend != "slurm":
        return run_prepared(run_dir, prepared.cfg, prepared.rendered, label=str(run_dir), say=say)
    overrides = list(HydraConfig.get().overrides.task)
    state, reason = run_on_slurm(run_dir, prepared.cfg, prepared.rendered, _run_options["wait"],
                                 _run_options["poll_s"] or POLL_S, overrides, say=say)
    if _run_options["wait"]:
        say(f"[harness] {run_dir.name}: {state} {reason}".rstrip())
    return state, reason


def _write_summary(sweep_dir: Path) -> None:
    """The sweep's table and reports are rebuilt after every run, so a partial sweep is readable too."""
    from harness.report.build import build_report
    from harness.report.table import print_table, summary_frame

    frame = summary_frame([sweep_dir])
    paths = build_report([sweep_dir], sweep_dir, frame=frame)
    print_table(frame, title=str(sweep_dir))
    say(f"[harness] summary: {paths['csv']}\n[harness] report: {paths['html']}")


def say(text: str) -> None:
    """A line on the console and in the run's cli.log (Hydra's file handler, without its console twin)."""
    import logging

    print(text, flush=True)
    record = logging.LogRecord("harness", logging.INFO, __file__, 0, text, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


# Hydra flags that take a value; argparse wants all flags before the overrides.
_VALUED_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                 "--config-dir", "-cd", "--experimental-rerun", "--info", "-i"}


def split_hydra_flags(args: List[str]) -> Tuple[List[str], List[str]]:
    """Hydra's flags (in order, with their values) apart from overrides, wherever the user put them."""
    flags, overrides, index = [], [], 0
    while index < len(args):
        token = args[index]
        if token.startswith("-") and "=" not in token:
            flags.append(token)
            takes_value = token in _VALUED_FLAGS and index + 1 < len(args) and "=" not in args[index + 1]
            if takes_value:
                flags.append(args[index + 1])
                index += 1
        else:
            overrides.append(token)
        index += 1
    return flags, overrides


COMMAND_USAGE = {
    "run": "usage: harness run [hydra overrides...] [-m] [--cfg job|hydra|all] [--no-wait] [--poll=SECONDS]\n\n"
           "  Compose one config (or, with -m, a Hydra grid), plan, render and launch each point: on this\n"
           "  machine (launcher=local), or submitted as a Slurm job (launcher=slurm*) and followed until it\n"
           "  ends (Ctrl-C cancels the job; --no-wait only submits; `harness sweep status DIR` follows).",
    "plan": "usage: harness plan [hydra overrides...]   (comma lists expand to a grid)\n\n"
            "  Predict memory, FLOPs and validity per layout; nothing is launched. Exit 1 if any is refused.",
    "report": "usage: harness report [SWEEP_DIR ...]\n\n"
              "  Build summary.csv/.parquet, report.html and the W&B report spec (newest sweep by default).",
}


def check_points(command: str, flags: List[str], overrides: List[str]) -> bool:
    """Compose and check every point before anything is written; one line per refusal on stderr."""
    from harness.config.compose import compose_run_config
    from harness.config.errors import explain
    from harness.config.grid import expand_grid

    try:
        points = expand_grid(overrides) if {"-m", "--multirun"} & set(flags) else [overrides]
        for point in points:
            compose_run_config(point)
    except Exception as error:  # every composition and value error becomes one line
        print(f"harness {command}: {explain(error)}", file=sys.stderr)
        return False
    _grid_points[:] = points
    return True


# The points of a `harness run -m` grid, in Hydra's order: their directory names are those of
# `harness sweep` (the values that differ, harness.config.naming.point_names), not the layout preset's.
_grid_points: List[List[str]] = []
POINT_NAME_RESOLVER = "harness_point_name"
POINT_SUBDIR = f"hydra.sweep.subdir='${{{POINT_NAME_RESOLVER}:${{hydra.job.num}},${{engine.name}}-${{layout.name}}}}'"


def _point_name(num: int, default: str) -> str:
    from harness.config.naming import point_names

    return point_names(_grid_points, [default] * len(_grid_points))[int(num)]


def _take_run_options(args: List[str]) -> List[str]:
    """--no-wait (submit a Slurm run and return) and --poll=SECONDS; the rest is Hydra's."""
    rest = []
    for arg in args:
        if arg == "--no-wait":
            _run_options["wait"] = False
        elif arg.startswith("--poll="):
            _run_options["poll_s"] = float(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return rest


def standin_point(flags: List[str], overrides: List[str]) -> Optional[List[str]]:
    """`standin=cpu` expanded before Hydra composes the run (Hydra's own grid cannot expand it per point)."""
    from harness.config.compose import STANDIN_KEY, expand_standin

    if not any(text.split("=", 1)[0] == STANDIN_KEY for text in overrides):
        return overrides
    if {"-m", "--multirun"} & set(flags):
        print("harness run: standin=cpu stands in for one recipe; run a grid of stand-ins with "
              "`harness sweep ... standin=cpu`", file=sys.stderr)
        return None
    return expand_standin(overrides)


def run_command(args: List[str]) -> int:
    import hydra

    from harness.config.compose import CONFIG_DIR, PRIMARY_CONFIG, SEARCHPATH_OVERRIDE, register_schemas

    register_schemas()
    args = _take_run_options(args)
    flags, overrides = split_hydra_flags(args)
    # Hydra creates the run directory before the task runs: refuse bad input before Hydra starts.
    if not check_points("run", flags, overrides):
        return 2
    overrides = standin_point(flags, overrides)
    if overrides is None:
        return 2
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver(POINT_NAME_RESOLVER, _point_name, replace=True)
    sys.argv = ["harness run", *flags, SEARCHPATH_OVERRIDE, POINT_SUBDIR, *overrides]
    try:
        hydra.main(config_path=str(CONFIG_DIR), config_name=PRIMARY_CONFIG, version_base="1.3")(_run_task)()
    except KeyboardInterrupt:
        print(f"[harness] interrupted: {', '.join(_failed_runs) or 'nothing'} cancelled", file=sys.stderr)
        return INTERRUPTED
    if _failed_runs:
        print(f"[harness] not completed: {', '.join(_failed_runs)}", file=sys.stderr)
        return 1
    return 0


def plan_command(args: List[str]) -> int:
    from harness.report.plan_view import plan_main

    # Flags (--why, --json, --csv) are the plan view's; every other argument is an override.
    if not check_points("plan", ["-m"], [arg for arg in args if not arg.startswith("-")]):
        return 2
    return plan_main(args)


def sweep_command(args: List[str]) -> int:
    from harness.commands.sweep import main as sweep_main

    try:
        return sweep_main(args)
    except KeyboardInterrupt:
        print("[harness] interrupted: the running point was cancelled, the summary written", file=sys.stderr)
        return INTERRUPTED


def report_command(args: List[str]) -> int:
    from harness.report.build import report_main

    roots = [Path(arg) for arg in args] or [_newest_sweep(Path("results"))]
    return report_main(roots)


def _newest_sweep(results: Path) -> Path:
    candidates = sorted((p for p in results.glob("*/*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise SystemExit(f"no sweep under {results}/: run `make recipe` first or pass a directory")
    return candidates[-1]


def sync_command(args: List[str]) -> int:
    from harness.report.wandb_sync import sync_main

    return sync_main(args)


def doctor_command(args: List[str]) -> int:
    from harness.doctor import doctor_main

    return doctor_main(args)


def recommend_command(args: List[str]) -> int:
    from harness.launch.recommend import recommend_main

    return recommend_main(args)


def calibrate_command(args: List[str]) -> int:
    if "--slurm" in args:  # submitted from a login node: no torch here
        from harness.launch.calibrate_slurm import main as calibrate_slurm_main

        return calibrate_slurm_main(args)
    from harness.runtime.calibrate import main as calibrate_main

    return calibrate_main(args)


COMMANDS = {"run": run_command, "plan": plan_command, "sweep": sweep_command, "report": report_command,
            "recommend": recommend_command, "calibrate": calibrate_command, "sync": sync_command,
            "doctor": doctor_command}


def main() -> int:
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help") or args[0] not in COMMANDS:
        print(USAGE)
        return 0 if not args or args[0] in ("-h", "--help") else 2
    command, rest = args[0], args[1:]
    if command in COMMAND_USAGE and {"-h", "--help"} & set(rest):
        print(COMMAND_USAGE[command])
        return 0
    # SIGTERM (a scheduler, `kill`) stops a run the way Ctrl-C does: cancelled, summarised, exit 130.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    return COMMANDS[command](rest)


if __name__ == "__main__":
    sys.exit(main())
