"""`harness sweep`: expand a Hydra grid into prepared run directories, run them locally or as Slurm
job arrays, follow them to a final state, resume what did not complete, and write summary.csv."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import yaml

from harness.rundir import (
    CANCELLED,
    COMPLETED,
    FAILED,
    OOM,
    PENDING,
    PRUNED,
    RUNNING,
    SWEEP_FILE,
    TIMEOUT,
    read_status,
    run_dirs,
    write_json,
    write_status,
)

if TYPE_CHECKING:
    from harness.config.schema import RunConfig
    from harness.engines.rendered import RenderedRun
    from harness.launch.slurm import Submission
    from harness.launch.status import RunView

USAGE = """usage:
  harness sweep [sweep=PRESET] [OVERRIDES...] [--dry-run] [--submit-pruned] [--no-wait] [--poll=SECONDS]
  harness sweep status SWEEP_DIR [--watch] [--json] [--poll=SECONDS]
  harness sweep resume SWEEP_DIR [--dry-run] [--submit-pruned] [--no-wait] [--poll=SECONDS]
  harness sweep cancel SWEEP_DIR

A grid is Hydra multirun syntax (`layout.zero_stage=1,2,3 engine=deepspeed,fsdp`) and/or a preset in
hydra_configs/sweep/ whose `hydra.sweeper.params` holds the axes. Each point is prepared under
results/<sweep_name>/<timestamp>/<NNN>-<engine>-<layout>/ (validated, predicted, rendered); points
the planner rejects or predicts to run out of memory are PRUNED and not run unless --submit-pruned.
launcher=local runs the points one after another; launcher=slurm submits one job array per resource
shape and waits for them (--no-wait returns after submitting). --dry-run prepares the directories and
prints the sbatch scripts without submitting (`resume` submits them later).

  status   refresh every run's state from its files and squeue/sacct, print the grid, write summary.csv
           (--json: one object per run instead of the table)
  resume   run again what did not complete (FAILED, OOM, TIMEOUT, CANCELLED, never submitted)
  cancel   scancel the sweep's queued and running jobs

examples:
  harness sweep sweep=cpu_grid                                          (locally, one run after another)
  harness sweep sweep=cpu_grid launcher=slurm_local cluster=local_slurm  (`make slurm-up`'s cluster)
  harness sweep sweep=h100_8b launcher.partition=gpu launcher.account=me --dry-run
  harness sweep layout.zero_stage=1,2,3 engine=deepspeed,fsdp launcher=slurm --no-wait
  harness sweep status results/cpu_grid/20260101-120000 --watch
  harness sweep resume results/cpu_grid/20260101-120000
"""

SUBCOMMANDS = ("status", "resume", "cancel")
RESUBMIT_STATES = (FAILED, OOM, TIMEOUT, CANCELLED)


@dataclass
class Options:
    command: str = "new"
    target: Optional[Path] = None
    overrides: Tuple[str, ...] = ()
    dry_run: bool = False
    submit_pruned: bool = False
    wait: bool = True
    watch: bool = False
    as_json: bool = False
    poll_s: float = 5.0


class UsageError(ValueError):
    pass


def parse_args(args: Sequence[str]) -> Options:
    opts = Options()
    rest = []
    for arg in args:
        if arg in ("-h", "--help"):
            raise UsageError("")
        if arg == "--dry-run":
            opts.dry_run = True
        elif arg == "--submit-pruned":
            opts.submit_pruned = True
        elif arg == "--no-wait":
            opts.wait = False
        elif arg == "--watch":
            opts.watch = True
        elif arg == "--json":
            opts.as_json = True
        elif arg.startswith("--poll="):
            opts.poll_s = float(arg.split("=", 1)[1])
        elif arg.startswith("--"):
            raise UsageError(f"unknown option {arg}")
        else:
            rest.append(arg)
    if rest and rest[0] in SUBCOMMANDS:
        if len(rest) != 2:
            raise UsageError(f"`harness sweep {rest[0]}` takes one sweep directory")
        opts.command, opts.target = rest[0], Path(rest[1])
        if not (opts.target / SWEEP_FILE).exists():
            raise UsageError(f"{opts.target} is not a sweep directory (no {SWEEP_FILE})")
    else:
        opts.overrides = tuple(rest)
    return opts


# ------------------------------------------------------------------------------------------ the grid


def preset_override(overrides: Sequence[str]) -> List[str]:
    """`sweep=NAME` selects hydra_configs/sweep/NAME.yaml; appended (`+sweep=`) unless the primary
    config's defaults list already has a `sweep` entry."""
    from harness.config.compose import CONFIG_DIR, PRIMARY_CONFIG

    defaults = yaml.safe_load((CONFIG_DIR / f"{PRIMARY_CONFIG}.yaml").read_text()).get("defaults", [])
    has_group = any(isinstance(d, dict) and any(k.split(" ")[-1] == "sweep" for k in d) for d in defaults)
    return [f"+{o}" if o.startswith("sweep=") and not has_group else o for o in overrides]


def grid_points(overrides: Sequence[str]) -> Tuple[List[List[str]], Dict[str, str], str]:
    """(one override list per point, the preset's sweeper params, the sweep directory Hydra would use).

    The preset's `hydra.sweeper.params` come first and command-line axes after them, the order of
    Hydra's basic sweeper; a command-line axis replaces a preset axis of the same key.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from harness.config.compose import CONFIG_DIR, PRIMARY_CONFIG, SEARCHPATH_OVERRIDE, register_schemas
    from harness.config.grid import expand_grid

    overrides = preset_override(overrides)
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    fixed = [text for text, override in zip(overrides, parsed) if not override.is_sweep_override()]
    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="harness"):
        base = compose(config_name=PRIMARY_CONFIG, overrides=[*fixed, SEARCHPATH_OVERRIDE], return_hydra_config=True)
        node = base.hydra.sweeper.get("params")
        params = OmegaConf.to_container(node, resolve=True) if node is not None else {}
        sweep_dir = str(base.hydra.sweep.dir)
    axes = [f"{key}={value}" for key, value in params.items()]
    return expand_grid([*axes, *overrides]), {str(k): str(v) for k, v in params.items()}, sweep_dir


def make_unique_dir(path: Path) -> Path:
    """Create the timestamp folder, or `<timestamp>-N` when another sweep took it the same second."""
    path.parent.mkdir(parents=True, exist_ok=True)
    candidate, n = path, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            candidate, n = path.with_name(f"{path.name}-{n}"), n + 1


@dataclass
class Point:
    """One grid point's run directory, config and rendered launch (None: pruned, with the reason)."""

    run_dir: Path
    overrides: List[str]
    cfg: "RunConfig"
    rendered: Optional["RenderedRun"]
    reason: str = ""


def run_name(cfg: "RunConfig") -> str:
    """A point's name when nothing differs across the grid (see harness.config.naming.point_names)."""
    from harness.launch.slurm import check_name

    return f"{check_name('engine.name', cfg.engine.name)}-{check_name('layout.name', cfg.layout.name)}"


def prepare_point(cfg: "RunConfig", run_dir: Path, overrides: List[str]) -> Point:
    """prepare_run with pruning; a point that cannot even be rendered is PRUNED with the reason."""
    from harness.launch.prepare import prepare_run

    try:
        prepared = prepare_run(cfg, run_dir, prune=True)
    except ValueError as error:  # RunRejected (hub), an engine's render refusing the layout
        run_dir.mkdir(parents=True, exist_ok=True)
        write_status(run_dir, PRUNED, str(error))
        return Point(run_dir, overrides, cfg, None, str(error))
    reason = read_status(run_dir).reason if prepared.pruned else ""
    return Point(run_dir, overrides, prepared.cfg, prepared.rendered, reason)


def render_pruned(point: Point) -> Point:
    """--submit-pruned: render what the planner rejected, and run it anyway."""
    from harness.engines import engine_module

    try:
        rendered = engine_module(point.cfg.engine.name).render(point.cfg, point.run_dir)
    except Exception as error:
        write_status(point.run_dir, PRUNED, f"{point.reason}; and the engine cannot render it: {error}")
        return point
    rendered.save()
    write_status(point.run_dir, PENDING, f"run despite being pruned: {point.reason}")
    return Point(point.run_dir, point.overrides, point.cfg, rendered, "")


def expand(opts: Options) -> Tuple[Path, List[Point], str]:
    from harness.config.compose import compose_run_config
    from harness.config.naming import point_names
    from harness.launch.slurm import check_name, check_run_dir

    points, params, sweep_dir = grid_points(opts.overrides)
    configs = [compose_run_config(point) for point in points]
    names = {cfg.sweep_name for cfg in configs}
    backends = {cfg.launcher.backend for cfg in configs}
    if len(names) > 1 or len(backends) > 1:
        raise UsageError(f"one sweep has one sweep_name and one launcher; the grid varies them: "
                         f"{sorted(names)} {sorted(backends)}")
    check_name("sweep_name", configs[0].sweep_name)
    # Names and paths that could not go into a script are rejected before anything is written.
    names_of_runs = point_names(points, [run_name(cfg) for cfg in configs])
    if configs[0].launcher.backend == "slurm":
        for name in names_of_runs:
            check_run_dir(Path(sweep_dir).resolve() / name)
    root = make_unique_dir(Path(sweep_dir).resolve())
    write_json(root / SWEEP_FILE, {
        "sweep_name": configs[0].sweep_name, "launcher": configs[0].launcher.backend, "created": time.time(),
        "args": list(opts.overrides), "params": params,
        "points": [{"run": name, "overrides": point} for name, point in zip(names_of_runs, points)],
    })
    prepared = []
    for name, point, cfg in zip(names_of_runs, points, configs):
        item = prepare_point(cfg, root / name, point)
        if item.rendered is None and opts.submit_pruned:
            item = render_pruned(item)
        prepared.append(item)
    return root, prepared, configs[0].launcher.backend


def print_pruned(points: Sequence[Point]) -> None:
    for point in points:
        if point.rendered is None:
            print(f"[harness] {point.run_dir.name}: PRUNED {point.reason}", flush=True)


# --------------------------------------------------------------------------------------- launching


def run_local(points: Sequence[Point]) -> None:
    from harness.launch.local import launch_local
    from harness.runtime.sinks import wandb_environment

    for point in points:
        if point.rendered is None:
            continue
        print(f"[harness] {point.run_dir.name}: {point.rendered.command_line()}", flush=True)
        state, reason = launch_local(point.rendered, point.cfg.launcher.timeout_s,
                                     wandb_environment(point.run_dir, point.cfg.tracking))
        print(f"[harness] {point.run_dir.name}: {state} {reason}".rstrip(), flush=True)


def print_job_scripts(run_dirs: Sequence[Path]) -> None:
    """The first task's job.sbatch in full, then each other task's lines that differ from it."""
    first = (run_dirs[0] / "job.sbatch").read_text()
    print(f"# task 0: {run_dirs[0]}/job.sbatch\n{first}")
    known = set(first.splitlines())
    for index, run_dir in enumerate(run_dirs[1:], start=1):
        lines = [line for line in (run_dir / "job.sbatch").read_text().splitlines() if line not in known]
        print(f"# task {index}: {run_dir}/job.sbatch differs from task 0 in:")
        print("\n".join(f"#   {line}" for line in lines))


def submit_slurm(sweep_dir: Path, points: Sequence[Point], sweep_name: str, dry_run: bool) -> List["Submission"]:
    """Write each run's job.sbatch, group the runs by resource shape, write and (unless dry) submit."""
    from harness.launch.slurm import group_runs, submit, write_group, write_job_script
    from harness.runtime.sinks import wandb_environment

    runnable = [p for p in points if p.rendered is not None]
    for point in runnable:
        write_job_script(point.cfg, point.rendered, wandb_environment(point.run_dir, point.cfg.tracking))
    groups = group_runs([(p.run_dir, p.cfg, p.rendered) for p in runnable])
    submissions = [write_group(group, sweep_dir, sweep_name) for group in groups]
    for submission in submissions:
        runs = ", ".join(run.name for run in submission.run_dirs)
        if dry_run:
            print(f"\n# would submit: sbatch {submission.script}   ({len(submission.run_dirs)} run(s): {runs})")
            print(submission.script.read_text())
            if submission.is_array:
                print_job_scripts(submission.run_dirs)
            continue
        try:
            done = submit(submission)
        except Exception as error:
            for run_dir in submission.run_dirs:
                write_status(run_dir, FAILED, f"sbatch refused the job: {error}")
            print(f"[harness] sbatch {submission.script} failed: {error}", file=sys.stderr)
            continue
        kind = "array" if done.is_array else "job"
        print(f"[harness] submitted {kind} {done.job_id}: {submission.script} ({runs})", flush=True)
    return submissions


def wait_for(run_dirs: Sequence[Path], poll_s: float) -> List["RunView"]:
    """Poll until every submitted run is final; print a line whenever the counts change."""
    from harness.launch.status import one_line, refresh

    last = None
    while True:
        views = refresh(run_dirs)
        line = one_line(views)
        if line != last:
            print(f"[harness] {time.strftime('%H:%M:%S')} {line}", flush=True)
            last = line
        if all(v.settled or v.job_key is None for v in views):
            return views
        time.sleep(poll_s)


def finish(sweep_dir: Path, since: float = 0.0, query_slurm: bool = True) -> int:
    """The whole grid's state, summary.csv, the table, and the exit code: 0 when every run that ran
    completed. `since`: time of this invocation's first sbatch (the timing line covers those jobs)."""
    from harness.launch.slurm import read_submission
    from harness.launch.status import print_status, refresh, timing
    from harness.report.build import build_report
    from harness.report.table import summary_frame

    views = refresh(run_dirs(sweep_dir), query_slurm=query_slurm)
    frame = summary_frame([sweep_dir])
    paths = build_report([sweep_dir], sweep_dir, frame=frame)
    labels = dict(zip(frame["run"], frame["label"])) if not frame.empty else {}
    print_status(str(sweep_dir), views, labels)
    records = {v.run_dir: read_submission(v.run_dir) for v in views}
    ours = [v for v in views if records[v.run_dir] and records[v.run_dir].get("submitted", 0) >= since]
    line = timing(ours, [records[v.run_dir]["submitted"] for v in ours])
    if line:
        print(f"[harness] {line}")
    print(f"[harness] summary: {paths['csv']}\n[harness] report: {paths['html']}", flush=True)
    bad = [v.run_dir.name for v in views if v.final and v.state not in (COMPLETED, PRUNED)]
    if bad:
        print(f"[harness] not completed: {', '.join(bad)}  (re-run them: harness sweep resume {sweep_dir})",
              file=sys.stderr)
    return 1 if bad else 0


def launch(sweep_dir: Path, points: Sequence[Point], backend: str, sweep_name: str, opts: Options) -> int:
    print_pruned(points)
    if backend == "local":
        if opts.dry_run:
            for point in points:
                if point.rendered is not None:
                    print(f"# would run: {point.rendered.command_line()}")
            print(f"[harness] dry run: prepared {sweep_dir}; run it with `harness sweep resume {sweep_dir}`")
            return 0
        run_local(points)
        return finish(sweep_dir, query_slurm=False)
    since = time.time()
    submit_slurm(sweep_dir, points, sweep_name, opts.dry_run)
    if opts.dry_run:
        print(f"[harness] dry run: nothing submitted; prepared {sweep_dir}; submit with "
              f"`harness sweep resume {sweep_dir}`")
        return 0
    runs = [p.run_dir for p in points]
    if not opts.wait:
        print(f"[harness] submitted; follow with `harness sweep status {sweep_dir}`")
        return 0
    try:
        wait_for(sorted(runs), opts.poll_s)
    except KeyboardInterrupt:
        print(f"\n[harness] stopped waiting; the jobs go on: harness sweep status {sweep_dir}", file=sys.stderr)
        return 130
    return finish(sweep_dir, since)


# ------------------------------------------------------------------------------- status / resume


def sweep_record(sweep_dir: Path) -> Dict:
    return json.loads((Path(sweep_dir) / SWEEP_FILE).read_text())


def status(opts: Options) -> int:
    from harness.launch.status import refresh

    sweep_dir = opts.target.resolve()
    runs = run_dirs(sweep_dir)
    if opts.watch:
        wait_for(runs, opts.poll_s)
    if opts.as_json:
        print(json.dumps([{"run": v.run_dir.name, "state": v.state, "reason": v.reason, "job": v.job_key,
                           "slurm_state": v.slurm_state} for v in refresh(runs)], indent=1))
        return 0
    finish(sweep_dir)
    return 0


def to_resume(views: Sequence["RunView"], submit_pruned: bool, backend: str) -> List["RunView"]:
    """What did not complete: final non-completed runs, never-submitted runs (and pruned ones on request).
    Queued or running Slurm jobs are left alone; a local run left RUNNING was interrupted."""
    chosen = []
    for view in views:
        if view.state in RESUBMIT_STATES:
            chosen.append(view)
        elif view.state == PRUNED and submit_pruned:
            chosen.append(view)
        elif view.state in (PENDING, RUNNING) and (view.job_key is None if backend == "slurm" else True):
            chosen.append(view)
    return chosen


def load_point(run_dir: Path, state: str, reason: str) -> Point:
    from harness.config.compose import run_config_from_dict
    from harness.engines.rendered import RENDERED_FILE, RenderedRun

    cfg = run_config_from_dict(json.loads((run_dir / "config.json").read_text()))
    rendered = RenderedRun.load(run_dir) if (run_dir / RENDERED_FILE).exists() and state != PRUNED else None
    return Point(run_dir, [], cfg, rendered, reason)


def resume(opts: Options) -> int:
    from harness.launch.slurm import archive_attempt, note_previous_attempt
    from harness.launch.status import refresh

    sweep_dir = opts.target.resolve()
    record = sweep_record(sweep_dir)
    backend = record["launcher"]
    views = refresh(run_dirs(sweep_dir), query_slurm=backend == "slurm")
    chosen = to_resume(views, opts.submit_pruned, backend)
    if not chosen:
        print("[harness] nothing to resume: every run completed, is pruned, or is still queued/running")
        return finish(sweep_dir, query_slurm=backend == "slurm")
    points = []
    for view in chosen:
        point = load_point(view.run_dir, view.state, view.reason)
        if point.rendered is None:
            if not opts.submit_pruned:
                continue
            point = render_pruned(point)
            if point.rendered is None:
                continue
        if not opts.dry_run and view.state in (*RESUBMIT_STATES, RUNNING):
            note_previous_attempt(view.run_dir, view.state, view.reason)
            archive_attempt(view.run_dir)
            write_status(view.run_dir, PENDING, f"resubmitted after {view.state}")
        points.append(point)
        print(f"[harness] resume {view.run_dir.name} (was {view.state})", flush=True)
    return launch(sweep_dir, points, backend, record["sweep_name"], opts)


def cancel(opts: Options) -> int:
    from harness.launch.slurm import scancel
    from harness.launch.status import refresh

    views = refresh(run_dirs(opts.target.resolve()))
    keys = [v.job_key for v in views if v.job_key and not v.final]
    scancel(keys)
    print(f"[harness] scancel {' '.join(keys) or '(nothing queued or running)'}")
    return 0


def main(args: List[str]) -> int:
    try:
        opts = parse_args(args)
    except UsageError as error:
        print(f"{error}\n\n{USAGE}" if str(error) else USAGE, file=sys.stderr if str(error) else sys.stdout)
        return 2 if str(error) else 0
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from harness.config.errors import ConfigRejected, explain
    from harness.launch.slurm import ScriptValueRejected, SlurmError

    try:
        if opts.command == "status":
            return status(opts)
        if opts.command == "resume":
            return resume(opts)
        if opts.command == "cancel":
            return cancel(opts)
        sweep_dir, points, backend = expand(opts)
        return launch(sweep_dir, points, backend, points[0].cfg.sweep_name if points else "", opts)
    except (UsageError, ScriptValueRejected, SlurmError, HydraException, OmegaConfBaseException,
            ConfigRejected) as error:
        print(f"harness sweep: {explain(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
