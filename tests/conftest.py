"""Shared fixtures: every test runs with W&B offline and its caches inside the test's own folder."""

import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# Printed tables fit COLUMNS when it is set (harness.terminal.terminal_width): the caller's own width would
# re-wrap the lines the tests read. Tests of the fitting set it themselves.
os.environ.pop("COLUMNS", None)


@pytest.fixture
def no_wandb_key(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def pytest_collection_modifyitems(items):
    """`make test` runs the `slurm` tests beside the others (tools/run_tests.sh): a test on the local cluster
    without the marker would start the cluster a second time, concurrently."""
    unmarked = [item.nodeid for item in items
                if "slurm_cluster" in item.fixturenames and item.get_closest_marker("slurm") is None]
    if unmarked:
        raise pytest.UsageError("tests on the local Slurm cluster need pytest.mark.slurm: " + ", ".join(unmarked))
