"""Helpers of the fault suite: a fake two-rank job under the real torchrun, and process-tree checks."""

import sys
import time
from pathlib import Path
from typing import List

import psutil
import pytest

from harness.engines.rendered import MASTER_ADDR, MASTER_PORT, MONITOR_INTERVAL, NODE_RANK, RenderedRun

FAKE_RANK = Path(__file__).with_name("fake_rank.py")


def fake_job(run_dir: Path, nproc: int = 2, mode: str = "") -> RenderedRun:
    """torchrun (the venv's) starting `nproc` fake ranks in run_dir (`mode`: fake_rank.py's FAKE_RANK_MODE)."""
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return RenderedRun(
        run_dir=str(run_dir), engine="fake", launcher="torchrun", nnodes=1, nproc_per_node=nproc,
        argv=[torchrun, "--nnodes", "1", "--nproc_per_node", str(nproc), "--node_rank", NODE_RANK,
              "--master_addr", MASTER_ADDR, "--master_port", MASTER_PORT, *MONITOR_INTERVAL,
              str(FAKE_RANK), str(run_dir)],
        env={"FAKE_RANK_MODE": mode} if mode else {},
    )  # fmt: skip


def wait_for_ranks(run_dir: Path, nproc: int = 2, timeout_s: float = 90) -> List[int]:
    """The pids of every fake rank, once each has started."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        files = [run_dir / "pids" / f"rank{rank}" for rank in range(nproc)]
        if all(path.exists() and path.read_text() for path in files):
            return [int(path.read_text()) for path in files]
        time.sleep(0.1)
    raise AssertionError(f"the fake ranks did not start within {timeout_s} s")


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie has ended; only its exit status remains)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until_gone(pids: List[int], timeout_s: float = 30) -> List[int]:
    """The pids still running after `timeout_s` (empty when every one ended)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and any(running(pid) for pid in pids):
        time.sleep(0.1)
    return [pid for pid in pids if running(pid)]
