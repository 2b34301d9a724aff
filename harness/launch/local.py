"""Start a rendered run on this machine with its standard launcher, and classify how it ended."""

from __future__ import annotations

import errno
import os
import random
import signal
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from harness.config.schema import RunConfig
from harness.engines.rendered import LOCAL_PORTS, RenderedRun
from harness.launch.follow import StepFollower
from harness.launch.oom import KillEvidence, cgroup_oom_kills, host_oom
from harness.launch.run_lock import RunLock, live_holder
from harness.launch.watchdog import EXIT_TIMEOUT
from harness.runtime.progress import PROGRESS_FILE
from harness.rundir import (
    COMPLETED,
    FAILED,
    LAUNCH_LOG,
    OOM,
    RUNNING,
    TIMEOUT,
    metrics_written,
    read_status,
    state_from_files,
    write_status,
)

LOG_FILE = LAUNCH_LOG
LOOPBACK = "127.0.0.1"
# A prepared local run's line names torch.distributed's default port; every launch takes a free one.
DEFAULT_PORT = 29500
# The launchers' rendezvous port flags (harness.engines.rendered.launcher_argv).
PORT_FLAGS = ("--master_port", "--main_process_port")
PORT_DRAWS = 64


def free_port(draw: Callable[[range], int] = random.choice) -> int:
    """A rendezvous port nobody holds now, drawn at random from LOCAL_PORTS (harness.engines.rendered), so
    concurrent local runs and other programs' connections do not take it before the launcher binds it."""
    for _ in range(PORT_DRAWS):
        port = draw(LOCAL_PORTS)
        if _bindable(port):
            return port
    # an OSError: the command line's guard prints it as one line (harness.cli)
    raise OSError(errno.EADDRINUSE, f"no free rendezvous port in {LOCAL_PORTS.start}-{LOCAL_PORTS.stop - 1} "
                                    f"after {PORT_DRAWS} draws")


def _bindable(port: int) -> bool:
    """Whether a listener could bind `port` on every address now (the rendezvous store listens on all)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def resolve_executable(name: str) -> str:
    """Prefer the launcher installed beside this Python (the venv's), whatever PATH says."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def on_this_machine(rendered: RenderedRun, port: int) -> RenderedRun:
    """The run as this machine starts it: node 0, rendezvous on the loopback address at `port` (the line of
    an earlier local launch gets the new port). A local run's rendered.json holds this line."""
    argv = rendered.argv_for("0", LOOPBACK, str(port))
    for index, token in enumerate(argv[:-1]):
        if token in PORT_FLAGS:
            argv[index + 1] = str(port)
    return replace(rendered, argv=argv)


def for_backend(cfg: RunConfig, rendered: RenderedRun) -> RenderedRun:
    """What a prepared run's rendered.json holds: a local run's concrete line, or the placeholders the
    Slurm job script fills on each node."""
    return on_this_machine(rendered, DEFAULT_PORT) if cfg.launcher.backend == "local" else rendered


def rank_environment(rendered: RenderedRun, extra: Dict[str, str], threads: int = 1) -> Dict[str, str]:
    """The launcher's environment; `threads` per rank (harness.launch.threads) unless the caller set
    OMP_NUM_THREADS."""
    env = dict(os.environ)
    env.update(rendered.env)
    env.update(extra)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def classify(run_dir: Path, returncode: Optional[int], oom_kills: int = 0) -> Tuple[str, str]:
    """Final state from structured files and the exit code (never from log text); `oom_kills`: the rise
    of the memory cgroup's oom_kill counter during the run (a SIGKILLed launcher then reads as OOM)."""
    if returncode is None or returncode == EXIT_TIMEOUT:
        return TIMEOUT, read_status(run_dir).reason or "local time limit reached (launcher.timeout_s)"
    if returncode == 0 and metrics_written(run_dir):
        return COMPLETED, ""
    if returncode < 0:  # the watchdog itself was killed; the launcher and the ranks died with it
        name = signal.Signals(-returncode).name
        oom = host_oom(KillEvidence(signal=-returncode, cgroup_oom_kills=oom_kills))
        how = f"the run's watchdog was killed by {name}, and the launcher and its ranks with it"
        return (OOM, f"{oom}; {how}") if oom else (FAILED, how)
    # The ranks' records, root cause first. A non-zero exit after metrics.json is still a failure here
    # (the launcher saw a rank die). A rank killed by a signal writes nothing itself: the watchdog writes
    # its record, dated when the rank was last seen alive, so it sorts before its peers' "connection closed
    # by peer" that its death caused.
    from_files = state_from_files(run_dir, metrics_count=False)
    if from_files is not None:
        return from_files
    written = "after writing metrics.json" if metrics_written(run_dir) else "and no metrics.json"
    how = f"launcher exited with code {returncode} {written}"
    oom = host_oom(KillEvidence(exit_code=returncode, cgroup_oom_kills=oom_kills))
    return (OOM, f"{oom}; {how}") if oom else (FAILED, f"{how} (see {LOG_FILE})")


def _run_watched(run_dir: Path, argv: List[str], env: Dict[str, str], timeout_s: int) -> int:
    """Run the launcher under the watchdog; an interrupt of the harness stops the whole tree and re-raises."""
    command = [sys.executable, "-m", "harness.launch.watchdog", str(run_dir), str(os.getpid()), str(timeout_s),
               "--", *argv]
    with RunLock(run_dir) as lock:
        watchdog = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            lock.hand_to(watchdog.pid)
            return watchdog.wait()
        except BaseException:
            # The watchdog takes the tree down (every rank, in any session) and marks the run CANCELLED.
            watchdog.send_signal(signal.SIGTERM)
            _wait_through_interrupts(watchdog)
            raise


def _wait_through_interrupts(process: subprocess.Popen) -> None:
    """Wait for the watchdog to finish stopping the tree, even if the user presses Ctrl-C again."""
    while True:
        try:
            process.wait()
            return
        except KeyboardInterrupt:
            continue


def launch_local(rendered: RenderedRun, timeout_s: int, extra_env: Dict[str, str],
                 say: Optional[Callable[[str], None]] = None, threads: int = 1,
                 announce: Callable[[str], None] = lambda line: None) -> Tuple[str, str]:
    """Run a rendered single-node launch to its final state on a free port (saved in rendered.json, and
    `announce`d); `threads` per rank (harness.launch.threads); `say` gets rank 0's step lines as they come."""
    if rendered.nnodes != 1:
        raise ValueError(f"launcher=local starts one node; cluster.nodes={rendered.nnodes} needs launcher=slurm")
    run_dir = Path(rendered.run_dir)
    holder = live_holder(run_dir)
    if holder:  # a launch of this run is alive (a resumed sweep, a second `harness run`): leave it be
        return RUNNING, f"not started again: {holder}"
    rendered = on_this_machine(rendered, free_port())
    rendered = replace(rendered, argv=[resolve_executable(rendered.argv[0]), *rendered.argv[1:]])
    rendered.save()  # the line exactly as launched: its port and its launcher's path
    announce(rendered.command_line())
    argv = list(rendered.argv)
    (run_dir / LOG_FILE).write_bytes(b"")
    (run_dir / PROGRESS_FILE).unlink(missing_ok=True)  # an earlier launch's steps are not echoed again
    oom_kills = cgroup_oom_kills()
    with StepFollower(run_dir, say or (lambda line: None), prefix=f"[{run_dir.name}] "):
        returncode = _run_watched(run_dir, argv, rank_environment(rendered, extra_env, threads), timeout_s)
    state, reason = classify(run_dir, returncode, cgroup_oom_kills() - oom_kills)
    if state != COMPLETED or read_status(run_dir).state != COMPLETED:
        write_status(run_dir, state, reason)
    return state, reason
