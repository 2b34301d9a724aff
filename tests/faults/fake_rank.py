"""A rank of a fake training job started by the real torchrun: no torch work, just the shapes of failure.

Every rank ties itself to its launcher and arms its fatal-signal report as the real ranks do (bench.main),
starts a short-lived child that inherits its environment (as a real rank's compiler or linker does),
writes its pid to pids/rank<N> and sleeps. Rank 0 watches rank 1 and, when it disappears, fails the way a
gloo collective does when its peer dies ("Connection closed by peer"), writing its error record.
FAKE_RANK_MODE=succeed: every rank ends well instead, rank 0 writing metrics.json. FAKE_RANK_MODE=unaware:
rank 0 does not notice its peer's death (as a GPU rank waiting in an NCCL collective) until the launcher kills it.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

from harness.rundir import METRICS_FILE, write_error
from harness.runtime.fatal_report import FatalReport
from harness.runtime.lifecycle import die_with_parent

run_dir = Path(sys.argv[1])
rank = int(os.environ["RANK"])
die_with_parent()
report = FatalReport(run_dir, rank).arm()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])  # RANK inherited
pids = run_dir / "pids"
pids.mkdir(exist_ok=True)
(pids / f"rank{rank}").write_text(str(os.getpid()))
child.wait()
if os.environ.get("FAKE_RANK_MODE") == "succeed":
    time.sleep(0.5)
    report.disarm()
    if rank == 0:
        (run_dir / METRICS_FILE).write_text("{}")
    sys.exit(0)
deadline = time.time() + 120
if rank == 0 and os.environ.get("FAKE_RANK_MODE") != "unaware":
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
