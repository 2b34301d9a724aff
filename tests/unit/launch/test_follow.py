"""Rank 0's step lines reach the console from the run's progress.jsonl as rank 0 appends to it: whole
records only, the same lines the rank prints, and a new attempt's file read from its start."""

import time

from harness.launch.follow import StepFollower
from harness.runtime.progress import PROGRESS_FILE, StepRecord

WARM = StepRecord(1, 3, True, 5.54, None, None, None, 2**20)
TIMED = [StepRecord(2, 3, False, 5.4, 0.0314, 8155.0, 0.028, 2**20), StepRecord(3, 3, False, 5.3, 0.03, 8000.0, None, None)]


def test_step_lines_are_echoed_while_the_file_grows_and_partial_records_wait(tmp_path):
    progress = tmp_path / PROGRESS_FILE
    progress.write_bytes(b"")
    seen = []
    with StepFollower(tmp_path, seen.append, prefix="[run] ", interval_s=0.01):
        with open(progress, "a") as out:
            line = WARM.json_line()
            out.write(line[:10])
            out.flush()
            time.sleep(0.2)
            assert seen == [], "a record is echoed only once it is complete"
            out.write(line[10:] + "not json\n" + TIMED[0].json_line())
            out.flush()
            deadline = time.monotonic() + 5
            while len(seen) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert seen == [f"[run] {WARM.line()}", f"[run] {TIMED[0].line()}"]
            assert seen[1] == ("[run] [step 2/3] loss 5.4000 | 8,155 tokens/s | MFU 2.8% | memory 1.0 MiB "
                               "| step time 31.4 ms")
            out.write(TIMED[1].json_line())
    assert seen[-1] == f"[run] {TIMED[1].line()}", "the last records are read when the run ends"


def test_a_new_attempt_is_read_from_its_start(tmp_path):
    seen = []
    follower = StepFollower(tmp_path, seen.append)
    (tmp_path / PROGRESS_FILE).write_text(WARM.json_line() + TIMED[0].json_line())
    follower.read_new_lines()
    (tmp_path / PROGRESS_FILE).write_text(WARM.json_line())  # the next attempt's rank 0 started the file again
    follower.read_new_lines()
    assert seen == [WARM.line(), TIMED[0].line(), WARM.line()]


def test_a_missing_file_is_not_an_error(tmp_path):
    seen = []
    with StepFollower(tmp_path / "absent", seen.append, interval_s=0.01):
        time.sleep(0.05)
    assert seen == []
