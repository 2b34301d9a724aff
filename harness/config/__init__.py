"""Run configuration: typed schema, Hydra registration, composition."""

from harness.config.schema import (  # noqa: F401
    BenchConfig,
    ClusterConfig,
    DataConfig,
    EngineConfig,
    LauncherConfig,
    LayoutConfig,
    ModelConfig,
    RunConfig,
    TrackingConfig,
)
