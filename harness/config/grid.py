"""Expand Hydra multirun syntax (`layout.tp=1,2,4 layout.pp=range(1,3)`) into one override list per point."""

from __future__ import annotations

from typing import List, Sequence


def expand_grid(overrides: Sequence[str]) -> List[List[str]]:
    """The cartesian product Hydra's basic sweeper would run, in the same order."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [list(point) for batch in batches for point in batch]

