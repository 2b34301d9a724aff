"""Slurm job scripts: render job.sbatch per run and one job array per resource shape.

Files this module writes (never into another run's directory):
- `<run>/job.sbatch` — the run's own script; `sbatch` it by hand to re-run that run alone.
- `<sweep>/slurm/<array>.sbatch`, `.manifest` (one run directory per line, line i+1 = task i).

Every value that reaches a script is either shell-quoted (`shlex.quote`) or checked against a pattern
and rejected with the field's name; `launcher.env_setup` is the one field that is shell code by design.
"""

from __future__ import annotations

import os
import re
import sys
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import jinja2

from harness import REPO_ROOT
from harness.config.checks import sbatch_option_problems
from harness.config.schema import RunConfig
from harness.engines.rendered import MASTER_ADDR, MASTER_PORT, NODE_RANK, PORT_BASE, PORT_SPAN, RenderedRun
from harness.launch.threads import JOB_CPUS_LINE, thread_rule
from harness.launch.watchdog import NODE_FLAG
from harness.plan.time_limit import DEFAULT_LEAD_S, WARNING_SIGNAL, warning_lead_s
from harness.rundir import JOB_SCRIPT, PLAN_FILE, SWEEP_SLURM_DIR, load_json, write_text

TEMPLATE_DIR = REPO_ROOT / "slurm" / "templates"
# What each placeholder of `RenderedRun.argv` becomes inside a node's task.
NODE_VARIABLES = {NODE_RANK: "SLURM_NODEID", MASTER_ADDR: "MASTER_ADDR", MASTER_PORT: "MASTER_PORT"}
# Environment variable names that look like credentials are never written into a script.
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)

# Patterns of values written into #SBATCH lines (sbatch reads those lines itself, not a shell; a
# newline would start a new line of the script, a space or a quote would change how sbatch splits it).
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SBATCH_PATH = re.compile(r"^/[A-Za-z0-9._/+=,@:-]*$")  # no %: sbatch expands %j, %A ... in --output
PARTITION_LIKE = re.compile(r"^[A-Za-z0-9_.,-]+$")
TIME_LIMIT = re.compile(r"^((\d+-)?\d+(:\d{1,2}){0,2}|\d+-\d+|UNLIMITED|INFINITE|unlimited|infinite)$")
CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,&|\[\]*:()!-]+$")
GRES = re.compile(r"^[A-Za-z0-9_:.,-]+$")
CONTROL_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class ScriptValueRejected(ValueError):
    """A value that cannot be written into an sbatch script safely; the message names the field."""


def check_name(field_name: str, value: str) -> str:
    """Names that become path components and job names: letters, digits, `.`, `_`, `-`."""
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise ScriptValueRejected(
            f"{field_name}={value!r} may hold only letters, digits, '.', '_' and '-' (not starting with "
            "'.', '_' or '-'): it names a directory and a Slurm job"
        )
    return value


def check_pattern(field_name: str, value: str, pattern: re.Pattern, rule: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ScriptValueRejected(f"{field_name}={value!r} {rule}")
    return value


def check_run_dir(run_dir: Path) -> str:
    return check_pattern(
        "run directory", str(run_dir), SBATCH_PATH,
        "must be an absolute path of letters, digits and . _ / + = , @ : - (it is written into #SBATCH "
        "lines, which sbatch splits on spaces and expands % in); choose another results_dir",
    )


def check_extra_sbatch(lines: Sequence[str]) -> List[str]:
    """Each line is safe to write as one #SBATCH line (no control characters) and passes the config's rule
    for extra options (harness.config.checks.sbatch_option_problems: one option, none the harness owns in
    any spelling, no % pattern)."""
    for index, line in enumerate(lines):
        if not isinstance(line, str) or CONTROL_CHARS.search(line):
            raise ScriptValueRejected(f"launcher.extra_sbatch[{index}]={line!r} must be one sbatch option such "
                                      "as '--mem=0' (one line: no newline or control character)")
    for field_name, value, why in sbatch_option_problems(lines):
        raise ScriptValueRejected(f"{field_name}={value!r} {why}")
    return list(lines)


def check_env_setup(lines: Sequence[str]) -> List[str]:
    """Shell lines by design (module load, source activate); one command per entry, no newlines."""
    for index, line in enumerate(lines):
        if not isinstance(line, str) or CONTROL_CHARS.search(line):
            raise ScriptValueRejected(f"launcher.env_setup[{index}]={line!r}: one shell line per entry, no newline")
    return list(lines)


def script_environment(env: Dict[str, str]) -> List[Tuple[str, str]]:
    """Non-secret variables the script exports; a credential-like name is refused, never written."""
    out = []
    for name, value in sorted(env.items()):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ScriptValueRejected(f"environment variable name {name!r} is not a shell identifier")
        if SECRET_NAME.search(name):
            raise ScriptValueRejected(
                f"{name} looks like a credential: it is passed through the submitting environment "
                "(--export=ALL), never written into a script"
            )
        out.append((name, str(value)))
    return out


# NCCL's own variables, from `launcher.nccl_*` (values checked by harness.config.checks, quoted here).
NCCL_HINTS = {"NCCL_DEBUG": "nccl_debug", "NCCL_SOCKET_IFNAME": "nccl_socket_ifname", "NCCL_IB_HCA": "nccl_ib_hca"}


def nccl_environment(cfg: RunConfig) -> List[Tuple[str, str]]:
    """The NCCL hints the job script exports: only those the launcher config sets."""
    values = {name: getattr(cfg.launcher, field) for name, field in NCCL_HINTS.items()}
    return [(name, str(value)) for name, value in values.items() if value is not None]


# ------------------------------------------------------------------------------------------- rendering


def resource_directives(cfg: RunConfig, nnodes: int, nproc_per_node: int) -> List[str]:
    """The #SBATCH options that decide where and how long a run executes: its resource shape.

    One task per node (the engine's launcher starts that node's ranks). CPU "accelerators" are CPU
    processes, so the task asks for one core each; GPUs are a gres, `launcher.gpus_per_node_gres` or
    `gpu:<accelerators_per_node>`.
    """
    launcher = cfg.launcher
    out = []
    for key in ("partition", "account", "qos"):
        value = getattr(launcher, key)
        if value:
            out.append(f"--{key}={check_pattern(f'launcher.{key}', value, PARTITION_LIKE, 'must be a Slurm name')}")
    out += [f"--nodes={nnodes}", "--ntasks-per-node=1"]
    if cfg.cluster.accelerator == "cpu":
        out.append(f"--cpus-per-task={nproc_per_node}")
    else:
        gres = launcher.gpus_per_node_gres or f"gpu:{nproc_per_node}"
        check_pattern("launcher.gpus_per_node_gres", gres, GRES, "must be a gres like gpu:8 or gpu:h100:8")
        out.append(f"--gres={gres}")
    check_pattern("launcher.time_limit", launcher.time_limit, TIME_LIMIT,
                  "must be a Slurm time such as 00:30:00 or 1-00:00:00")
    out.append(f"--time={launcher.time_limit}")
    if launcher.constraint:
        check_pattern("launcher.constraint", launcher.constraint, CONSTRAINT,
                      "must be a Slurm feature expression without spaces")
        out.append(f"--constraint={launcher.constraint}")
    if launcher.exclusive:
        out.append("--exclusive")
    # Node failure and preemption put the job back in the queue; the job-start hook archives what the
    # interrupted attempt left behind.
    out.append("--requeue")
    out += check_extra_sbatch(launcher.extra_sbatch)
    return out


def launch_line(argv: Sequence[str]) -> str:
    """One node's launch line: literal parts quoted, placeholders as the node's variables."""
    pattern = re.compile("|".join(re.escape(p) for p in NODE_VARIABLES))
    words = []
    for token in argv:
        parts, last = [], 0
        for match in pattern.finditer(token):
            if match.start() > last:
                parts.append(shlex.quote(token[last:match.start()]))
            parts.append(f'"${NODE_VARIABLES[match.group(0)]}"')
            last = match.end()
        if last < len(token) or not parts:
            parts.append(shlex.quote(token[last:]))
        words.append("".join(parts))
    return " ".join(words)


def node_command(argv: Sequence[str]) -> str:
    """What one node's srun task runs (`bash -c`): the launch line, exec'd, so that Slurm's signals (scancel,
    the time-limit warning) reach it directly; under the node's supervisor (`supervised`), which hands the
    warning to the ranks."""
    return "exec " + launch_line(argv)


def warning_directive(lead_s: int) -> str:
    """Slurm sends WARNING_SIGNAL to the job's tasks `lead_s` seconds before its time limit (sbatch(1) --signal)."""
    return f"--signal={WARNING_SIGNAL}@{int(lead_s)}"


def run_warning_lead(run_dir: Path) -> int:
    """The warning lead of a prepared run, from its plan's predicted step time (harness.plan.time_limit)."""
    plan = load_json(Path(run_dir) / PLAN_FILE) or {}
    return warning_lead_s(plan.get("step_time_s"))


def project_bin_dir(cfg: RunConfig) -> Optional[str]:
    """The bin directory of the Python that prepares the run (the project's virtual environment: its ninja,
    its launchers), put first on the job's PATH; None when launcher.env_setup provides the environment."""
    return None if cfg.launcher.env_setup else str(Path(sys.executable).parent)


def torch_extensions_dir() -> str:
    """Where the job's JIT-built ops live: TORCH_EXTENSIONS_DIR as set where the job is rendered, else the
    harness cache (the Makefile's default, ~/.cache/harness/torch_extensions)."""
    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    path = Path(configured).expanduser() if configured else Path.home() / ".cache" / "harness" / "torch_extensions"
    return str(path.resolve())


def supervised(cfg: RunConfig, run_dir: Path, argv: Sequence[str]) -> List[str]:
    """A node's launch line under the node's supervisor (harness.launch.watchdog --node), which records a
    rank killed by a signal: nothing else would (Slurm accounts for the launcher, one task per node)."""
    return [python_executable(cfg), "-m", "harness.launch.watchdog", NODE_FLAG, str(run_dir), "--", *argv]


def launcher_executable(cfg: RunConfig, name: str) -> str:
    """Without env_setup the job uses the launcher installed beside the Python that prepared it (as the
    local launcher does); with env_setup, whatever env_setup puts on PATH."""
    if cfg.launcher.env_setup:
        return name
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def python_executable(cfg: RunConfig) -> str:
    return "python" if cfg.launcher.env_setup else sys.executable


def template(name: str):
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = shlex.quote
    return env.get_template(name)


def job_name(sweep_name: str, run_name: str) -> str:
    return f"{check_name('sweep_name', sweep_name)}.{check_name('run name', run_name)}"


def render_job_script(cfg: RunConfig, rendered: RenderedRun, extra_env: Optional[Dict[str, str]] = None) -> str:
    """The text of `<run>/job.sbatch` for one prepared run."""
    run_dir = Path(rendered.run_dir)
    check_run_dir(run_dir)
    argv = list(rendered.argv)
    argv[0] = launcher_executable(cfg, argv[0])
    return template("job.sbatch.j2").render(
        run_dir=str(run_dir),
        job_name=job_name(cfg.sweep_name, run_dir.name),
        directives=[*resource_directives(cfg, rendered.nnodes, rendered.nproc_per_node),
                    warning_directive(run_warning_lead(run_dir))],
        python=python_executable(cfg),
        bin_dir=project_bin_dir(cfg),
        torch_extensions_dir=torch_extensions_dir(),
        warning_signal=WARNING_SIGNAL,
        env_setup=check_env_setup(cfg.launcher.env_setup),
        env=script_environment({**rendered.env, **(extra_env or {})}),
        nccl=nccl_environment(cfg),
        threads=thread_rule(cfg),
        job_cpus_line=JOB_CPUS_LINE,
        port_base=PORT_BASE,
        port_span=PORT_SPAN,
        nnodes=rendered.nnodes,
        node_command=node_command(supervised(cfg, run_dir, argv)),
    )


def write_job_script(cfg: RunConfig, rendered: RenderedRun, extra_env: Optional[Dict[str, str]] = None) -> Path:
    path = Path(rendered.run_dir) / JOB_SCRIPT
    write_text(path, render_job_script(cfg, rendered, extra_env), executable=True)
    return path


@dataclass(frozen=True)
class ArrayGroup:
    """Runs with one resource shape: they share an array's single resource request."""

    directives: Tuple[str, ...]
    concurrency: int
    run_dirs: Tuple[Path, ...]
    warning_lead_s: int = DEFAULT_LEAD_S  # the longest of its runs' (an array has one --signal)


def group_runs(runs: Iterable[Tuple[Path, RunConfig, RenderedRun]]) -> List[ArrayGroup]:
    """Group by the exact #SBATCH resource lines (and array concurrency), in first-seen order."""
    groups: Dict[Tuple[Tuple[str, ...], int], List[Path]] = {}
    for run_dir, cfg, rendered in runs:
        key = (tuple(resource_directives(cfg, rendered.nnodes, rendered.nproc_per_node)),
               max(1, int(cfg.launcher.array_concurrency)))
        groups.setdefault(key, []).append(Path(run_dir))
    return [ArrayGroup(directives, concurrency, tuple(dirs), max(run_warning_lead(d) for d in dirs))
            for (directives, concurrency), dirs in groups.items()]


def render_array_script(group: ArrayGroup, sweep_name: str, name: str, manifest: Path, log_dir: Path) -> str:
    for run_dir in group.run_dirs:
        check_run_dir(run_dir)
    check_run_dir(manifest)
    check_run_dir(log_dir)
    return template("array.sbatch.j2").render(
        count=len(group.run_dirs),
        sweep_name=sweep_name,
        job_name=job_name(sweep_name, name),
        name=check_name("array name", name),
        concurrency=group.concurrency,
        directives=[*group.directives, warning_directive(group.warning_lead_s)],
        manifest=str(manifest),
        log_dir=str(log_dir),
    )


@dataclass(frozen=True)
class Submission:
    """One sbatch call: an array (several runs) or a single run's own job.sbatch."""

    name: str
    script: Path
    job_id: Optional[str]  # None in a dry run
    run_dirs: Tuple[Path, ...]
    is_array: bool

    def job_key(self, index: int) -> Optional[str]:
        if self.job_id is None:
            return None
        return f"{self.job_id}_{index}" if self.is_array else self.job_id


def next_array_index(log_dir: Path) -> int:
    return 1 + max((int(m.group(1)) for p in log_dir.glob("array-*.sbatch")
                    if (m := re.match(r"array-(\d+)\.sbatch$", p.name))), default=0)


def write_group(group: ArrayGroup, sweep_dir: Path, sweep_name: str) -> Submission:
    """A group of one is its run's job.sbatch; a larger group gets a manifest and an array script."""
    if len(group.run_dirs) == 1:
        run_dir = group.run_dirs[0]
        return Submission(run_dir.name, run_dir / JOB_SCRIPT, None, group.run_dirs, is_array=False)
    log_dir = Path(sweep_dir) / SWEEP_SLURM_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    name = f"array-{next_array_index(log_dir):03d}"
    manifest = log_dir / f"{name}.manifest"
    write_text(manifest, "".join(f"{run_dir}\n" for run_dir in group.run_dirs))
    script = log_dir / f"{name}.sbatch"
    write_text(script, render_array_script(group, sweep_name, name, manifest, log_dir), executable=True)
    return Submission(name, script, None, group.run_dirs, is_array=True)
