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
  tune    run the recommended top K, refit the profile's per-engine efficiency factors from their measured
          step times into a new profile, re-rank, run the new top: --global-batch SEQS [--top K] [--name NAME]
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
_run_options = {"wait": True, "poll_s": None, "wide": False}
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
    process claimed. Hydra's own write of that record is off (hydra.output_subdir: null in the primary
    config): it would land in the folder Hydra composed, which another `harness run` of the same second may hold."""
    import logging

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from harness.rundir.files import HYDRA_RECORD_DIR
    from harness.rundir.writer import write_text

    hydra = HydraConfig.get()
    record = {"config.yaml": cfg, "hydra.yaml": OmegaConf.create({"hydra": hydra}),
              "overrides.yaml": OmegaConf.create(list(hydra.overrides.task))}
    for name, node in record.items():
        write_text(run_dir / HYDRA_RECORD_DIR / name, OmegaConf.to_yaml(node, resolve=False))
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
    print_table(frame, title=str(sweep_dir), wide=_run_options.get("wide", False))
    say(f"[harness] summary: {paths['csv']}\n[harness] report: {paths['html']}")


def say(text: str) -> None:
    """A line on the console and in the run's cli.log (Hydra's file handler, without its console twin)."""
    import logging

    from harness.terminal import print_fitted

    print_fitted(text)
    record = logging.LogRecord("harness", logging.INFO, __file__, 0, text, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


# Hydra flags that take a value; argparse wants all flags before the overrides.
_VALUED_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                 "--config-dir", "-cd", "--experimental-rerun", "--info", "-i", "--shell-completion", "-sc"}
# Hydra's flags whose value holds `=` (`--shell-completion install=bash`), so it is not an override.
_VALUED_WITH_EQUALS = {"--shell-completion", "-sc"}
# Every flag Hydra's own parser knows (hydra/_internal/utils.py get_args_parser, Hydra 1.3); anything else
# starting with `-` is refused before Hydra starts.
HYDRA_FLAGS = _VALUED_FLAGS | {"--help", "-h", "--hydra-help", "--version", "--resolve", "--run", "-r",
                               "--multirun", "-m"}
# Hydra's flags with a closed set of values (hydra/_internal/utils.py get_args_parser).
FLAG_CHOICES = {"--cfg": ("job", "hydra", "all"), "-c": ("job", "hydra", "all"),
                "--info": ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath"),
                "-i": ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")}
# Hydra's mutually exclusive modes (hydra/_internal/utils.py run_hydra: "Only one of ... can be specified").
MODE_FLAGS = {"--run": "run", "-r": "run", "--multirun": "multirun", "-m": "multirun", "--cfg": "cfg", "-c": "cfg",
              "--info": "info", "-i": "info", "--shell-completion": "sc", "-sc": "sc"}
# Flags that only print (a config, help, a completion script): nothing is composed into a run directory.
PRINT_ONLY_FLAGS = {"--cfg", "-c", "--info", "-i", "--shell-completion", "-sc", "--hydra-help", "--version",
                    "--help", "-h"}


def split_hydra_flags(args: List[str]) -> Tuple[List[str], List[str]]:
    """Hydra's flags (in order, with their values) apart from overrides, wherever the user put them."""
    flags, overrides, index = [], [], 0
    while index < len(args):
        token = args[index]
        if token.startswith("-") and "=" not in token:
            flags.append(token)
            takes_value = token in _VALUED_FLAGS and index + 1 < len(args) and (
                "=" not in args[index + 1] or token in _VALUED_WITH_EQUALS)
            if takes_value:
                flags.append(args[index + 1])
                index += 1
        else:
            overrides.append(token)
        index += 1
    return flags, overrides


COMMAND_USAGE = {
    "run": "usage: harness run [hydra overrides...] [-m] [--cfg job|hydra|all] [--no-wait] [--poll=SECONDS]\n"
           "       [--wide]\n\n"
           "  Compose one config (or, with -m, a Hydra grid), plan, render and launch each point: on this\n"
           "  machine (launcher=local), or submitted as a Slurm job (launcher=slurm*) and followed until it\n"
           "  ends (Ctrl-C cancels the job; --no-wait only submits; `harness sweep status DIR` follows).",
    "plan": "usage: harness plan [hydra overrides...] [--why] [--wide] [--json] [--csv]\n"
            "       (comma lists expand to a grid)\n\n"
            "  Predict memory, FLOPs and validity per layout; nothing is launched. Exit 1 if any is refused.",
    "report": "usage: harness report [SWEEP_DIR ...] [--out DIR] [--wide]\n\n"
              "  Build summary.csv/.parquet, report.html and the W&B report spec (newest sweep by default;\n"
              "  several sweeps: a comparison, written under compare/ or into --out DIR).",
}


def check_points(command: str, flags: List[str], overrides: List[str], writes: bool = True) -> bool:
    """Compose and check every point before anything is written; one line per refusal on stderr. A command
    that `writes` also needs a results_dir it can write into."""
    from harness.config.arguments import unwritable_folder
    from harness.config.compose import compose_noting_fills
    from harness.config.errors import ConfigRejected, explain
    from harness.config.grid import expand_grid

    try:
        points = expand_grid(overrides) if {"-m", "--multirun"} & set(flags) else [overrides]
        notes = []
        for point in points:
            run, note = compose_noting_fills(point, config_dirs(flags))
            notes += [note] if note and note not in notes else []
            problem = unwritable_folder(Path(run.results_dir)) if writes else None
            if problem:
                raise ConfigRejected("results_dir", run.results_dir, problem)
        refusal = _single_run_refusal(command, writes, points, run)
    except Exception as error:  # every composition and value error becomes one line
        print(f"harness {command}: {explain(error)}", file=sys.stderr)
        return False
    if refusal:
        print(f"harness {command}: the run was not launched: {'; '.join(refusal)}", file=sys.stderr)
        return False
    from harness.terminal import print_fitted

    for note in notes:  # what an open layout was filled with (stderr: --json / --csv stay parseable)
        print_fitted(note, sys.stderr)
    _grid_points[:] = points
    return True


def _single_run_refusal(command: str, writes: bool, points: List[List[str]], run) -> List[str]:
    """Why `harness run` of one point would be refused (harness.engines.admission.judge), found before Hydra
    makes its run folder: a refused single run wrote a PRUNED folder that a later report took for a sweep. A grid
    keeps its PRUNED records (a status per point); a stand-in and a hub model are judged after their resolution."""
    if command != "run" or not writes or len(points) != 1 or run.model.hub_id or run.standin.of or any(
            item.lstrip("+~").startswith("standin=") for item in points[0]):
        return []
    from harness.engines.admission import judge
    from harness.launch.prepare import launch_problems

    return [*judge(run).errors, *launch_problems(run)]  # prepare_run's own decision, made earlier


def _slurm_reachable_for(command: str, flags: List[str], overrides: List[str]) -> bool:
    """A single run bound for Slurm (a GPU recipe's stand-in goes by its recipe's launcher) asks Slurm first:
    unreachable, it said so only after writing a FAILED run folder. False, with the line, when it cannot go."""
    if {"-m", "--multirun"} & set(flags) or PRINT_ONLY_FLAGS & set(flags):
        return True
    from harness.config.compose import compose_run_config
    from harness.launch.slurm_commands import check_reachable

    if compose_run_config(overrides, config_dirs(flags)).launcher.backend != "slurm":
        return True
    problem = check_reachable()
    if problem:
        print(f"harness {command}: {problem}; or run here with launcher=local", file=sys.stderr)
    return problem is None


def config_dirs(flags: List[str]) -> List[str]:
    """The folders Hydra's `--config-dir DIR` (`-cd DIR`) adds to the search path."""
    return [flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag in ("--config-dir", "-cd")]


def refuse_unknown_flags(command: str, flags: List[str], known=HYDRA_FLAGS) -> None:
    """A flag neither Hydra nor the command knows is named before anything is composed."""
    from harness.config.arguments import CommandLineError
    from harness.config.errors import nearest

    values = {i + 1 for i, flag in enumerate(flags[:-1]) if flag in _VALUED_FLAGS}
    unknown = [flag for i, flag in enumerate(flags) if flag not in known and i not in values]
    if unknown:
        raise CommandLineError(f"harness {command}: unknown option {unknown[0]}{nearest(unknown[0], known)} "
                               f"(see `harness {command} --help`)")
    for i, flag in enumerate(flags):
        value = flags[i + 1] if i + 1 in values else None
        choices = FLAG_CHOICES.get(flag)
        missing = value is None and flag not in ("--info", "-i")  # Hydra's --info alone means --info all
        if flag in _VALUED_FLAGS and (missing or (value is not None and choices and value not in choices)):
            rule = f"must be one of {', '.join(choices)}" if choices else "needs a value"
            raise CommandLineError(f"harness {command}: {flag}={value or ''!r} {rule} (see `harness {command} "
                                   "--help`)")
    modes = [flag for flag in flags if flag in MODE_FLAGS]
    if len({MODE_FLAGS[flag] for flag in modes}) > 1:
        raise CommandLineError(f"harness {command}: {' and '.join(modes)} cannot be given together: Hydra takes one "
                               "of --run, --multirun, --cfg, --info, --shell-completion")


def with_info_value(flags: List[str]) -> List[str]:
    """Hydra's `--info` alone is `--info all`; written out, so that no override is read as its value."""
    out = []
    for i, flag in enumerate(flags):
        out.append(flag)
        if flag in ("--info", "-i") and (i + 1 == len(flags) or flags[i + 1] not in FLAG_CHOICES[flag]):
            out.append("all")
    return out


# The points of a `harness run -m` grid, in Hydra's order: their directory names are those of
# `harness sweep` (the values that differ, harness.config.naming.point_names), not the layout preset's.
_grid_points: List[List[str]] = []
POINT_NAME_RESOLVER = "harness_point_name"
POINT_SUBDIR = (f"hydra.sweep.subdir='${{{POINT_NAME_RESOLVER}:${{hydra.job.num}},${{engine.name}}-"
                "${harness_run_layout_name:}}'")


def _point_name(num: int, default: str) -> str:
    from harness.config.naming import point_names

    return point_names(_grid_points, [default] * len(_grid_points))[int(num)]


def _take_run_options(args: List[str]) -> List[str]:
    """--no-wait (submit a Slurm run and return), --poll=SECONDS and --wide (every column of the final
    table); the rest is Hydra's."""
    from harness.config.arguments import poll_seconds

    rest = []
    for arg in args:
        if arg == "--no-wait":
            _run_options["wait"] = False
        elif arg.startswith("--poll="):
            _run_options["poll_s"] = poll_seconds(arg, "harness run")
        elif arg == "--wide":
            _run_options["wide"] = True
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

    import harness.plan  # noqa: F401  (installs the model.init rule a stand-in follows: standin=cpu)
    from harness.config.compose import CONFIG_DIR, PRIMARY_CONFIG, register_schemas, searchpath_override

    register_schemas()
    _failed_runs.clear()
    args = _take_run_options(args)
    flags, overrides = split_hydra_flags(args)
    refuse_unknown_flags("run", flags)
    flags = with_info_value(flags)
    # Hydra creates the run directory before the task runs: refuse bad input before Hydra starts.
    if not check_points("run", flags, overrides, writes=not PRINT_ONLY_FLAGS & set(flags)):
        return 2
    overrides = standin_point(flags, overrides)
    if overrides is None or not _slurm_reachable_for("run", flags, overrides):
        return 2
    from omegaconf import OmegaConf

    from harness.terminal import print_fitted

    OmegaConf.register_new_resolver(POINT_NAME_RESOLVER, _point_name, replace=True)
    searchpath, overrides = searchpath_override(overrides)
    sys.argv = [completion_program(flags), *flags, searchpath, POINT_SUBDIR, *overrides]
    try:
        hydra.main(config_path=str(CONFIG_DIR), config_name=PRIMARY_CONFIG, version_base="1.3")(_run_task)()
    except KeyboardInterrupt:
        print_fitted(f"[harness] interrupted: {', '.join(_failed_runs) or 'nothing'} cancelled", sys.stderr)
        return INTERRUPTED
    if _failed_runs:
        print_fitted(f"[harness] not completed: {', '.join(_failed_runs)}", sys.stderr)
        return 1
    return 0


def completion_program(flags: List[str]) -> str:
    """The program name Hydra gives the shell. Its completion script registers `harness` and asks
    `harness --shell-completion query=bash` with the line typed so far (COMP_LINE); the command word after
    `harness` is not an override, so the query sees the line without it."""
    import os

    if not {"--shell-completion", "-sc"} & set(flags):
        return "harness run"
    words = os.environ.get("COMP_LINE", "").split(" ")
    if len(words) > 1 and words[1] in COMMANDS:
        os.environ["COMP_LINE"] = " ".join([words[0], *words[2:]])
    return "harness"


def plan_command(args: List[str]) -> int:
    from harness.report.plan_view import PLAN_FLAGS, plan_main

    # The plan view's own flags (--why, --json, --csv) and Hydra's --cfg / --config-dir; the rest are overrides.
    own = [arg for arg in args if arg in PLAN_FLAGS]
    flags, overrides = split_hydra_flags([arg for arg in args if arg not in PLAN_FLAGS])
    # -m as `harness run -m` takes it: a comma list is a grid here anyway
    refuse_unknown_flags("plan", flags, known={"--cfg", "-c", "--config-dir", "-cd", "-m", "--multirun"})
    if not check_points("plan", [*flags, "-m"], overrides, writes=False):
        return 2
    if {"--cfg", "-c"} & set(flags):
        return print_composed("plan", flags, overrides)
    return plan_main([*own, *overrides], config_dirs(flags))


def print_composed(command: str, flags: List[str], overrides: List[str]) -> int:
    """`--cfg job|hydra|all`: the composed config as YAML (Hydra's own flag), each grid point in turn."""
    from omegaconf import OmegaConf

    from harness.config.arguments import CommandLineError
    from harness.config.compose import compose_config
    from harness.config.grid import expand_grid

    at = max(i for i, flag in enumerate(flags) if flag in ("--cfg", "-c"))
    part = flags[at + 1] if at + 1 < len(flags) else ""
    if part not in ("job", "hydra", "all"):
        raise CommandLineError(f"harness {command}: --cfg={part!r} must be one of job, hydra, all")
    for point in expand_grid(overrides):
        cfg = compose_config(point, return_hydra_config=part != "job", config_dirs=config_dirs(flags))
        node = cfg.hydra if part == "hydra" else cfg
        print(OmegaConf.to_yaml(node, resolve=part == "job"))
    return 0


def sweep_command(args: List[str]) -> int:
    from harness.commands.sweep import main as sweep_main

    try:
        return sweep_main(args)
    except KeyboardInterrupt:
        print("[harness] interrupted: the running point was cancelled, the summary written", file=sys.stderr)
        return INTERRUPTED


def report_command(args: List[str]) -> int:
    from harness.config.arguments import CommandLineError
    from harness.report.build import report_main

    unknown = [arg for arg in args if arg.startswith("-") and arg not in ("--out", "--wide")]
    if unknown:
        raise CommandLineError(f"harness report: unknown option {unknown[0]} (see `harness report --help`)")
    paths = [Path(arg) for arg in args if arg != "--wide"]
    return report_main(paths or [_newest_sweep(Path("results"))], wide="--wide" in args)


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


def tune_command(args: List[str]) -> int:
    from harness.launch.tune import tune_main

    return tune_main(args)


def calibrate_command(args: List[str]) -> int:
    if "--slurm" in args:  # submitted from a login node: no torch here
        from harness.launch.calibrate_slurm import main as calibrate_slurm_main

        return calibrate_slurm_main(args)
    from harness.runtime.calibrate import main as calibrate_main

    return calibrate_main(args)


COMMANDS = {"run": run_command, "plan": plan_command, "sweep": sweep_command, "report": report_command,
            "recommend": recommend_command, "calibrate": calibrate_command, "sync": sync_command,
            "doctor": doctor_command, "tune": tune_command}


def main() -> int:
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = args[0], args[1:]
    if command in ("--shell-completion", "-sc"):  # the completion script's own call: Hydra's, through run
        command, rest = "run", args
    if command not in COMMANDS:
        from harness.config.errors import nearest

        print(f"harness: unknown command {command!r}{nearest(command, COMMANDS)}: one of {', '.join(COMMANDS)} "
              "(see `harness --help`)", file=sys.stderr)
        return 2
    if command in COMMAND_USAGE and {"-h", "--help"} & set(rest):
        print(COMMAND_USAGE[command])
        if command == "run":
            print_config_groups()
        return 0
    # SIGTERM (a scheduler, `kill`) stops a run the way Ctrl-C does: cancelled, summarised, exit 130.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    return _guarded(command, rest)


def print_config_groups() -> None:
    """The config groups and their options (`GROUP=NAME` picks one), wrapped to the terminal."""
    from harness.config.compose import config_groups
    from harness.terminal import print_fitted

    print("\n  Config groups (GROUP=NAME picks one; `harness run --cfg job` shows the composed config):")
    for group, names in config_groups().items():
        print_fitted(f"    {group}: {', '.join(names)}")


def _guarded(command: str, rest: List[str]) -> int:
    """One line for a command line the command refuses, and for a file it cannot write."""
    from harness.config.arguments import CommandLineError

    try:
        return COMMANDS[command](rest)
    except CommandLineError as error:
        print(str(error), file=sys.stderr)
        return 2
    except OSError as error:  # a results folder that is a file, read-only, full: the path and the reason
        where = f": {error.filename}" if error.filename else ""
        print(f"harness {command}: {error.strerror or error}{where}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
