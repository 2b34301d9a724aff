"""Plan before launch: model spec, FLOPs / MFU, per-rank memory, layout validation (pure Python)."""

from harness.config.compose import install_model_init_rule
from harness.plan.construction import resolved_model_init

# A recipe's stand-in (`standin=cpu`, composed in harness.config) builds its model as the recipe resolves it.
install_model_init_rule(resolved_model_init)
