"""A rank of a fake training job started by the real torchrun: no torch work, just the shapes of failure.

Every rank arms its fatal-signal report as the real ranks do, writes its pid to pids/rank<N> and sleeps.
Rank 0 watches rank 1 and, when it disappears, fails the way a gloo collective does when its peer dies
("Connection closed by peer"), writing its error record.
"""

import os
import sys
import time
from pathlib import Path

from harness.rundir import write_error
from harness.runtime.fatal_report import FatalReport

run_dir = Path(sys.argv[1])
rank = int(os.environ["RANK"])
FatalReport(run_dir, rank).arm()  # disarmed by no one: a rank that exits leaves an empty report
pids = run_dir / "pids"
pids.mkdir(exist_ok=True)
(pids / f"rank{rank}").write_text(str(os.getpid()))
deadline = time.time() + 120
if rank == 0:
    peer = pids / "rank1"
    while not peer.exists() and time.time() < deadline:
        time.sleep(0.05)
    peer_pid = int(peer.read_text())
    while time.time() < deadline:
        try:
            os.kill(peer_pid, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{peer_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.05)
    time.sleep(0.3)  # a real peer notices a little later than the kernel does
    error = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500")
    write_error(run_dir, 0, error)
    sys.exit(1)
while time.time() < deadline:
    time.sleep(0.1)
