"""`harness sync DIR...`: upload the offline W&B runs found below sweep or run directories with `wandb sync`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Sequence

USAGE = """usage: harness sync DIR [DIR ...] [--dry-run] [other `wandb sync` options]

Finds every offline W&B run below each DIR (<run>/wandb/offline-run-*) and hands them to `wandb sync`.
The same by hand, for one run:  wandb sync <run dir>/wandb
"""


def offline_runs(roots: Sequence[Path]) -> List[Path]:
    """Every offline run folder below the roots (the `latest-run` link wandb keeps is skipped)."""
    found = {path.parent.resolve() for root in roots for path in Path(root).rglob("offline-run-*/*.wandb")}
    return sorted(found)


def sync_main(args: List[str]) -> int:
    roots = [Path(arg) for arg in args if not arg.startswith("-")]
    options = [arg for arg in args if arg.startswith("-")]
    if "-h" in options or "--help" in options:
        print(USAGE)
        return 0
    if not roots:
        print("harness sync: no folder given: harness sync DIR [DIR ...] (see `harness sync --help`)", file=sys.stderr)
        return 2
    missing = [str(root) for root in roots if not root.is_dir()]
    if missing:
        print(f"harness sync: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    runs = offline_runs(roots)
    if not runs:
        print(f"harness sync: no offline W&B run below {', '.join(map(str, roots))}", file=sys.stderr)
        return 1
    wandb = shutil.which("wandb", path=str(Path(sys.executable).parent)) or "wandb"
    command = [wandb, "sync", *options, *map(str, runs)]
    print(f"[harness] {len(runs)} offline run(s): {' '.join(command[:3 + len(options)])} ...", flush=True)
    return subprocess.run(command).returncode
