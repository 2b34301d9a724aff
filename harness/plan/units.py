"""Memory shown in MiB or GiB by magnitude, so a console column never reads 0.00 nor 12,345.67."""

from __future__ import annotations

from typing import Optional, Tuple

MIB = 1024**2
GIB = 1024**3


def memory_unit(largest_bytes: float) -> Tuple[str, int]:
    """(unit, bytes per unit) for a column whose largest value is `largest_bytes`: GiB from 1 GiB up."""
    return ("GiB", GIB) if abs(largest_bytes) >= GIB else ("MiB", MIB)


def format_bytes(value: Optional[float]) -> str:
    """One value with its own unit, e.g. `1.50 GiB`, `812.3 MiB`; `-` when unknown."""
    if value is None:
        return "-"
    unit, scale = memory_unit(value)
    return f"{value / scale:,.2f} {unit}" if unit == "GiB" else f"{value / scale:,.1f} {unit}"
