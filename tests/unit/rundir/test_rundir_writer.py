"""The one atomic writer: mode from the umask, a unique temporary name, and no partial file on failure."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from harness.rundir import atomic_path, write_json, write_text, write_with
from harness.rundir.writer import current_umask


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask():
    def set_mask(mask: int) -> None:
        os.umask(mask)

    previous = os.umask(0o022)
    yield set_mask
    os.umask(previous)


def test_mode_follows_the_umask(tmp_path, umask):
    umask(0o022)
    assert current_umask() == 0o022
    assert _mode(write_json(tmp_path / "a.json", {"x": 1})) == 0o644  # readable by team-mates, not 0600
    assert _mode(write_text(tmp_path / "job.sbatch", "#!/bin/bash\n", executable=True)) == 0o755
    umask(0o077)
    assert _mode(write_text(tmp_path / "b.txt", "private")) == 0o600


def test_unique_temporary_names_beside_the_target(tmp_path):
    target = tmp_path / "report.html"
    with atomic_path(target) as first, atomic_path(target) as second:
        assert first != second and first.parent == second.parent == tmp_path
        assert first.name.startswith(".report.html.") and first.name.endswith(".tmp")
        first.write_text("one")
        second.write_text("two")
    assert target.read_text() == "one"  # the outer writer renamed last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_concurrent_writers_never_leave_a_mixed_or_partial_file(tmp_path):
    target = tmp_path / "status.json"
    payloads = [{"writer": i, "pad": "x" * 100_000} for i in range(8)]
    threads = [threading.Thread(target=write_json, args=(target, p)) for p in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    import json

    assert json.loads(target.read_text()) in payloads
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "summary.parquet"
    target.write_text("old")

    def half_then_fail(path: Path) -> None:
        path.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_with(target, half_then_fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.parquet"]


def test_unserialisable_json_leaves_nothing(tmp_path):
    class Opaque:
        def __repr__(self):
            raise RuntimeError("cannot say")

    with pytest.raises(RuntimeError):
        write_json(tmp_path / "plan.json", {"x": Opaque()})
    assert list(tmp_path.iterdir()) == []
