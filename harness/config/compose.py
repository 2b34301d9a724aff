"""Compose a `RunConfig` the way the command line does: hydra_configs/ plus recipes/ on the search path."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from harness import REPO_ROOT
from harness.config.checks import check_run_config
from harness.config.errors import ConfigRejected, nearest
from harness.config.fill import (NAME_RESOLVER, RUN_NAME_RESOLVER, default_layout_name, fill_layout, fill_note,
                                 run_layout_name)
from harness.config.schema import ENGINE_OPTIONS, EngineName, RunConfig, allowed
from harness.config.standin import make_standin

CONFIG_DIR = REPO_ROOT / "hydra_configs"
PRIMARY_CONFIG = "config"


def user_config_dir() -> Path:
    """The user's own config groups (`harness recommend` writes its recipes and sweep presets there), outside
    the source tree: $HARNESS_CONFIG_DIR, else $XDG_CONFIG_HOME/harness, else ~/.config/harness."""
    explicit = os.environ.get("HARNESS_CONFIG_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config").expanduser().resolve() / "harness"


def config_groups() -> Dict[str, List[str]]:
    """Every config group and its options, as Hydra's search path finds them: hydra_configs/<group>/,
    recipes/ and the user config directory's groups (`harness run --help` lists them)."""
    groups: Dict[str, set] = {}
    for root in (CONFIG_DIR, REPO_ROOT, user_config_dir()):
        for folder in sorted(root.iterdir()) if root.is_dir() else ():
            names = {path.stem for path in folder.glob("*.yaml")} if folder.is_dir() else set()
            if names and (root != REPO_ROOT or folder.name == "recipes"):
                groups.setdefault(folder.name, set()).update(names)
    return {group: sorted(names) for group, names in sorted(groups.items())}


# `standin=cpu`: the CPU stand-in of the composed recipe (harness/config/standin.py).
STANDIN_KEY, STANDIN_CHOICES = "standin", ("cpu",)
# How a composed recipe's ranks build its model (`full` or `meta`: model.init with `auto` decided at the
# recipe's own size), which its stand-in follows. The rule is the planner's
# (harness.plan.construction.resolved_model_init); the planner, a layer above this one, installs it when
# it is imported (harness/plan/__init__.py).
_MODEL_INIT_RULE: List[Callable[[RunConfig], str]] = []


def install_model_init_rule(rule: Callable[[RunConfig], str]) -> None:
    _MODEL_INIT_RULE[:] = [rule]


def recipe_model_init(cfg: RunConfig) -> str:
    if not _MODEL_INIT_RULE:
        raise RuntimeError("standin=cpu needs the planner's model.init rule: import harness.plan first")
    return _MODEL_INIT_RULE[0](cfg)


def register_schemas() -> None:
    """Put the dataclass schema behind config.yaml, so unknown keys and wrong types fail at composition."""
    store = ConfigStore.instance()
    store.store(name="run_schema", node=RunConfig)
    # The `default` layout preset's name depends on the cluster and model it is filled for.
    OmegaConf.register_new_resolver(NAME_RESOLVER, default_layout_name, replace=True)
    OmegaConf.register_new_resolver(RUN_NAME_RESOLVER, run_layout_name, replace=True)
    for engine, options in ENGINE_OPTIONS.items():
        # hydra_configs/engine/<name>.yaml start from these, so another engine's option is an unknown key.
        store.store(group="engine", name=f"{engine.value}_schema", node=options)


def searchpath_override(overrides: Sequence[str], config_dirs: Sequence[str] = ()) -> Tuple[str, List[str]]:
    """One `hydra.searchpath` override holding the repository root (for recipes/), the user config directory
    where it exists (`user_config_dir`: what `harness recommend` writes), the `--config-dir` folders and the
    user's own `hydra.searchpath` entries (a later override would replace, not extend, the list); and the other
    overrides."""
    user, rest = [], []
    for text in overrides:
        key, _, value = text.partition("=")
        if key.lstrip("+") == "hydra.searchpath":
            # Hydra's grammar escapes `:` and friends with a backslash (a grid point reads `file\:///x`).
            user += [re.sub(r"\\(.)", r"\1", entry.strip().strip("'\""))
                     for entry in value.strip().strip("[]").split(",") if entry.strip()]
        else:
            rest.append(text)
    folders = [*(("--config-dir", folder) for folder in config_dirs),
               *(("hydra.searchpath", entry[len("file://"):]) for entry in user if entry.startswith("file://"))]
    for flag, folder in folders:
        if not Path(folder).is_dir():  # Hydra only warns, then says the preset is missing
            raise ConfigRejected(flag, folder, "is not a folder of config groups")
    own = user_config_dir()
    paths = [f"file://{REPO_ROOT}", *([f"file://{own}"] if own.is_dir() else []),
             *(f"file://{Path(folder).resolve()}" for folder in config_dirs), *user]
    return f"hydra.searchpath=[{','.join(paths)}]", rest


def compose_config(overrides: Iterable[str] = (), return_hydra_config: bool = False,
                   config_dirs: Sequence[str] = ()) -> DictConfig:
    """Compose the primary config with command-line style overrides (used by tests and `plan`/`sweep`);
    `return_hydra_config` keeps the `hydra` node (a sweep preset's axes and sweep directory), resolved
    while Hydra is still initialised; `config_dirs` are searched too, as Hydra's `--config-dir` does."""
    overrides = expand_standin(list(overrides))
    searchpath, overrides = searchpath_override(overrides, config_dirs)
    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="harness"):
        cfg = compose(config_name=PRIMARY_CONFIG, overrides=[*overrides, searchpath],
                      return_hydra_config=return_hydra_config)
        if return_hydra_config:
            for node in (cfg.hydra.sweep, cfg.hydra.sweeper):
                OmegaConf.resolve(node)
        return cfg


def expand_standin(overrides: List[str]) -> List[str]:
    """`standin=cpu` replaced by the stand-in's overrides. The overrides before it are the recipe (the
    stand-in shrinks what they compose to); the ones after it apply to the stand-in itself
    (`recipes=X standin=cpu launcher=local` runs the stand-in on this machine)."""
    at = [i for i, text in enumerate(overrides) if text.split("=", 1)[0] == STANDIN_KEY]
    if not at:
        return overrides
    value = overrides[at[-1]].split("=", 1)[-1]
    if len(at) > 1 or value not in STANDIN_CHOICES:
        raise ConfigRejected(STANDIN_KEY, value if len(at) == 1 else "given twice",
                             f"must be given once, as one of {', '.join(STANDIN_CHOICES)} (the CPU stand-in of a "
                             f"GPU recipe: standin=cpu){nearest(value, STANDIN_CHOICES)}")
    before, after = overrides[:at[0]], overrides[at[0] + 1:]
    recipes = [text.split("=", 1)[1] for text in before if text.startswith("recipes=")]
    cfg = to_run_config(compose_config(before))
    recipe = recipes[-1] if recipes else f"{cfg.engine.name}/{cfg.layout.name}"
    return [*before, *make_standin(recipe, cfg, recipe_model_init(cfg)).overrides, *after]


def to_run_config(cfg: DictConfig) -> RunConfig:
    """The typed object behind a composed config (interpolations resolved), its values checked."""
    return run_config_from_dict(_without_hydra(cfg))


def run_config_from_dict(payload: Dict[str, Any]) -> RunConfig:
    """A typed, checked RunConfig from plain values (a composed config, or a config.json read back)."""
    return filled_run_config(payload)[0]


def filled_run_config(payload: Dict[str, Any]) -> Tuple[RunConfig, Optional[str]]:
    """The typed, checked RunConfig, and one line naming the layout fields filled for it (None if none)."""
    node = OmegaConf.merge(_schema_for(payload), payload)
    run, filled = fill_layout(OmegaConf.to_object(node))
    check_run_config(run)
    return run, fill_note(run, filled) if filled else None


def compose_noting_fills(overrides: List[str], config_dirs: Sequence[str] = ()) -> Tuple[RunConfig, Optional[str]]:
    """`compose_run_config`, and the line saying which layout fields were filled (for plan, run and sweep)."""
    return filled_run_config(_without_hydra(compose_config(overrides, config_dirs=config_dirs)))


def _schema_for(payload: Dict[str, Any]) -> DictConfig:
    """RunConfig with the option dataclass of the engine the payload names."""
    name = (payload.get("engine") or {}).get("name", EngineName.deepspeed.value)
    if name not in allowed(EngineName):
        raise ConfigRejected("engine.name", name,
                             f"must be one of {', '.join(allowed(EngineName))}{nearest(name, allowed(EngineName))}")
    schema = OmegaConf.structured(RunConfig)
    schema.engine = OmegaConf.structured(ENGINE_OPTIONS[EngineName(name)])
    return schema


def run_config_to_dict(run: RunConfig) -> Dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(run), resolve=True)


def compose_run_config(overrides: Optional[List[str]] = None, config_dirs: Sequence[str] = ()) -> RunConfig:
    return to_run_config(compose_config(overrides or [], config_dirs=config_dirs))


def _without_hydra(cfg: DictConfig) -> Dict[str, Any]:
    plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    plain.pop("hydra", None)
    return plain
