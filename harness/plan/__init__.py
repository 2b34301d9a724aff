"""Plan before launch: model spec, FLOPs / MFU, per-rank memory, layout validation (pure Python)."""
