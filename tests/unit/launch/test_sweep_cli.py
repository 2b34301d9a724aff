"""`harness sweep` without a cluster: presets, grid expansion, dry runs, pruning, bad names, secrets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from harness import REPO_ROOT
from harness.commands import sweep
from harness.launch import grid
from harness.launch import sweep as orchestrate
from harness.launch.status import RunView

PRESETS = sorted(p.stem for p in (REPO_ROOT / "hydra_configs" / "sweep").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS)
def test_sweep_presets_only_override_and_name_their_grid(preset):
    text = (REPO_ROOT / "hydra_configs" / "sweep" / f"{preset}.yaml").read_text()
    assert text.startswith("# @package _global_"), f"{preset}.yaml must start with '# @package _global_'"
    data = yaml.safe_load(text)
    for entry in data.get("defaults", []):
        key = next(iter(entry)) if isinstance(entry, dict) else entry
        assert key.startswith("override /"), f"{preset}.yaml defaults entry {entry!r} is not an override"
    assert data["sweep_name"] == preset
    assert data["hydra"]["sweeper"]["params"], f"{preset}.yaml has no hydra.sweeper.params"


@pytest.mark.parametrize("preset", PRESETS)
def test_sweep_presets_expand_to_typed_points(preset):
    from harness.config.compose import compose_run_config

    points, params, sweep_dir = grid.grid_points([f"sweep={preset}"])
    expected = 1
    for values in params.values():
        expected *= len(values.split(","))
    assert len(points) == expected
    assert f"/{preset}/" in f"/{sweep_dir}/"
    run = compose_run_config(points[-1])
    assert run.sweep_name == preset


def test_command_line_axes_join_and_replace_preset_axes():
    points, _, _ = grid.grid_points(["sweep=cpu_grid", "layout.zero_stage=2,3", "bench.steps=2"])
    assert [p for p in points if "engine=fsdp" in p][0] == [
        "engine=fsdp", "layout.zero_stage=2", "sweep=cpu_grid", "bench.steps=2"]
    assert len(points) == 4  # engine (preset) x zero_stage (command line replaces the preset's 1,2,3)
    points, _, _ = grid.grid_points(["layout.zero_stage=1,2", "engine=deepspeed,fsdp"])
    assert len(points) == 4  # no preset: plain Hydra multirun syntax


def test_parse_args():
    opts = sweep.parse_args(["sweep=cpu_grid", "--dry-run", "--no-wait", "--poll=0.5", "x=1"])
    assert (opts.command, opts.overrides, opts.dry_run, opts.wait, opts.poll_s) == (
        "new", ("sweep=cpu_grid", "x=1"), True, False, 0.5)
    with pytest.raises(sweep.UsageError, match="not a sweep directory"):
        sweep.parse_args(["status", "/nonexistent"])
    with pytest.raises(sweep.UsageError, match="unknown option"):
        sweep.parse_args(["--fast"])


@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch):
    """An sbatch on PATH that only records that it was called."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    marker = tmp_path / "sbatch-called"
    script = bin_dir / "sbatch"
    script.write_text(f"#!/bin/bash\necho \"$@\" >> {marker}\necho 1\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return marker


def only_sweep_dir(results: Path, name: str) -> Path:
    dirs = list((results / name).iterdir())
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_dry_run_prepares_prunes_and_prints_but_submits_nothing(tmp_path, fake_sbatch, capsys):
    code = sweep.main(["sweep=cpu_grid", "launcher=slurm_local", "cluster=local_slurm", "tracking=disabled",
                       f"results_dir={tmp_path / 'results'}", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0
    assert not fake_sbatch.exists()
    root = only_sweep_dir(tmp_path / "results", "cpu_grid")
    runs = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name != "slurm")
    assert runs == ["000-deepspeed-zero1", "001-deepspeed-zero2", "002-deepspeed-zero3",
                    "003-fsdp-zero1", "004-fsdp-zero2", "005-fsdp-zero3"]
    pruned = json.loads((root / "003-fsdp-zero1" / "status.json").read_text())
    assert pruned["state"] == "PRUNED" and "zero_stage=1" in pruned["reason"]
    assert not (root / "003-fsdp-zero1" / "job.sbatch").exists()
    for name in set(runs) - {"003-fsdp-zero1"}:
        assert (root / name / "job.sbatch").exists()
        assert json.loads((root / name / "status.json").read_text())["state"] == "PENDING"
        assert json.loads((root / name / "config.json").read_text())["bench"]["steps"] == 10
    manifest = (root / "slurm" / "array-001.manifest").read_text().splitlines()
    assert manifest == [str(root / name) for name in runs if name != "003-fsdp-zero1"]
    assert "#SBATCH --array=0-4%2" in out and "would submit: sbatch" in out and "PRUNED" in out
    assert "nothing submitted" in out
    record = json.loads((root / "sweep.json").read_text())
    assert record["launcher"] == "slurm" and record["params"]["engine"] == "deepspeed,fsdp"


def test_submit_pruned_renders_the_pruned_point(tmp_path, fake_sbatch):
    code = sweep.main(["engine=fsdp", "layout.zero_stage=1", "launcher=slurm_local", "tracking=disabled",
                       f"results_dir={tmp_path}", "--dry-run", "--submit-pruned"])
    assert code == 0
    run = only_sweep_dir(tmp_path, "adhoc") / "000-fsdp-dp2_zero1"
    status = json.loads((run / "status.json").read_text())
    # The engine itself refuses ZeRO-1, so even --submit-pruned cannot render it; the reason says both.
    assert status["state"] == "PRUNED" and "cannot render" in status["reason"]


def test_submit_pruned_runs_a_layout_predicted_to_oom(tmp_path, fake_sbatch):
    args = ["launcher=slurm_local", "tracking=disabled", "cluster.memory_per_accelerator_gib=0.0001",
            f"results_dir={tmp_path}", "--dry-run"]
    assert sweep.main(args) == 0
    first = only_sweep_dir(tmp_path, "adhoc") / "000-deepspeed-dp2_zero2"
    assert json.loads((first / "status.json").read_text())["state"] == "PRUNED"
    assert "out of memory" in json.loads((first / "status.json").read_text())["reason"]
    assert sweep.main([*args, f"results_dir={tmp_path / 'again'}", "--submit-pruned"]) == 0
    second = only_sweep_dir(tmp_path / "again", "adhoc") / "000-deepspeed-dp2_zero2"
    status = json.loads((second / "status.json").read_text())
    assert status["state"] == "PENDING" and "despite" in status["reason"]
    assert (second / "job.sbatch").exists()


@pytest.mark.parametrize("override,field", [
    ("sweep_name='x$(touch PWNED)'", "sweep_name"),
    ("sweep_name='grid\nname'", "sweep_name"),  # a real newline
    ("sweep_name=../../etc", "sweep_name"),
    ("layout.name='a\"b'", "layout.name"),
    ("layout.name='dp2 `id`'", "layout.name"),
])
def test_names_that_would_reach_a_script_are_rejected_before_anything_is_written(override, field, tmp_path,
                                                                                 fake_sbatch, capsys):
    code = sweep.main([override, "launcher=slurm_local", f"results_dir={tmp_path}", "--dry-run"])
    assert code == 2
    assert field in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [tmp_path / "fakebin"] and not list(Path.cwd().glob("PWNED*"))


def test_results_dir_with_a_space_is_rejected_for_slurm(tmp_path, fake_sbatch, capsys):
    code = sweep.main(["launcher=slurm_local", f"results_dir='{tmp_path}/my results'", "--dry-run"])
    assert code == 2 and "run directory" in capsys.readouterr().err
    assert not (tmp_path / "my results").exists()


def test_no_secret_lands_in_any_file(tmp_path, fake_sbatch, monkeypatch):
    secrets = {"WANDB_API_KEY": "wandb-secret-0123456789", "HF_TOKEN": "hf_secret_abcdef",
               "HUGGING_FACE_HUB_TOKEN": "hf_secret_hub_987"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    code = sweep.main(["engine=deepspeed,fsdp", "layout.zero_stage=2", "launcher=slurm_local",
                       "tracking=wandb_online", f"results_dir={tmp_path / 'r'}", "--dry-run"])
    assert code == 0
    files = [p for p in (tmp_path / "r").rglob("*") if p.is_file()]
    assert any(p.name == "job.sbatch" for p in files) and any(p.suffix == ".sbatch" and p.parent.name == "slurm"
                                                              for p in files)
    for path in files:
        text = path.read_bytes()
        for name, value in secrets.items():
            assert value.encode() not in text, f"{name} written into {path}"
    job = next(p for p in files if p.name == "job.sbatch").read_text()
    assert "#SBATCH --export=ALL" in job and "--export=ALL" in job.split("srun", 1)[1]


def test_resume_picks_what_did_not_complete():
    def v(name, state, key="1"):
        return RunView(Path(name), state, "", key)

    views = [v("ok", "COMPLETED"), v("failed", "FAILED"), v("oom", "OOM"), v("timeout", "TIMEOUT"),
             v("cancelled", "CANCELLED"), v("pruned", "PRUNED", None), v("queued", "PENDING"),
             v("running", "RUNNING"), v("never", "PENDING", None)]
    names = lambda chosen: [c.run_dir.name for c in chosen]  # noqa: E731
    assert names(orchestrate.to_resume(views, False, "slurm")) == ["failed", "oom", "timeout", "cancelled", "never"]
    assert "pruned" in names(orchestrate.to_resume(views, True, "slurm"))
    # Locally nothing can still be running after the sweep process ended: RUNNING means interrupted.
    assert "running" in names(orchestrate.to_resume(views, False, "local"))


def test_repeats_are_prepared_interleaved(tmp_path):
    from harness.launch.points import expand

    root, points, _ = expand(["sweep=cpu_grid", "engine=deepspeed", "layout.zero_stage=2,3", "bench.repeats=2",
                              f"results_dir={tmp_path}"], submit_pruned=False)
    names = [point.run_dir.name for point in points]
    assert names == ["000-zero2-r0", "001-zero3-r0", "001-zero3-r1", "000-zero2-r1"]  # A B, then B A
    assert [point.cfg.bench.repeat for point in points] == [0, 0, 1, 1]
    recorded = json.loads((root / "sweep.json").read_text())["points"]
    assert [p["run"] for p in recorded] == names and recorded[2]["overrides"][-1] == "bench.repeat=1"
    assert json.loads((root / names[3] / "config.json").read_text())["bench"]["repeat"] == 1


def test_resume_beside_a_live_local_sweep_runs_nothing(tmp_path, capsys):
    """A resume started while the sweep's own process still ran launched the next pending point at once: two
    benchmarks shared the host and both measured the contention. The live sweep holds its folder's lock."""
    from harness.launch.run_lock import RunLock

    assert sweep.main(["sweep=cpu_grid", "tracking=disabled", f"results_dir={tmp_path / 'results'}",
                       "--dry-run"]) == 0
    root = only_sweep_dir(tmp_path / "results", "cpu_grid")
    before = {p.name: (p / "status.json").read_text() for p in root.iterdir() if p.is_dir()}
    capsys.readouterr()
    with RunLock(root):  # this process stands for the sweep still running
        assert sweep.main(["resume", str(root)]) == 1
    err = capsys.readouterr().err
    assert "its sweep is still running on" in err and "nothing resumed" in err
    assert {p.name: (p / "status.json").read_text() for p in root.iterdir() if p.is_dir()} == before
    assert not (root / "run.lock").exists()
