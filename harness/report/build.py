"""`harness report`: sweep dirs -> summary.csv, summary.parquet, report.html and the W&B report spec."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pandas as pd

from harness.config.arguments import unwritable_folder
from harness.report.headline import headlines
from harness.report.html import write_html
from harness.report.table import print_table, summary_frame, write_frame
from harness.report.wandb_report import PUBLISH_TIMEOUT_S, online, publish_with_timeout, report_spec, write_spec
from harness.rundir import REPORT_HTML, STATUS_FILE, WANDB_REPORT_JSON, WANDB_REPORT_URL, write_text
from harness.terminal import print_fitted


def build_report(roots: List[Path], out_dir: Path, publish_timeout_s: float = PUBLISH_TIMEOUT_S,
                 frame: Optional[pd.DataFrame] = None) -> Dict[str, Path]:
    """Aggregate every run directory below `roots` and write the reports into `out_dir`.

    Returns {"csv", "parquet", "html", "wandb_report"} -> path, plus "wandb_report_url" (a file holding
    the URL) when the spec was published: only with WANDB_API_KEY set and runs tracked online, within
    `publish_timeout_s`. Offline, or when publishing fails, the spec is still written.
    """
    roots = [Path(root) for root in roots]
    out_dir = Path(out_dir)
    frame = summary_frame(roots) if frame is None else frame
    paths = write_frame(frame, out_dir)
    paths["html"] = write_html(frame, roots, out_dir / REPORT_HTML)
    paths["wandb_report"] = write_spec(report_spec(frame), out_dir / WANDB_REPORT_JSON)
    if online(frame, os.environ):
        url = publish_with_timeout(paths["wandb_report"], publish_timeout_s)
        if url:
            write_text(out_dir / WANDB_REPORT_URL, url + "\n")
            paths["wandb_report_url"] = out_dir / WANDB_REPORT_URL
    return paths


def default_out_dir(roots: Sequence[Path]) -> Path:
    """One sweep: its own folder. Several: `compare/<a>_vs_<b>` under their common folder, named by what
    tells the folders apart, so comparing other sweeps never overwrites this comparison."""
    if len(roots) == 1:
        return Path(roots[0])
    resolved = [Path(r).resolve() for r in roots]
    common = Path(os.path.commonpath([str(r) for r in resolved]))
    names = ["-".join(r.relative_to(common).parts) or r.name for r in resolved]
    name = "_vs_".join(re.sub(r"[^A-Za-z0-9_.-]+", "-", n) for n in names)
    return common / "compare" / (name if len(name) <= 120 else name[:100] + f"-and-{len(names)}-sweeps")


def distinct_sweeps(roots: List[Path]) -> List[Path]:
    """The folders to report, each once (`report A A` compared A with itself), without folders that hold no run
    beside ones that do (`report results/cpu_grid/*` took the report's own compare/ folder as a sweep); each
    folder left out is named on stderr."""
    seen, unique = set(), []
    for root in roots:
        key = root.resolve()
        if key in seen:
            print(f"harness report: {root} is given twice; reported once", file=sys.stderr)
            continue
        seen.add(key)
        unique.append(root)
    holding = [root for root in unique if next(root.rglob(STATUS_FILE), None) is not None]
    for root in (unique if holding else []):
        if root not in holding:
            print(f"harness report: {root} holds no run folder (a {STATUS_FILE} file); left out", file=sys.stderr)
    return holding or unique


def report_main(roots: List[Path], out_dir: Optional[Path] = None, wide: bool = False) -> int:
    """What `harness report DIR [DIR ...] [--out DIR] [--wide]` does: build, print the table and where everything
    went."""
    if any(str(root) == "--out" for root in roots):
        at = [str(root) for root in roots].index("--out")
        if at + 1 >= len(roots):
            print("harness report: --out needs a folder", file=sys.stderr)
            return 2
        out_dir, roots = roots[at + 1], roots[:at] + roots[at + 2:]
    missing = [str(root) for root in roots if not Path(root).is_dir()]
    if missing or not roots:
        print(f"harness report: not a directory: {', '.join(missing) or '(none given)'}", file=sys.stderr)
        return 2
    roots = distinct_sweeps([Path(root) for root in roots])
    out_dir = Path(out_dir) if out_dir else default_out_dir(roots)
    frame = summary_frame(roots)
    if frame.empty:  # nothing to report: say so, and leave the folder as it was
        print(f"harness report: no runs found in {', '.join(map(str, roots))} (a run folder holds "
              f"a {STATUS_FILE} file; pass a sweep or run folder)", file=sys.stderr)
        return 1
    problem = unwritable_folder(out_dir)
    if problem:
        print(f"harness report: the report folder {out_dir} {problem}", file=sys.stderr)
        return 2
    paths = build_report(roots, out_dir, frame=frame)
    print_table(frame, title=", ".join(str(r) for r in roots), wide=wide)
    for item in headlines(frame):
        print_fitted(f"[harness] {item.text} {item.detail}")
    for name, path in paths.items():
        print_fitted(f"[harness] {name}: {path}")
    if "wandb_report_url" in paths:
        print_fitted(f"[harness] W&B report: {paths['wandb_report_url'].read_text().strip()}")
    else:
        print_fitted(f"[harness] W&B report spec (offline); publish it with: "
                     f"python -m harness.report.wandb_report publish {paths['wandb_report']}")
    return 0 if not frame.empty else 1
