"""The engine registry: one entry per engine name, from which every per-engine lookup of the harness is made.

The names are `harness.config.schema.EngineName` (config validates them at composition, and config and plan
sit below the engines, so they cannot import this module); every other per-engine table is keyed by those
names and gathered here: the option dataclass (`schema.ENGINE_OPTIONS`), the `hydra_configs/engine/` files,
the planner's capability row (`plan.support.ENGINE_SUPPORT`), its state-byte conventions
(`plan.conventions.STATE_CONVENTIONS`), and the engine's launch-side and rank-side modules.
`registry_problems()` lists every gap; tests/unit/engines/test_registry.py fails on any.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Mapping, Optional, Tuple, Type

import yaml

from harness import REPO_ROOT
from harness.config.schema import ENGINE_OPTIONS, EngineConfig, EngineName, Precision, allowed
from harness.engines.contract import LaunchSide, RankSide
from harness.plan.conventions import STATE_CONVENTIONS
from harness.plan.support import ENGINE_SUPPORT, EngineSupport

ENGINE_CONFIG_DIR = REPO_ROOT / "hydra_configs" / "engine"


@dataclass(frozen=True)
class Engine:
    """One engine: its name, the modules of its two sides, and its `engine` config group files."""

    name: str
    launch: str  # module of the launch side (contract.LaunchSide): pure, no torch at import
    session: Optional[str]  # module of the rank side (contract.RankSide)
    config_groups: Tuple[str, ...]  # hydra_configs/engine/<group>.yaml files that select this engine
    # Render only, never launched (Megatron-LM: a command line for the user's own cluster); no rank side.
    export_only: bool = False

    def launch_side(self) -> LaunchSide:
        return _checked(self.launch, LaunchSide)

    def rank_side(self) -> RankSide:
        if self.session is None:
            raise ValueError(f"engine={self.name} has no rank side (export only: {self.export_only})")
        return _checked(self.session, RankSide)

    def options(self) -> Type[EngineConfig]:
        return ENGINE_OPTIONS[EngineName(self.name)]

    def support(self) -> EngineSupport:
        return ENGINE_SUPPORT[self.name]


ENGINES: Dict[str, Engine] = {
    engine.name: engine
    for engine in (
        Engine("deepspeed", "harness.engines.deepspeed", "harness.engines.deepspeed_session", ("deepspeed",)),
        Engine("fsdp", "harness.engines.fsdp", "harness.engines.fsdp_session", ("fsdp", "fsdp1")),
        Engine("nd", "harness.engines.nd", "harness.engines.nd_session", ("nd",)),
        Engine("megatron_lm", "harness.engines.megatron_lm", None, ("megatron_lm",), export_only=True),
    )
}


def engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"engine.name={name!r} is not one of {sorted(ENGINES)}")
    return ENGINES[name]


def launch_side(name: str) -> LaunchSide:
    """The launch side of engine `name` (check, render)."""
    return engine(name).launch_side()


def rank_side(name: str) -> RankSide:
    """The rank side of engine `name` (construct, apply)."""
    return engine(name).rank_side()


@lru_cache(maxsize=None)
def _checked(module_name: str, side: type) -> ModuleType:
    """The module, once it is known to provide `side` (a runtime Protocol check reads every member: the planner
    asks for an engine's side once per candidate layout, so the answer is kept)."""
    module = importlib.import_module(module_name)
    if not isinstance(module, side):
        raise TypeError(f"{module_name} does not provide the engine contract's {side.__name__}")
    return module


def registry_problems(engines: Mapping[str, Engine] = ENGINES, config_dir: Path = ENGINE_CONFIG_DIR,
                      import_sessions: bool = True) -> List[str]:
    """Every gap between the registry and the tables keyed by engine name (empty: they agree)."""
    problems = [f"EngineName.{name} has no registry entry" for name in allowed(EngineName) if name not in engines]
    for name, entry in engines.items():
        problems += [f"engine {name}: {problem}" for problem in _entry_problems(entry, import_sessions)]
    groups = {group for entry in engines.values() for group in entry.config_groups}
    problems += [f"{config_dir.name}/{path.name} belongs to no registry entry"
                 for path in sorted(config_dir.glob("*.yaml")) if path.stem not in groups]
    for entry in engines.values():
        problems += [f"engine {entry.name}: {problem}" for problem in _group_problems(entry, config_dir)]
    return problems


def _entry_problems(entry: Engine, import_sessions: bool) -> List[str]:
    problems = []
    if entry.name not in allowed(EngineName):
        problems.append("not a value of harness.config.schema.EngineName")
    elif EngineName(entry.name) not in ENGINE_OPTIONS:
        problems.append("no option dataclass in harness.config.schema.ENGINE_OPTIONS")
    if entry.name not in ENGINE_SUPPORT:
        problems.append("no capability row in harness.plan.support.ENGINE_SUPPORT")
    problems += [f"no state convention for precision {precision} in harness.plan.conventions.STATE_CONVENTIONS"
                 for precision in allowed(Precision) if (entry.name, precision) not in STATE_CONVENTIONS]
    sides = [(entry.launch, LaunchSide)]
    if entry.session is None and not entry.export_only:
        problems.append("no rank-side session module (and not export only)")
    if entry.session is not None and entry.export_only:
        problems.append(f"export only, yet a rank-side session module {entry.session}")
    if entry.session is not None and import_sessions:
        sides.append((entry.session, RankSide))
    for module_name, side in sides:
        try:
            _checked(module_name, side)
        except (ImportError, TypeError) as error:
            problems.append(str(error))
    return problems


def _group_problems(entry: Engine, config_dir: Path) -> List[str]:
    problems = []
    for group in entry.config_groups:
        path = config_dir / f"{group}.yaml"
        if not path.exists():
            problems.append(f"no config group file {config_dir.name}/{group}.yaml")
            continue
        named = (yaml.safe_load(path.read_text()) or {}).get("name")
        if named != entry.name:
            problems.append(f"{config_dir.name}/{group}.yaml selects name={named!r}, not {entry.name!r}")
    return problems
