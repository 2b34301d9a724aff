"""Memory shown in MiB or GiB by magnitude: the one rule lives in harness.rundir.vocabulary."""

from harness.rundir.vocabulary import GIB, MIB, format_bytes, memory_unit  # noqa: F401
