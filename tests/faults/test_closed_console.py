"""A console that goes away (`harness run ... | head`, a closed `less`) is an observer lost, not a failure: the run
goes on to its final state and writes its results, and the command prints no traceback."""

import json
import os
import subprocess
import sys

from harness import REPO_ROOT
from harness.terminal import print_fitted

ONE_RANK = ["recipes=cpu_zero2", "tracking=disabled", "layout=single", "cluster.accelerators_per_node=1",
            "bench.warmup_steps=2", "bench.warmup_max_steps=2", "bench.steps=2"]


def test_a_line_to_a_pipe_without_a_reader_is_dropped_and_so_is_every_later_one(tmp_path):
    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as stream:
        print_fitted("[harness] first line", stream)  # EPIPE: Python ignores SIGPIPE, so write() raises
        print_fitted("[harness] second line", stream)
        assert os.path.samestat(os.fstat(stream.fileno()), os.stat(os.devnull))


def test_a_run_whose_console_closes_before_its_first_line_completes_and_keeps_its_results(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", *ONE_RANK, f"results_dir={tmp_path}"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the harness writes anything
    _, err = proc.communicate(timeout=600)
    assert "Traceback" not in err, err[-4000:]
    assert proc.returncode == 0, err[-4000:]
    (status,) = tmp_path.rglob("status.json")
    assert json.loads(status.read_text())["state"] == "COMPLETED"
    assert json.loads((status.parent / "metrics.json").read_text())["measured"]["losses"]
    assert (status.parent.parent / "summary.csv").exists()
