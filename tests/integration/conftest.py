"""Fixtures of the multi-process CPU tests."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def results_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("results")
