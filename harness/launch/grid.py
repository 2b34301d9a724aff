"""A sweep's grid: Hydra multirun overrides (and a sweep preset's axes) expanded into one override list per point."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from harness.config.compose import CONFIG_DIR, PRIMARY_CONFIG, compose_config
from harness.config.grid import expand_grid


class UsageError(ValueError):
    """The sweep was asked for in a way it cannot run; the message says what to change."""


def preset_override(overrides: Sequence[str]) -> List[str]:
    """`sweep=NAME` selects hydra_configs/sweep/NAME.yaml; appended (`+sweep=`) unless the primary
    config's defaults list already has a `sweep` entry."""
    defaults = yaml.safe_load((CONFIG_DIR / f"{PRIMARY_CONFIG}.yaml").read_text()).get("defaults", [])
    has_group = any(isinstance(d, dict) and any(k.split(" ")[-1] == "sweep" for k in d) for d in defaults)
    return [f"+{o}" if o.startswith("sweep=") and not has_group else o for o in overrides]


def grid_points(overrides: Sequence[str]) -> Tuple[List[List[str]], Dict[str, str], str]:
    """(one override list per point, the preset's sweeper params, the sweep directory Hydra would use).

    The preset's `hydra.sweeper.params` come first and command-line axes after them, the order of
    Hydra's basic sweeper; a command-line axis replaces a preset axis of the same key.
    """
    overrides = preset_override(overrides)
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    fixed = [text for text, override in zip(overrides, parsed) if not override.is_sweep_override()]
    base = compose_config(fixed, return_hydra_config=True)
    node = base.hydra.sweeper.get("params")
    params = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    sweep_dir = str(base.hydra.sweep.dir)
    axes = [f"{key}={value}" for key, value in params.items()]
    return expand_grid([*axes, *overrides]), {str(k): str(v) for k, v in params.items()}, sweep_dir


def make_unique_dir(path: Path) -> Path:
    """Create the timestamp folder, or `<timestamp>-N` when another sweep took it the same second."""
    path.parent.mkdir(parents=True, exist_ok=True)
    candidate, n = path, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            candidate, n = path.with_name(f"{path.name}-{n}"), n + 1
