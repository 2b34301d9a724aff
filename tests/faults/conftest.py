"""The fault suite's fixture: an empty run directory."""

from pathlib import Path

import pytest


@pytest.fixture
def fake_run(tmp_path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return run_dir
