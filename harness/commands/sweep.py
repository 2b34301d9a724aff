"""`harness sweep`: parse the command line, expand the grid, run or follow it, and write its reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from harness.config.arguments import CommandLineError, poll_seconds
from harness.config.errors import ConfigRejected, explain, nearest
from harness.launch import sweep as orchestrate
from harness.launch.grid import UsageError
from harness.launch.points import expand
from harness.launch.sbatch import ScriptValueRejected
from harness.launch.slurm_commands import SlurmError
from harness.launch.status import refresh
from harness.launch.sweep import Options
from harness.report.build import build_report
from harness.report.headline import headlines
from harness.report.table import measured_cells, summary_frame
from harness.rundir import SWEEP_FILE, run_dirs

USAGE = """usage:
  harness sweep [sweep=PRESET] [OVERRIDES...] [--dry-run] [--submit-pruned] [--no-wait] [--poll=SECONDS] [--wide]
  harness sweep status SWEEP_DIR [--watch] [--json] [--wide] [--poll=SECONDS]
  harness sweep resume SWEEP_DIR [--dry-run] [--submit-pruned] [--no-wait] [--poll=SECONDS] [--wide]
  harness sweep cancel SWEEP_DIR

A grid is Hydra multirun syntax (`layout.zero_stage=1,2,3 engine=deepspeed,fsdp`) and/or a preset in
hydra_configs/sweep/ whose `hydra.sweeper.params` holds the axes. Each point is prepared under
results/<sweep_name>/<timestamp>/<NNN>-<engine>-<layout>/ (validated, predicted, rendered); points
the planner rejects or predicts to run out of memory are PRUNED and not run unless --submit-pruned.
launcher=local runs the points one after another; launcher=slurm submits one job array per resource
shape and follows them as a local sweep is followed: step lines, bar, ETA (--no-wait returns after
submitting and prints the `status --watch` command that follows them later). --dry-run prepares the
directories and prints the sbatch scripts without submitting (`resume` submits them later).

  status   refresh every run's state from its files and squeue/sacct, print the grid, write summary.csv
           (--watch: first follow the sweep live until every job ends; --json: one object per run instead of
           the table; --wide: every column, however wide)
  resume   run again what did not complete (FAILED, OOM, TIMEOUT, CANCELLED, CORRUPT, never submitted)
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
FLAGS = {"--dry-run": "dry_run", "--submit-pruned": "submit_pruned", "--watch": "watch", "--json": "as_json",
         "--wide": "wide"}


def parse_args(args: Sequence[str]) -> Options:
    opts = Options()
    rest = []
    for arg in args:
        if arg in ("-h", "--help"):
            raise UsageError("")
        if arg in FLAGS:
            setattr(opts, FLAGS[arg], True)
        elif arg == "--no-wait":
            opts.wait = False
        elif arg.startswith("--poll="):
            opts.poll_s = poll_seconds(arg, "harness sweep")
        elif arg.startswith("-"):
            raise UsageError(f"harness sweep: unknown option {arg}{nearest(arg, [*FLAGS, '--no-wait', '--poll='])} "
                             "(see `harness sweep --help`)")
        else:
            rest.append(arg)
    if rest and rest[0] in SUBCOMMANDS:
        if len(rest) != 2:
            raise UsageError(f"harness sweep {rest[0]}: takes one sweep directory (see `harness sweep --help`)")
        opts.command, opts.target = rest[0], Path(rest[1])
        if not (opts.target / SWEEP_FILE).exists():
            raise UsageError(f"harness sweep {rest[0]}: {opts.target} is not a sweep directory (no {SWEEP_FILE})")
    else:
        opts.overrides = tuple(rest)
    return opts


def write_reports(sweep_dir: Path) -> orchestrate.Reported:
    """summary.csv/.parquet, report.html and the W&B report spec of one sweep; the layout labels and measured
    cells by run for the final table."""
    frame = summary_frame([sweep_dir])
    paths = build_report([sweep_dir], sweep_dir, frame=frame)
    labels = dict(zip(frame["run"], frame["label"])) if not frame.empty else {}
    answers = [f"[harness] {item.text} {item.detail}" for item in headlines(frame)]
    return orchestrate.Reported(labels, measured_cells(frame),
                                [*answers, f"[harness] summary: {paths['csv']}", f"[harness] report: {paths['html']}"])


def status(opts: Options) -> int:
    sweep_dir = opts.target.resolve()
    runs = run_dirs(sweep_dir)
    if opts.watch:
        orchestrate.follow(runs, opts.poll_s)
    if opts.as_json:
        print(json.dumps([{"run": v.run_dir.name, "state": v.state, "reason": v.reason, "job": v.job_key,
                           "slurm_state": v.slurm_state} for v in refresh(runs)], indent=1))
        return 0
    orchestrate.finish(sweep_dir, write_reports, wide=opts.wide)
    return 0


def dispatch(opts: Options) -> int:
    if opts.command == "status":
        return status(opts)
    if opts.command == "resume":
        return orchestrate.resume(opts, write_reports)
    if opts.command == "cancel":
        return orchestrate.cancel(opts)
    sweep_dir, points, backend = expand(opts.overrides, opts.submit_pruned)
    sweep_name = points[0].cfg.sweep_name if points else ""
    return orchestrate.launch(sweep_dir, points, backend, sweep_name, opts, write_reports)


def main(args: List[str]) -> int:
    try:
        opts = parse_args(args)
    except (UsageError, CommandLineError) as error:
        print(str(error) if str(error) else USAGE, file=sys.stderr if str(error) else sys.stdout)
        return 2 if str(error) else 0
    try:
        return dispatch(opts)
    except (UsageError, ScriptValueRejected, SlurmError, HydraException, OmegaConfBaseException,
            ConfigRejected) as error:
        print(f"harness sweep: {explain(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
