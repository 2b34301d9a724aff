"""Engines: each has a launch side (`check`, `render`: pure, writes the engine's files and launch line) and, unless
export only, a rank side (`construct`, `apply` -> session) — the protocols in `contract.py`, the engines in
`registry.py`."""

from __future__ import annotations

from harness.engines.contract import LaunchSide
from harness.engines.registry import launch_side


def engine_module(name: str) -> LaunchSide:
    """The launch side of engine `name` (what run preparation calls: check, render)."""
    return launch_side(name)
