"""The fault suite's fixtures: an empty run directory, signal handlers restored after each test."""

import signal
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def signal_handlers_restored():
    """`harness.cli.main` makes SIGTERM interrupt like SIGINT; the test process gets its handlers back."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.fixture
def fake_run(tmp_path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return run_dir
