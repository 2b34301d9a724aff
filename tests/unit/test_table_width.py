"""Every table fits the terminal (COLUMNS, else the terminal's width; a pipe gets full width), names the columns
it left out and how to see them, wraps free text and never cuts a value."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from functools import lru_cache

import pytest

from harness import REPO_ROOT
from harness.terminal import Column, fit_columns, print_table, table_width

MEGATRON = "recipes=gpu_llama405b_megatron_tp8_pp16"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
DROPPED = re.compile(r"(\d+) column\(s\) left out to fit (\d+) columns: (.*?) \((--wide[^)]*)\)", re.S)


@lru_cache(maxsize=None)
def harness(command, *args, columns=None):
    """The command's stdout, run in this process (COLUMNS as given, else unset; stdout is not a terminal)."""
    from harness import cli

    saved = os.environ.pop("COLUMNS", None)
    if columns is not None:
        os.environ["COLUMNS"] = str(columns)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            {"plan": cli.plan_command, "sweep": cli.sweep_command, "doctor": cli.doctor_command}[command](list(args))
    finally:
        os.environ.pop("COLUMNS", None)
        if saved is not None:
            os.environ["COLUMNS"] = saved
    return out.getvalue()


def flat(text: str) -> str:
    """The printed text without layout: wrapped cells compare equal to the whole value."""
    return re.sub(r"[\s\u2500-\u257f]", "", text)


def dropped_headers(out: str) -> list:
    match = DROPPED.search(" ".join(out.split()))
    return [] if match is None else match.group(3).split(", ")


def assert_fits(out: str, width: int) -> None:
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width, "\n".join(line for line in lines if len(line) > width)
    assert "…" not in out


def wide_headers(args) -> list:
    """The headers of the full table (`--wide`), from its header line."""
    out = harness("plan", *args, "--wide")
    header = next(line for line in out.splitlines() if line.lstrip().startswith("layout"))
    return [cell.strip() for cell in re.split(r"\s{2,}", header.strip())]


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_plan_fits_and_names_every_column_it_leaves_out(columns):
    args = (MEGATRON, "layout.tp=4,8")
    out = harness("plan", *args, columns=columns)
    assert_fits(out, columns)
    every = wide_headers(args)
    left_out = dropped_headers(out)
    header = flat(out.split("───")[0].split("\n", 1)[1])  # the header lines, below the title
    assert set(left_out) <= set(every), out
    assert [h for h in every if flat(h) in header] == [h for h in every if h not in left_out], out
    if left_out:
        assert "--wide shows every column, --json every field" in " ".join(out.split())
    # the refused layout's whole reason is there, wrapped, not cut
    rows = json.loads(harness("plan", *args, "--json"))
    reason = next(row["errors"] for row in rows if row["errors"])
    assert flat(reason) in flat(out)


def test_megatron_recipe_at_80_columns_keeps_its_label_and_numbers():
    out = harness("plan", MEGATRON, columns=80)
    assert_fits(out, 80)
    (row,) = json.loads(harness("plan", MEGATRON, "--json"))
    assert all(part in out for part in row["label"].split())
    assert "mem/rank" in out and f"{row['tokens_per_s']:,.0f}" in out
    assert dropped_headers(out)


def test_wide_shows_every_column_and_a_pipe_is_not_squeezed():
    wide = harness("plan", MEGATRON, "--wide", columns=80)
    piped = harness("plan", MEGATRON)  # no COLUMNS, not a terminal: full width
    for out in (wide, piped):
        assert not dropped_headers(out) and "…" not in out
        assert all(header in out for header in ("margin", "GFLOP/token", "tokens/step", "pred MFU (%)"))
    label = json.loads(harness("plan", MEGATRON, "--json"))[0]["label"]
    assert any(label in line for line in piped.splitlines())  # one line per layout


def test_plan_in_a_pseudo_terminal_fits_its_width():
    """No COLUMNS: the width is the terminal's own (TIOCSWINSZ on a pseudo-terminal)."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 90, 0, 0))
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "plan", MEGATRON, "layout.tp=4,8"],
                            cwd=REPO_ROOT, stdin=follower, stdout=follower, stderr=follower,
                            env={**env, "PYTHONPATH": str(REPO_ROOT), "TERM": "dumb"})
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=300)
    os.close(leader)
    out = ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")
    assert "Traceback" not in out and "layout" in out, out
    assert_fits(out, 90)
    assert dropped_headers(out)


SLURM_HINT = ("sinfo failed: sinfo: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host "
              "(SLURM_CONF unset: `make slurm-up` prints it)")


def test_doctor_wraps_its_hints_at_80_columns(monkeypatch):
    from harness import doctor

    facts = [doctor.Fact(doctor.PASS, "python", "3.11.7"), doctor.Fact(doctor.WARN, "slurm", SLURM_HINT),
             doctor.Fact(doctor.WARN, "deepspeed op async_io", "not compatible on this machine (NVMe offload; "
                                                               "needs Debian's libaio-dev) " + "x" * 90)]
    monkeypatch.setattr(doctor, "gather", lambda: facts)
    out = harness("doctor", columns=80)
    assert_fits(out, 80)
    for fact in facts:  # the whole detail, wrapped under itself
        assert flat(fact.detail) in flat(out)
    assert all(line.startswith((doctor.PASS, doctor.WARN, " ")) for line in out.splitlines()[:-1])
    wide = harness("doctor", "--wide", columns=80)
    assert any(SLURM_HINT in line for line in wide.splitlines())


def test_priorities_drop_whole_columns_highest_number_first():
    columns = [Column("a"), Column("b", 2), Column("c", 1), Column("why", wrap=True)]
    natural = [10, 10, 10, 60]
    assert fit_columns(columns, natural, None).dropped == []
    fitted = fit_columns(columns, natural, 60)
    assert fitted.dropped == ["b"] and table_width(list(fitted.widths.values())) <= 60
    assert fit_columns(columns, natural, 40).dropped == ["b", "c"]
    # "narrow" goes first (the rightmost of priority 1), then "wide"; without "wide", "narrow" fits again
    columns = [Column("a"), Column("wide", 1), Column("narrow", 1)]
    assert fit_columns(columns, [10, 30, 5], 30).dropped == ["wide"]


def test_a_value_wider_than_the_terminal_is_folded_not_cut(capsys):
    value = "x" * 50 + " tail"
    dropped = print_table([Column("name"), Column("v", 1)], [[value, "1"]], width=30)
    out = capsys.readouterr().out
    assert dropped == ["v"] and flat(value) in flat(out)
    assert max(len(line) for line in out.splitlines()) <= 30


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_run_and_sweep_tables_honour_columns(sweep_dir, capsys, monkeypatch, columns):
    from harness.launch.status import print_status, refresh
    from harness.report.table import measured_cells, print_table as print_runs, summary_frame
    from harness.rundir import run_dirs

    monkeypatch.setenv("COLUMNS", str(columns))
    frame = summary_frame([sweep_dir])
    views = refresh(run_dirs(sweep_dir), query_slurm=False)
    for show, reasons in ((lambda wide: print_runs(frame, title=str(sweep_dir), wide=wide), frame["reason"]),
                          (lambda wide: print_status(str(sweep_dir), views, measured=measured_cells(frame),
                                                     wide=wide), [view.reason for view in views])):
        capsys.readouterr()
        dropped = show(False)
        out = capsys.readouterr().out
        assert_fits(out, columns)
        for reason in reasons:
            assert flat(reason or "") in flat(out)
        wide_dropped = show(True)
        wide = capsys.readouterr().out
        assert wide_dropped == [] and all(header in wide for header in dropped)
        if dropped:
            assert dropped_headers(out) == dropped
            assert "--wide shows every column" in " ".join(out.split())


@pytest.fixture
def sweep_dir(tmp_path):
    from tests.unit.report.synthetic_runs import make_sweep

    sweep_dir = make_sweep(tmp_path / "results")
    (sweep_dir / "sweep.json").write_text(json.dumps({"sweep_name": "synthetic", "launcher": "local",
                                                      "args": [], "params": {}, "points": []}))
    return sweep_dir


def test_sweep_status_takes_wide(sweep_dir):
    narrow = harness("sweep", "status", str(sweep_dir), columns=80)
    # the table; the lines after it name files, whose paths are as long as the folder they are in
    assert_fits("\n".join(line for line in narrow.splitlines() if not line.startswith("[harness]")), 80)
    assert dropped_headers(narrow)
    wide = harness("sweep", "status", str(sweep_dir), "--wide", columns=80)
    assert not dropped_headers(wide) and all(header in wide for header in dropped_headers(narrow))


def test_run_takes_wide_and_leaves_hydra_its_arguments(monkeypatch):
    from harness import cli

    monkeypatch.setattr(cli, "_run_options", {"wait": True, "poll_s": None, "wide": False})
    assert cli._take_run_options(["--wide", "layout.tp=2"]) == ["layout.tp=2"]
    assert cli._run_options["wide"] is True
