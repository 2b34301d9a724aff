"""Fixtures of the report tests: a synthetic sweep caught mid-way (see synthetic_runs.py)."""

from pathlib import Path

import pytest

from tests.unit.report.synthetic_runs import make_sweep


@pytest.fixture
def sweep_dir(tmp_path) -> Path:
    return make_sweep(tmp_path / "results")
