"""Compose a `RunConfig` the way the command line does: hydra_configs/ plus recipes/ on the search path."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from harness import REPO_ROOT
from harness.config.fill import fill_data_parallel
from harness.config.schema import RunConfig

CONFIG_DIR = REPO_ROOT / "hydra_configs"
PRIMARY_CONFIG = "config"
# The repository root is on the search path so that `recipes/` is the `recipes` config group.
SEARCHPATH_OVERRIDE = f"hydra.searchpath=[file://{REPO_ROOT}]"


def register_schemas() -> None:
    """Put the dataclass schema behind config.yaml, so unknown keys and wrong types fail at composition."""
    ConfigStore.instance().store(name="run_schema", node=RunConfig)


def compose_config(overrides: Iterable[str] = ()) -> DictConfig:
    """Compose the primary config with command-line style overrides (used by tests and `plan`/`sweep`)."""
    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="harness"):
        return compose(config_name=PRIMARY_CONFIG, overrides=[*overrides, SEARCHPATH_OVERRIDE])


def to_run_config(cfg: DictConfig) -> RunConfig:
    """The typed object behind a composed config (interpolations resolved)."""
    node = OmegaConf.merge(OmegaConf.structured(RunConfig), _without_hydra(cfg))
    return fill_data_parallel(OmegaConf.to_object(node))


def run_config_from_dict(payload: Dict[str, Any]) -> RunConfig:
    """Read back a resolved config written by `run_config_to_dict` (type-checked again)."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig), payload))


def run_config_to_dict(run: RunConfig) -> Dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(run), resolve=True)


def compose_run_config(overrides: Optional[List[str]] = None) -> RunConfig:
    return to_run_config(compose_config(overrides or []))


def _without_hydra(cfg: DictConfig) -> DictConfig:
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    return OmegaConf.create(plain)
