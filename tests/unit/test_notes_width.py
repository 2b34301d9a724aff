"""The harness's own lines ("[harness] ..." notes, recommend's choices, report paths) fit the terminal the
tables fit: wrapped at COLUMNS (else the terminal's width) with their continuation indented, a word wider than
the terminal split but never cut; a pipe without COLUMNS gets every line whole."""

from __future__ import annotations

import os
import subprocess
import sys

from harness import REPO_ROOT
from harness.terminal import fit_text

NOTE = ("[harness] layout not given in full; filled for cluster=h100_8x8 (64 x h100_sxm): layout.dp_shard=64 "
        "(all 64 ranks); layout.zero_stage=3 (torchtitan's defaults); see "
        "/a/rather/long/results/folder/with/a/timestamp/20261126-151325/and/a/run/summary.csv")


def test_a_note_wraps_at_the_width_with_its_continuation_indented_and_nothing_cut():
    lines = fit_text("  " + NOTE, 40).splitlines()
    assert len(lines) > 3 and all(len(line) <= 40 for line in lines), lines
    assert lines[0].startswith("  [harness] ") and all(line.startswith("    ") for line in lines[1:])
    assert "".join(lines).replace(" ", "") == NOTE.replace(" ", "")  # every character kept


def test_without_a_width_every_line_is_kept_whole():
    assert fit_text(NOTE + "\nshort\n", None) == NOTE + "\nshort\n"
    assert fit_text("short\n\nlines", 40) == "short\n\nlines"


def harness(*args, columns=None):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.update({"COLUMNS": str(columns)} if columns else {})
    proc = subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_plan_notes_fit_columns_and_a_pipe_keeps_them_on_one_line():
    plan = ["plan", "model=llama3_1_70b", "cluster=h100_8x8", "engine=nd", "layout.tp=8"]
    fitted = harness(*plan, columns=80)
    assert fitted.returncode == 0, fitted.stderr
    assert "layout not given in full" in fitted.stderr and "launcher not given" in fitted.stderr
    assert max(len(line) for line in fitted.stderr.splitlines()) <= 80, fitted.stderr
    piped = harness(*plan)
    notes = [line for line in piped.stderr.splitlines() if line.startswith("[harness] ")]
    assert len(notes) == 2 and all(len(line) > 80 for line in notes), piped.stderr


def test_recommend_fits_columns():
    proc = harness("recommend", "--global-batch", "4", "--top", "2", "--no-write", "model=tiny_llama",
                   "engine=deepspeed", "cluster=local_slurm", "layout.seq_len=64", columns=80)
    assert proc.returncode == 0, proc.stderr
    assert "optimizer" in proc.stdout and "why #1 over #2" in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80, proc.stdout
