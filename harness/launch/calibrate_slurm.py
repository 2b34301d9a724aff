"""`harness calibrate --slurm`: the calibration micro-benchmarks as one small Slurm job across nodes
(slurm/templates/calibrate.sbatch.j2), waited for; the profile it writes is what `cluster.profile` names."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from harness.config.arguments import OneLineParser, slug, unwritable_file, whole_number
from harness.config.checks import OWNED_SBATCH, sbatch_option_problems
from harness.engines.rendered import PORT_BASE, PORT_SPAN
from harness.launch.sbatch import template
from harness.launch.slurm_commands import SlurmError, slurm_command
from harness.plan.hardware import load_profile, profile_path
from harness.rundir import write_text
from harness.terminal import print_fitted

# The options slurm/templates/calibrate.sbatch.j2 writes: its files and name (the harness alone) and the
# job's shape (from --nodes / --tasks-per-node); the short forms are those of OWNED_SBATCH.
CALIBRATE_OWNED = {
    **{option: owner for option, owner in OWNED_SBATCH.items() if owner[1] is None},
    "--nodes": (OWNED_SBATCH["--nodes"][0], "--nodes"),
    "--ntasks": (OWNED_SBATCH["--ntasks"][0], "--nodes and --tasks-per-node"),
    "--ntasks-per-node": (None, "--tasks-per-node"),
}
WAIT_S = 3600  # the benchmarks take about a minute; the job may queue first


def render_calibrate_script(script: Path, out: Path, name: str, nodes: int, tasks_per_node: int, precision: str,
                            directives: Sequence[str], python: str = sys.executable) -> str:
    return template("calibrate.sbatch.j2").render(
        script=str(script), log=str(script.with_suffix(".out")), nodes=nodes, tasks_per_node=tasks_per_node,
        directives=list(directives), python=python, precision=precision, name=name, out=str(out),
        port_base=PORT_BASE, port_span=PORT_SPAN)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = OneLineParser(prog="harness calibrate --slurm")
    parser.add_argument("--slurm", action="store_true", required=True)
    parser.add_argument("--nodes", type=whole_number, default=2, help="nodes of the job (default 2)")
    parser.add_argument("--tasks-per-node", type=whole_number, default=1, help="ranks per node (default 1)")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--name", type=slug, default="cluster",
                        help="profile name, the file name in the profile cache (default cluster)")
    parser.add_argument("--out", default="", help="write the profile here instead of the profile cache")
    parser.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                        help="an extra #SBATCH option, e.g. --sbatch=--partition=gpu (repeatable)")
    args = parser.parse_args(list(argv))
    problems: List[str] = [f"--sbatch={value!r} {rule}"
                           for _, value, rule in sbatch_option_problems(args.sbatch, CALIBRATE_OWNED, "--sbatch")]
    out_problem = unwritable_file(Path(args.out)) if args.out else None
    if out_problem:
        problems.append(f"--out={args.out!r} {out_problem}")
    if problems:
        parser.error("; ".join(problems))
    return args


def file_identity(path: Path) -> Optional[Tuple[int, int]]:
    """(inode, mtime in ns) of a file, None where there is none: the profile is written by an atomic rename, so a
    new one has a new identity whatever the clocks of the node that wrote it and of this host."""
    try:
        found = path.stat()
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns


def written_by_the_job(out: Path, before: Optional[Tuple[int, int]]) -> bool:
    """A whole profile at `out` that was not there, as it was, when the job was submitted."""
    return file_identity(out) not in (None, before) and load_profile(out) is not None


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    out = Path(args.out) if args.out else profile_path(args.name)
    script = out.with_name(f"{out.stem}.calibrate.sbatch")
    write_text(script, render_calibrate_script(script, out, args.name, args.nodes, args.tasks_per_node,
                                               args.precision, args.sbatch))
    print_fitted(f"[harness] calibrating on {args.nodes} node(s) x {args.tasks_per_node} task(s): sbatch {script}")
    before = file_identity(out)
    try:
        slurm_command(["sbatch", "--parsable", "--wait", str(script)], timeout=WAIT_S)
    except SlurmError as error:
        reason = str(error).strip().rstrip(":")  # sbatch's stderr follows the colon, and may be empty
        if not written_by_the_job(out, before):
            print_fitted(f"[harness] calibration job failed: {reason} (log: {script.with_suffix('.out')})", sys.stderr)
            return 1
        # Rank 0 writes the profile once every rank's measurements are gathered, before the group's teardown,
        # where a peer's exit can abort another (pytorch/gloo#168) and srun --kill-on-bad-exit then ends the job.
        print_fitted(f"[harness] the calibration job ended with {reason} after it wrote the profile; it is kept "
                     f"(log: {script.with_suffix('.out')})", sys.stderr)
    if load_profile(out) is None:
        print_fitted(f"[harness] the job ended but wrote no profile at {out} (log: {script.with_suffix('.out')})",
                     sys.stderr)
        return 1
    print(f"profile written to {out}; use it with cluster.profile={out}")
    return 0
