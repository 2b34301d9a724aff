"""The single-process reference every multi-rank loss is compared with (harness.runtime.reference, also used
by `make gpu-check`)."""

from harness.runtime.reference import single_process_losses

__all__ = ["single_process_losses"]
