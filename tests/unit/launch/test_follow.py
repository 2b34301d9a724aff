"""Rank 0's step lines reach the console as the launcher writes them, and nothing else of the log does."""

import time

from harness.launch.follow import StepFollower


def test_step_lines_are_echoed_while_the_log_grows_and_partial_lines_wait(tmp_path):
    log = tmp_path / "launch.log"
    log.write_bytes(b"")
    seen = []
    with StepFollower(log, seen.append, prefix="[run] ", interval_s=0.01):
        with open(log, "ab") as out:
            out.write(b"W1123 warning from torch\n[step 1/3 warm-up] loss 5.5")
            out.flush()
            time.sleep(0.2)
            assert seen == [], "a line is echoed only once it is complete"
            out.write(b"4 | mem 1.0 MiB\n[rank1]: noise\n[step 2/3] loss 5.4\n")
            out.flush()
            deadline = time.monotonic() + 5
            while len(seen) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert seen == ["[run] [step 1/3 warm-up] loss 5.54 | mem 1.0 MiB", "[run] [step 2/3] loss 5.4"]
            out.write(b"[step 3/3] loss 5.3\n")
    assert seen[-1] == "[run] [step 3/3] loss 5.3", "the last lines are read when the run ends"


def test_a_missing_log_is_not_an_error(tmp_path):
    seen = []
    with StepFollower(tmp_path / "absent.log", seen.append, interval_s=0.01):
        time.sleep(0.05)
    assert seen == []
