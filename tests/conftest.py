"""Shared fixtures: every test runs with W&B offline and its caches inside the test's own folder."""

import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("DS_ACCELERATOR", "cpu")


@pytest.fixture
def no_wandb_key(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
