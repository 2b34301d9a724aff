"""The W&B report of a sweep (wandb-workspaces): built offline as a JSON spec, published online with a time limit.

Facts this module is built around (wandb-workspaces 0.4.13): a `Report` serialises with no network when
`entity=` is given; a `Runset` given an entity/project looks its project up over GraphQL when serialised,
so runsets keep the report's defaults; `save()` needs an API key and a server, and wandb's HTTP client
retries for a long time without a network, so anything networked runs in a child process with a deadline.

Publish a saved spec later with one command:
    python -m harness.report.wandb_report publish <sweep dir>/wandb_report.json [--entity E] [--project P]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

import pandas as pd

from harness.report.headline import headline
from harness.rundir import TIME_PARTS, wandb_file_environment, write_text
from harness.terminal import print_fitted

PUBLISH_TIMEOUT_S = 120
# Summary keys the runtime writes (harness/runtime/bench.py `_flat_summary`: the scalar fields of `Measured`).
THROUGHPUT_KEY = "tokens_per_s_per_device"
UTILIZATION_KEYS = ("mfu", "hfu")
MEMORY_KEYS = ("param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes", "peak_allocated_bytes")
# The measured tokens/s beside the predicted one and its band's ends (harness/runtime/bench.py `band_summary`).
PREDICTED_THROUGHPUT_KEYS = ("tokens_per_s", "tokens_per_s_predicted_low", "tokens_per_s_predicted",
                             "tokens_per_s_predicted_high")
# Per-step history keys, logged live by rank 0 against `step` (harness/runtime/progress.py).
HISTORY_KEYS = ("loss", "step_time_s", "tokens_per_s", "mfu", "memory_gib")
PANEL_TITLES = {
    "throughput": "Tokens/s per device by layout",
    "mfu": "MFU and HFU by layout",
    "memory": "Memory per device by layout (bytes, max over ranks)",
    "parallel": "Layout axes against throughput and MFU",
    "loss": "Loss per step",
    "step_time": "Step time per timed step (s)",
    "predicted_time": "Step time by layout: measured median and predicted (s)",
    "predicted_throughput": "Tokens/s by layout: measured, and predicted with its band's low and high ends",
    "predicted_parts": "Predicted step time by layout: where it goes (s)",
    "live_throughput": "Tokens/s per timed step",
    "live_mfu": "MFU per timed step (%)",
}
# Axes runs are grouped and compared by: the resolved config's own nesting (`layout.tp` ...), which W&B
# stores as `layout.value.tp` and shows as `layout.tp`.
GROUP_AXES = (("engine", "engine.name"), ("model", "model.name"), ("cluster", "cluster.name"),
              ("dp_replicate", "layout.dp_replicate"), ("dp_shard", "layout.dp_shard"), ("tp", "layout.tp"),
              ("pp", "layout.pp"), ("pp_schedule", "layout.pp_schedule"),
              ("pp_virtual_stages", "layout.pp_virtual_stages"), ("cp", "layout.cp"), ("ep", "layout.ep"),
              ("zero_stage", "layout.zero_stage"), ("offload_optimizer", "layout.offload_optimizer"),
              ("offload_params", "layout.offload_params"), ("micro_batch", "layout.micro_batch"),
              ("grad_accum", "layout.grad_accum"), ("seq_len", "layout.seq_len"),
              ("activation_checkpointing", "layout.activation_checkpointing"), ("precision", "layout.precision"))
PARALLEL_AXES = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch", "grad_accum",
                 "seq_len")


def varying_axes(frame: pd.DataFrame) -> List[str]:
    """Config keys whose value differs between the runs (the layout name when none does)."""
    keys = [key for column, key in GROUP_AXES
            if column in frame and frame[column].astype(str).nunique(dropna=False) > 1]
    return keys or ["layout.name"]


def _most_common(frame: pd.DataFrame, column: str) -> Optional[str]:
    if column not in frame:
        return None
    values = frame[column].dropna()
    return str(values.mode().iloc[0]) if not values.empty else None


def wandb_groups(frame: pd.DataFrame) -> List[str]:
    """The W&B groups of the runs shown: one per invocation of a sweep (harness/runtime/sinks.py
    `wandb_group`); runs written before groups carried a timestamp fall back to the sweep's name."""
    if frame.empty:
        return []
    groups = frame["wandb_group"] if "wandb_group" in frame else pd.Series([None] * len(frame), index=frame.index)
    return sorted(groups.fillna(frame["sweep"]).dropna().astype(str).unique())


def group_filter(sweeps: Sequence[str]) -> str:
    """The runset filter: runs whose W&B group is one of these."""
    if len(sweeps) == 1:
        return f"Metric('Group') == {json.dumps(sweeps[0])}"
    return f"Metric('Group') in {json.dumps(list(sweeps))}"


def _panels(frame: pd.DataFrame):
    import wandb_workspaces.reports.v2 as wr

    axes = [c for c in PARALLEL_AXES if c in frame and frame[c].astype(str).nunique(dropna=False) > 1] \
        or [c for c in PARALLEL_AXES if c in frame]
    columns = [wr.ParallelCoordinatesPlotColumn(wr.Config(f"layout.{axis}"), display_name=axis) for axis in axes]
    columns += [wr.ParallelCoordinatesPlotColumn(wr.SummaryMetric(THROUGHPUT_KEY), display_name="tokens/s/device"),
                wr.ParallelCoordinatesPlotColumn(wr.SummaryMetric("mfu"), display_name="MFU")]
    return [
        wr.BarPlot(title=PANEL_TITLES["throughput"], metrics=[wr.SummaryMetric(THROUGHPUT_KEY)],
                   title_x="tokens/s per device"),
        wr.BarPlot(title=PANEL_TITLES["mfu"], metrics=[wr.SummaryMetric(k) for k in UTILIZATION_KEYS]),
        wr.BarPlot(title=PANEL_TITLES["memory"], metrics=[wr.SummaryMetric(k) for k in MEMORY_KEYS],
                   title_x="bytes"),
        wr.BarPlot(title=PANEL_TITLES["predicted_throughput"],
                   metrics=[wr.SummaryMetric(k) for k in PREDICTED_THROUGHPUT_KEYS], title_x="tokens/s"),
        wr.BarPlot(title=PANEL_TITLES["predicted_time"],
                   metrics=[wr.SummaryMetric("step_time_s"), wr.SummaryMetric("step_time_predicted_s")],
                   title_x="seconds per optimizer step"),
        wr.BarPlot(title=PANEL_TITLES["predicted_parts"],
                   metrics=[wr.SummaryMetric(f"pred_time_{part}_s") for part in TIME_PARTS],
                   title_x="seconds per optimizer step"),
        wr.ParallelCoordinatesPlot(title=PANEL_TITLES["parallel"], columns=columns),
        wr.RunComparer(diff_only="split"),
        wr.LinePlot(title=PANEL_TITLES["loss"], y=["loss"]),
        wr.LinePlot(title=PANEL_TITLES["step_time"], y=["step_time_s"]),
        wr.LinePlot(title=PANEL_TITLES["live_throughput"], y=["tokens_per_s"]),
        wr.LinePlot(title=PANEL_TITLES["live_mfu"], y=["mfu"]),
    ]


def report_spec(frame: pd.DataFrame, entity: Optional[str] = None, project: Optional[str] = None,
                title: Optional[str] = None):
    """The report as a `wandb_workspaces.reports.v2.Report`, built with no network.

    One runset per sweep, filtered to the sweep's W&B group and grouped by the axes that vary, so every
    bar is one layout. Entity and project default to the runs' tracking config; the entity may be empty
    offline and is filled in at publish time.
    """
    import wandb_workspaces.reports.v2 as wr

    sweeps = sorted(frame["sweep"].dropna().astype(str).unique()) if not frame.empty else []
    entity = entity if entity is not None else (_most_common(frame, "wandb_entity") or "")
    project = project or _most_common(frame, "wandb_project") or "harness"
    groupby = [f"config.{key}" for key in varying_axes(frame)] if not frame.empty else []
    groups = wandb_groups(frame)
    runsets = [wr.Runset(name=group, filters=group_filter([group]), groupby=groupby) for group in groups] \
        or [wr.Runset(name="runs")]
    texts = []
    for sweep in sweeps:
        answer = headline(frame[frame["sweep"] == sweep], sweep)
        texts.append(f"{sweep}: {answer.text} {answer.detail}")
    description = " ".join(texts) or "No runs yet."
    untracked = int((frame["wandb_mode"] == "disabled").sum()) if "wandb_mode" in frame else 0
    blocks = [
        wr.H1("Which layout should I use?"),
        *(wr.P(text) for text in texts or [description]),
        *([wr.P(f"{untracked} of {len(frame)} runs had tracking disabled (tracking=disabled): they have no W&B "
                "run and are missing from the panels below; the local report.html has them all.")]
          if untracked else []),
        wr.H2("Throughput, utilization and memory by layout"),
        wr.P(f"Runs of W&B group {', '.join(groups) or '-'} (one group per sweep invocation), grouped by "
             f"{', '.join(varying_axes(frame)) if not frame.empty else '-'}. Built by `harness report` from "
             f"{len(frame)} run directories."),
        wr.PanelGrid(runsets=runsets, panels=_panels(frame)),
    ]
    title = title or f"Benchmark sweep {', '.join(sweeps) or '(empty)'}"
    return wr.Report(project=project, entity=entity, title=title[:128], description=description[:1000],
                     blocks=blocks, width="fluid")


def spec_dict(report) -> Dict:
    """The report's JSON spec (the same document `Report.save()` uploads, plus its project)."""
    return json.loads(report._to_model().model_dump_json(by_alias=True, exclude_none=True))


def write_spec(report, path: Path) -> Path:
    path = Path(path)
    return write_text(path, json.dumps(spec_dict(report), indent=1) + "\n")


def load_spec(path: Path):
    """A saved spec back as a `Report` (no network)."""
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces.reports.v2 import internal

    return wr.Report._from_model(internal.ReportViewspec.model_validate_json(Path(path).read_text()))


def publish(path: Path, entity: Optional[str] = None, project: Optional[str] = None) -> str:
    """Save a spec to the W&B server (needs WANDB_API_KEY and the network); returns the report's URL.

    Run it through `publish_with_timeout` (or the command line) so a missing network cannot hang the caller.
    """
    import wandb

    report = load_spec(path)
    report.entity = entity or report.entity or wandb.Api().default_entity
    report.project = project or report.project
    report.save()
    return report.url


def publish_environment(path: Path, environ: Mapping[str, str]) -> Dict[str, str]:
    """The publishing child's environment: every file wandb writes stays below the spec's folder (as a run's
    stay in its run directory), not in ~/.cache/wandb or ~/.config/wandb."""
    return {**environ, **wandb_file_environment(Path(path).resolve().parent), "WANDB_SILENT": "true"}


def publish_with_timeout(path: Path, timeout_s: float = PUBLISH_TIMEOUT_S, entity: Optional[str] = None,
                         project: Optional[str] = None) -> Optional[str]:
    """`publish` in a child process killed (with its whole group) after `timeout_s`; the URL, or None."""
    argv = [sys.executable, "-m", "harness.report.wandb_report", "publish-now", str(path)]
    argv += [f"--entity={entity}"] if entity else []
    argv += [f"--project={project}"] if project else []
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env=publish_environment(path, os.environ))
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        print_fitted(f"[harness] W&B report not published: no answer within {timeout_s:.0f} s; the spec stays at "
                     f"{path}", sys.stderr)
        return None
    if process.returncode != 0:
        print_fitted(f"[harness] W&B report not published ({err.strip().splitlines()[-1:] or ['no message']}); "
                     f"the spec stays at {path}", sys.stderr)
        return None
    lines = out.strip().splitlines()
    return lines[-1] if lines else None


def online(frame: pd.DataFrame, environ: Mapping[str, str]) -> bool:
    """Publish only when a key is present, the runs tracked online, and the environment does not say offline."""
    if not environ.get("WANDB_API_KEY") or environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        return False
    return "wandb_mode" in frame and bool((frame["wandb_mode"] == "online").any())


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report.wandb_report",
                                     description="Publish a saved W&B report spec (wandb_report.json).")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("publish", "save the spec to the W&B server and print its URL (with a time limit)"),
                            ("publish-now", "the same with no time limit (what `publish` runs in a child)")):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("spec", type=Path)
        command.add_argument("--entity")
        command.add_argument("--project")
        if name == "publish":
            command.add_argument("--timeout", type=float, default=PUBLISH_TIMEOUT_S,
                                 help="seconds (default %(default)s)")
    args = parser.parse_args(argv)
    if args.command == "publish-now":
        print(publish(args.spec, args.entity, args.project))
        return 0
    url = publish_with_timeout(args.spec, args.timeout, args.entity, args.project)
    if url is None:
        return 1
    print(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
