"""The process that owns a local run's process tree: it dies with the harness, enforces the time limit, and
records how each rank ended.

`python -m harness.launch.watchdog RUN_DIR HARNESS_PID TIMEOUT_S -- LAUNCHER ARGV...` is started by
harness.launch.local in its own session. torchrun starts every rank in a session of its own, so killing a
process group cannot reach them; the watchdog instead walks its descendants (as a child subreaper, ranks
orphaned by a dead launcher stay its descendants). A parent-death signal tells it when the harness is gone,
even by SIGKILL; the time limit is its own, so it holds without the harness.

`python -m harness.launch.watchdog --node RUN_DIR -- LAUNCHER ARGV...` supervises one node's launcher inside
a Slurm job the same way (harness.launch.sbatch.node_command), where only the rank records are its job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import psutil

from harness.launch.oom import KillEvidence, cgroup_oom_kills, host_oom
from harness.plan.time_limit import WARNING_SIGNAL
from harness.rundir import (
    CANCELLED,
    LAUNCH_LOG,
    TIMEOUT,
    RankError,
    error_file,
    read_fatal_reports,
    write_json,
    write_status,
)
from harness.runtime.lifecycle import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, prctl

# `python -m harness.launch.watchdog --node RUN_DIR -- LAUNCHER ARGV...`: one node of a Slurm job.
NODE_FLAG = "--node"
# Exit codes the harness reads back (beside the launcher's own, which is passed through).
EXIT_TIMEOUT = 124  # as coreutils `timeout`
EXIT_STOPPED = 130  # the harness died or asked the run to stop
POLL_S = 0.02  # short enough to see a dead rank before its launcher reaps it (torchrun polls every 0.1 s)
DISCOVER_EVERY = 5
GRACE_S = 10.0  # SIGTERM, then SIGKILL: ranks get this long to flush
# A rank whose CPU time has not grown for this long is hung: the kernel counts CPU time in ticks of
# 1-10 ms, and a live rank, even one waiting in a collective, polls far more often than that.
STALL_S = 10.0
# Slurm's warning ahead of the time limit (sbatch --signal) reaches only the node's task, this supervisor;
# it hands it to the ranks every WARNING_REPEAT_S until the launcher ends: a rank still starting has the
# inherited "ignore" until its own handler is set (harness.runtime.lifecycle), so one hand-over could be lost.
WARNING_SIGNUM = signal.Signals[f"SIG{WARNING_SIGNAL}"]
WARNING_REPEAT_S = 5.0


class Stop(Exception):
    """SIGTERM / SIGINT / the parent-death signal reached the watchdog."""

    def __init__(self, message: str, signum: int = signal.SIGTERM):
        super().__init__(message)
        self.signum = signum


@dataclass
class RankSeen:
    pid: int
    rank: int
    last_alive: float
    rss: int = 0
    available: int = 0
    exit_status: Optional[int] = None  # waitpid-style status read from the zombie, when caught
    cpu_ticks: int = 0  # user + system time so far, in clock ticks
    last_progress: float = 0.0  # when its CPU time last grew (or it was first seen)
    stopped_since: Optional[float] = None  # stopped by a signal (SIGSTOP, SIGTSTP) or a tracer since then
    seen_gone: Optional[float] = None  # the first sample that found it ended: it died after last_alive, by then

    @property
    def stopped(self) -> bool:
        return self.stopped_since is not None

    def observe(self, now: float, available: int, state: "ProcState") -> None:
        self.last_alive, self.available = now, available
        self.rss = max(self.rss, state.rss)
        if state.letter not in STOPPED_STATES:
            self.stopped_since = None
        elif self.stopped_since is None:
            self.stopped_since = now
        if state.cpu_ticks > self.cpu_ticks:
            self.cpu_ticks, self.last_progress = state.cpu_ticks, now

    def stalled_since(self) -> float:
        return self.stopped_since if self.stopped_since is not None else self.last_progress


@dataclass
class Tree:
    """The launcher and the ranks under it, sampled every POLL_S."""

    launcher: subprocess.Popen
    ranks: Dict[int, RankSeen] = field(default_factory=dict)
    gone: List[RankSeen] = field(default_factory=list)
    samples: int = 0

    def sample(self) -> None:
        now = time.time()
        available = psutil.virtual_memory().available
        # Looking for new ranks walks the launcher's tree: a few times a second is enough.
        if self.samples % DISCOVER_EVERY == 0:
            known = {*self.ranks, *(seen.pid for seen in self.gone)}
            for pid, rank in rank_processes(self.launcher.pid).items():
                if pid not in known:
                    self.ranks[pid] = RankSeen(pid, rank, now, available=available, last_progress=now)
        self.samples += 1
        for pid, seen in list(self.ranks.items()):
            state = _proc_state(pid)
            if state is None or state.letter == "Z":
                seen.exit_status, seen.seen_gone = (state.exit_status if state else None), now
                self.gone.append(self.ranks.pop(pid))
                continue
            seen.observe(now, available, state)

    def stalled(self) -> List[RankSeen]:
        """The ranks that stopped making progress: those stopped by a signal, else the one whose CPU time
        last grew longest ago, at least STALL_S ago (a hung rank's peers wait for it in a collective, still
        polling, so their CPU time grows)."""
        live = sorted(self.ranks.values(), key=lambda seen: (not seen.stopped, seen.stalled_since(), seen.rank))
        stopped = [seen for seen in live if seen.stopped]
        if stopped:
            return stopped
        return [seen for seen in live[:1] if time.time() - seen.stalled_since() >= STALL_S]


def _descendants(pid: int) -> List[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def rank_processes(launcher_pid: int) -> Dict[int, int]:
    """{pid: rank} of the launcher's ranks: in its process tree, the topmost processes that carry a rank.

    A launcher starts each rank with RANK set (torchrun and accelerate as their own children, DeepSpeed's
    runner one level further down, under its per-node launch.py), and every process a rank starts in turn
    (a compiler, a linker, a forked Python) inherits RANK: those are below a rank, never ranks."""
    processes = _descendants(launcher_pid)
    parent_of = {}
    carriers = {}
    for process in processes:
        try:
            parent_of[process.pid] = process.ppid()
            rank = process.environ().get("RANK")
        except psutil.Error:
            continue
        if rank is not None and rank.isdigit():
            carriers[process.pid] = int(rank)
    return {pid: rank for pid, rank in carriers.items() if not _below_a_carrier(pid, parent_of, carriers)}


def _below_a_carrier(pid: int, parent_of: Dict[int, int], carriers: Dict[int, int]) -> bool:
    parent = parent_of.get(pid)
    while parent in parent_of:  # stops at the launcher, outside the map of its descendants
        if parent in carriers:
            return True
        parent = parent_of[parent]
    return False


# /proc/PID/stat letters of a process stopped by a signal (T) or a tracer (t).
STOPPED_STATES = ("T", "t")


@dataclass(frozen=True)
class ProcState:
    letter: str
    exit_status: Optional[int]  # of a zombie
    rss: int  # bytes
    cpu_ticks: int  # user + system


def _proc_state(pid: int) -> Optional[ProcState]:
    """A process's state from /proc/PID/stat (proc(5)); None when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # Fields after the command (proc(5) numbers them from 1): state is field 3, utime 14, stime 15,
    # rss (pages) 24, exit_code 52 (Linux 3.5+); fields[i] is field i + 3.
    exit_status = int(fields[49]) if fields[0] == "Z" and len(fields) > 49 else None
    return ProcState(fields[0], exit_status, int(fields[21]) * os.sysconf("SC_PAGE_SIZE"),
                     int(fields[11]) + int(fields[12]))


def kill_tree(root: int, grace_s: float = GRACE_S) -> None:
    """SIGTERM every descendant of `root` (any session), then SIGKILL what is left after `grace_s`."""
    try:
        processes = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return
    for process in processes:
        _signal(process, signal.SIGTERM)
        _signal(process, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        _signal(process, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)


def _signal(process: psutil.Process, signum: int) -> None:
    try:
        process.send_signal(signum)
    except psutil.Error:
        pass


def record_signal_deaths(run_dir: Path, gone: List[RankSeen], total_memory: int, oom_kills: int = 0) -> None:
    """errors/rank<N>.json for each rank that died without writing its own (a signal leaves no record),
    dated so that the first failure sorts first (_death_time). `oom_kills`: how far the memory cgroup's
    oom_kill counter rose during the run (harness.launch.oom decides what is OOM)."""
    reports = read_fatal_reports(run_dir)
    fatal_times = [report.time for report in reports if report.time is not None]
    for seen in gone:
        path = run_dir / error_file(seen.rank)
        status = seen.exit_status
        if path.exists() or (status is not None and os.WIFEXITED(status)):
            continue
        if any(report.rank == seen.rank for report in reports):
            continue  # the rank wrote its own stack as the signal killed it (harness.runtime.fatal_report)
        signum = os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None
        name = signal.Signals(signum).name if signum else "killed"
        oom = host_oom(KillEvidence(signal=signum, cgroup_oom_kills=oom_kills, host_available=seen.available,
                                    host_total=total_memory))
        how = f"exit signal {signum} ({name})" if signum else "ended without an error record or exit status"
        evidence = (f"; host memory available {seen.available / 2**30:.2f} of {total_memory / 2**30:.2f} GiB, "
                    f"rank RSS {seen.rss / 2**30:.2f} GiB at the last sample")
        # the verdict first: a status reason keeps the first 300 characters (RankError.reason)
        message = (f"{oom}; " if oom else "") + f"{how}{evidence}"
        write_json(path, RankError(seen.rank, name, message, oom is not None).to_dict())
        when = _death_time(seen, fatal_times)
        os.utime(path, (when, when))


# How much later than a peer's fatal-signal report a death it may have caused is dated.
AFTER_THE_CRASH_S = 1e-3


def _death_time(seen: RankSeen, fatal_times: List[float]) -> float:
    """When a rank that left no record of its own died, for ordering: the last time it was seen alive, as it
    died after that. A peer's fatal-signal report dated between then and the sample that found it gone leaves
    the order unknown (a loaded host can keep the watchdog off the CPU for that long). A fatal signal is the
    crashing rank's own fault, while a death without a record is as likely the launcher's cleanup after it:
    the death is then dated just after the report."""
    found_gone = seen.seen_gone if seen.seen_gone is not None else seen.last_alive
    overlapping = [when for when in fatal_times if seen.last_alive < when <= found_gone]
    return min(overlapping) + AFTER_THE_CRASH_S if overlapping else seen.last_alive


def supervise(run_dir: Path, harness_pid: int, timeout_s: float, argv: List[str]) -> int:
    """Run the launcher to its end, the time limit, or the harness's death; the exit code says which."""
    deadline = time.monotonic() + timeout_s
    with open(run_dir / LAUNCH_LOG, "ab") as log:
        launcher = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=_die_with_watchdog)
    tree = Tree(launcher)
    total_memory = psutil.virtual_memory().total
    oom_kills_before = cgroup_oom_kills()
    try:
        while launcher.poll() is None:
            if os.getppid() != harness_pid:
                raise Stop("the harness died")
            if time.monotonic() > deadline:
                stalled = stall_reason(tree.stalled(), time.time())
                kill_tree(os.getpid())
                write_status(run_dir, TIMEOUT, f"local time limit reached (launcher.timeout_s={timeout_s:g})"
                                               + (f"; {stalled}" if stalled else ""))
                return EXIT_TIMEOUT
            tree.sample()
            time.sleep(POLL_S)
    except Stop as stop:
        kill_tree(os.getpid())
        write_status(run_dir, CANCELLED, f"stopped: {stop}")
        return EXIT_STOPPED
    tree.sample()
    if launcher.returncode != 0:  # a launcher that exited 0 saw every rank end well: nothing to record
        record_signal_deaths(run_dir, tree.gone, total_memory, cgroup_oom_kills() - oom_kills_before)
    kill_tree(os.getpid(), grace_s=2.0)  # anything the launcher left behind
    return launcher.returncode


def supervise_node(run_dir: Path, argv: List[str]) -> int:
    """One node's launcher inside a Slurm job, to its end: the ranks killed by a signal get their records
    (a SIGKILL leaves none of its own, and Slurm's accounting sees only the launcher, one task per node);
    Slurm's signals (scancel, the time limit) and the death of the job step stop the tree. Slurm keeps
    the time and the run's state; the launcher's output goes to the job's log; the exit code is the
    launcher's, or 128 + the signal that stopped the node."""
    relay = WarningRelay()
    signal.signal(WARNING_SIGNUM, relay.note)
    launcher = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_node_launcher_setup)
    tree = Tree(launcher)
    total_memory = psutil.virtual_memory().total
    oom_kills_before = cgroup_oom_kills()
    try:
        while launcher.poll() is None:
            tree.sample()
            relay.hand_over(tree.ranks)
            time.sleep(POLL_S)
    except Stop as stop:
        kill_tree(os.getpid())
        return 128 + stop.signum
    tree.sample()
    if launcher.returncode != 0:
        record_signal_deaths(run_dir, tree.gone, total_memory, cgroup_oom_kills() - oom_kills_before)
    kill_tree(os.getpid(), grace_s=2.0)
    return launcher.returncode if launcher.returncode >= 0 else 128 - launcher.returncode


class WarningRelay:
    """Slurm's time-limit warning, noted when it reaches the node's supervisor and handed to the ranks."""

    def __init__(self) -> None:
        self.received = False
        self.last_hand_over = float("-inf")

    def note(self, _signum, _frame) -> None:
        self.received = True

    def hand_over(self, ranks: Dict[int, "RankSeen"]) -> None:
        if not self.received or time.monotonic() - self.last_hand_over < WARNING_REPEAT_S:
            return
        self.last_hand_over = time.monotonic()
        for pid in list(ranks):
            try:
                os.kill(pid, WARNING_SIGNUM)
            except ProcessLookupError:
                pass


def stall_reason(stalled: List[RankSeen], now: float) -> str:
    """Which rank hung a run that reached its time limit: the one stopped by a signal, or the one that
    stopped making progress first (its peers then wait for it in a collective)."""
    if not stalled:
        return ""
    names = ", ".join(str(seen.rank) for seen in stalled)
    how = "stopped by a signal (SIGSTOP or SIGTSTP)" if stalled[0].stopped else "made no progress"
    return f"rank {names} {how} for the last {now - stalled[0].stalled_since():.0f} s"


def _die_with_watchdog() -> None:
    """In the launcher, before exec: SIGTERM when the watchdog dies (even by SIGKILL), so that the launcher
    stops its ranks, which die with it in turn (harness.runtime.lifecycle, armed by each rank)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _node_launcher_setup() -> None:
    """In a Slurm node's launcher, before exec: die with the supervisor, and ignore the time-limit warning
    (torchrun would die of it; the ignore is inherited by the ranks until they set their own handler)."""
    _die_with_watchdog()
    signal.signal(WARNING_SIGNUM, signal.SIG_IGN)


def _stop(signum, _frame) -> None:
    raise Stop(f"{signal.Signals(signum).name} received (the harness was interrupted or died)", signum)


def main(args: List[str]) -> int:
    argv = args[args.index("--") + 1:]
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stop)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if args[0] == NODE_FLAG:  # one node of a Slurm job (harness.launch.sbatch.node_command)
        try:
            return supervise_node(Path(args[1]), argv)
        except Stop as stop:
            kill_tree(os.getpid())
            return 128 + stop.signum
    run_dir, harness_pid, timeout_s = Path(args[0]), int(args[1]), float(args[2])
    if os.getppid() != harness_pid:  # the harness died before the death signal was armed
        return EXIT_STOPPED
    try:
        return supervise(run_dir, harness_pid, timeout_s, argv)
    except Stop as stop:  # a signal between two checks of the loop
        kill_tree(os.getpid())
        write_status(run_dir, CANCELLED, f"stopped: {stop}")
        return EXIT_STOPPED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

