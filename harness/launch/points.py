"""A sweep's points: one prepared run directory per grid point (validated, predicted, rendered, or PRUNED)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from harness.config.arguments import unwritable_folder
from harness.config.compose import compose_noting_fills, run_config_from_dict
from harness.config.errors import ConfigRejected
from harness.config.naming import point_names
from harness.config.schema import RunConfig
from harness.engines import engine_module
from harness.engines.rendered import RenderedRun
from harness.launch.grid import UsageError, grid_points, make_unique_dir
from harness.launch.local import for_backend
from harness.launch.prepare import prepare_run
from harness.launch.sbatch import check_name, check_run_dir
from harness.rundir import (
    CONFIG_FILE,
    PENDING,
    PRUNED,
    RENDERED_FILE,
    SWEEP_FILE,
    CorruptFile,
    load_json,
    read_status,
    write_json,
    write_status,
)


@dataclass
class Point:
    """One grid point's run directory, config and rendered launch (None: pruned, with the reason)."""

    run_dir: Path
    overrides: List[str]
    cfg: RunConfig
    rendered: Optional[RenderedRun]
    reason: str = ""


def run_name(cfg: RunConfig) -> str:
    """A point's name when nothing differs across the grid (see harness.config.naming.point_names)."""
    return f"{check_name('engine.name', cfg.engine.name)}-{check_name('layout.name', cfg.layout.name)}"


def prepare_point(cfg: RunConfig, run_dir: Path, overrides: List[str]) -> Point:
    """prepare_run with pruning; a point that cannot even be rendered is PRUNED with the reason."""
    try:
        prepared = prepare_run(cfg, run_dir, prune=True)
    except ValueError as error:  # RunRejected (hub), an engine's render refusing the layout
        run_dir.mkdir(parents=True, exist_ok=True)
        write_status(run_dir, PRUNED, str(error))
        return Point(run_dir, overrides, cfg, None, str(error))
    reason = read_status(prepared.run_dir).reason if prepared.pruned else ""
    return Point(prepared.run_dir, overrides, prepared.cfg, prepared.rendered, reason)


def render_pruned(point: Point) -> Point:
    """--submit-pruned: render what the planner rejected, and run it anyway."""
    try:
        rendered = for_backend(point.cfg, engine_module(point.cfg.engine.name).render(point.cfg, point.run_dir))
    except Exception as error:
        write_status(point.run_dir, PRUNED, f"{point.reason}; and the engine cannot render it: {error}")
        return point
    rendered.save()
    write_status(point.run_dir, PENDING, f"run despite being pruned: {point.reason}")
    return Point(point.run_dir, point.overrides, point.cfg, rendered, "")


def load_point(run_dir: Path, state: str, reason: str) -> Point:
    """A prepared point read back from its run directory (resume)."""
    cfg = run_config_from_dict(load_json(run_dir / CONFIG_FILE))
    rendered = RenderedRun.load(run_dir) if (run_dir / RENDERED_FILE).exists() and state != PRUNED else None
    return Point(run_dir, [], cfg, rendered, reason)


def _composed(points: Sequence[List[str]]) -> Tuple[List[RunConfig], List[str]]:
    """One config per point (a sweep has one sweep_name and one launcher backend), and the distinct lines
    saying what open layouts were filled with."""
    composed = [compose_noting_fills(point) for point in points]
    configs = [cfg for cfg, _ in composed]
    names = {cfg.sweep_name for cfg in configs}
    backends = {cfg.launcher.backend for cfg in configs}
    if len(names) > 1 or len(backends) > 1:
        raise UsageError(f"one sweep has one sweep_name and one launcher; the grid varies them: "
                         f"{sorted(names)} {sorted(backends)}")
    check_name("sweep_name", configs[0].sweep_name)
    return configs, list(dict.fromkeys(note for _, note in composed if note))


def interleaved(count: int, repeats: Sequence[int]) -> List[Tuple[int, int]]:
    """(point, repeat) in the order they run: A B C, then C B A, then A B C ... (each round reversed), so that a
    slow drift of the host (warming, a neighbour's job) falls on every point alike and cancels in the pooled
    figures (the ABBA order of crossover designs). A point with fewer repeats drops out of later rounds."""
    order = []
    for round_ in range(max(repeats, default=1)):
        indices = range(count) if round_ % 2 == 0 else range(count - 1, -1, -1)
        order += [(i, round_) for i in indices if round_ < repeats[i]]
    return order


def with_repeats(points: List[List[str]], configs: List[RunConfig], names: List[str]):
    """Every point's repeats (bench.repeats) in interleaved order: names `<name>-r<k>` where a point repeats."""
    order = interleaved(len(points), [cfg.bench.repeats for cfg in configs])
    if all(configs[i].bench.repeats == 1 for i in range(len(points))):
        return points, configs, names
    out_points, out_configs, out_names = [], [], []
    for i, k in order:
        cfg = configs[i]
        many = cfg.bench.repeats > 1
        out_points.append([*points[i], f"bench.repeat={k}"] if many else points[i])
        out_configs.append(replace(cfg, bench=replace(cfg.bench, repeat=k)))
        out_names.append(f"{names[i]}-r{k}" if many else names[i])
    return out_points, out_configs, out_names


def expand(overrides: Sequence[str], submit_pruned: bool) -> Tuple[Path, List[Point], str]:
    """The grid's run directories under a new sweep directory: (sweep dir, points, launcher backend)."""
    points, params, sweep_dir = grid_points(overrides)
    configs, notes = _composed(points)
    # Names and paths that could not go into a script are rejected before anything is written.
    names = point_names(points, [run_name(cfg) for cfg in configs])
    points, configs, names = with_repeats(points, configs, names)
    if configs[0].launcher.backend == "slurm":
        for name in names:
            check_run_dir(Path(sweep_dir).resolve() / name)
    problem = unwritable_folder(Path(sweep_dir))
    if problem:
        raise ConfigRejected("results_dir", configs[0].results_dir, f"cannot hold the sweep {sweep_dir}: {problem}")
    for note in notes:  # once the points are accepted, before anything is written
        print(note, file=sys.stderr)
    root = make_unique_dir(Path(sweep_dir).resolve())
    write_json(root / SWEEP_FILE, {
        "sweep_name": configs[0].sweep_name, "launcher": configs[0].launcher.backend, "created": time.time(),
        "args": list(overrides), "params": params,
        "points": [{"run": name, "overrides": point} for name, point in zip(names, points)],
    })
    prepared = []
    for name, point, cfg in zip(names, points, configs):
        item = prepare_point(cfg, root / name, point)
        if item.rendered is None and submit_pruned:
            item = render_pruned(item)
        prepared.append(item)
    return root, prepared, configs[0].launcher.backend


def record_sweep(sweep_dir: Path, sweep_name: str, launcher: str, args: Sequence[str], run: str) -> None:
    """sweep.json for the folder of `harness run` points (one per run, or a Hydra -m grid's): each run
    added as it is launched, so that `harness sweep status|resume|cancel` follow and mend them."""
    path = Path(sweep_dir) / SWEEP_FILE
    record = load_json(path) if path.exists() else {
        "sweep_name": sweep_name, "launcher": launcher, "created": time.time(), "args": list(args),
        "params": {}, "points": []}
    record["points"] = [*[p for p in record["points"] if p["run"] != run], {"run": run, "overrides": list(args)}]
    write_json(path, record)


def sweep_record(sweep_dir: Path) -> Dict[str, Any]:
    """sweep.json: how the sweep was asked for (its name, launcher and points); UsageError, naming the
    file, when it cannot be read as such."""
    path = Path(sweep_dir) / SWEEP_FILE
    try:
        record = load_json(path)
    except CorruptFile as error:
        raise UsageError(f"{path} cannot be read ({error}); `harness sweep status` still shows its runs") from None
    missing = [key for key in ("sweep_name", "launcher") if not isinstance(record, dict) or key not in record]
    if missing:
        raise UsageError(f"{path} is not a sweep record: {', '.join(missing)} missing")
    return record
