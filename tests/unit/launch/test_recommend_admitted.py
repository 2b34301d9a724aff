"""Every layout the recommender proposes runs everywhere downstream: over model presets x cluster presets x engines,
each of the top choices (and the layouts grouped with it) is admitted by the one validity decision and is
prepared and rendered as `harness sweep --dry-run` would (run directory, engine files, Slurm job script)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config.compose import CONFIG_DIR, compose_run_config
from harness.engines import registry
from harness.engines.admission import judge
from harness.launch.prepare import prepare_run
from harness.launch.recommend import ranked, recommend_overrides
from harness.launch.sbatch import render_job_script

MODELS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
CLUSTERS = sorted(p.stem for p in (CONFIG_DIR / "cluster").glob("*.yaml"))
ENGINES = sorted(p.stem for p in (CONFIG_DIR / "engine").glob("*.yaml"))


def dry_run(cfg, run_dir: Path) -> None:
    """What `harness sweep --dry-run` does with one point: prepare it (admitted, planned, rendered), then write
    its job script where the launcher is Slurm."""
    prepared = prepare_run(cfg, run_dir, prune=True)
    if registry.engine(cfg.engine.name).export_only:
        assert (run_dir / "rendered.json").exists(), cfg.engine.name  # rendered, then held back as an export
        return
    assert not prepared.pruned, (run_dir / "status.json").read_text()
    if cfg.launcher.backend == "slurm":
        assert "srun" in render_job_script(cfg, prepared.rendered)


@settings(max_examples=14, deadline=None)
@given(model=st.sampled_from(MODELS), cluster=st.sampled_from(CLUSTERS), engine=st.sampled_from(ENGINES),
       seq_len=st.sampled_from([1024, 4096]), per_rank=st.sampled_from([1, 4]))
def test_every_recommended_layout_is_admitted_and_renders(tmp_path_factory, model, cluster, engine, seq_len,
                                                          per_rank):
    overrides, _ = recommend_overrides([f"model={model}", f"cluster={cluster}", f"engine={engine}",
                                        f"layout.seq_len={seq_len}", "tracking=disabled"])
    cfg = compose_run_config(overrides)
    top, _ = ranked(cfg, per_rank * cfg.cluster.ranks, 3)
    root = tmp_path_factory.mktemp("recommended")
    for i, choice in enumerate(top):
        for j, plan in enumerate([choice.plan, *choice.alike[:2]]):
            point = replace(cfg, layout=plan.layout, engine=plan.engine)
            assert judge(point).admitted, judge(point).errors
            dry_run(point, root / f"{i}-{j}")


def test_nd_is_never_offered_context_with_pipeline_parallelism():
    # engine=nd runs context parallelism without pipeline parallelism (harness.plan.support, cp_with_pp): the
    # recommender used to rank cp x pp layouts of Llama-3.1-70B on 64 H100 that plan and sweep then refused
    overrides, launcher = recommend_overrides(["model=llama3_1_70b", "cluster=h100_8x8", "engine=nd",
                                               "layout.seq_len=4096"])
    assert launcher == "slurm_gpu"
    cfg = compose_run_config(overrides)
    top, _ = ranked(cfg, 512, 10)
    layouts = [plan.layout for choice in top for plan in (choice.plan, *choice.alike)]
    assert layouts and not [layout for layout in layouts if layout.cp > 1 and layout.pp > 1]
    assert any(layout.cp > 1 for layout in layouts) or any(layout.pp > 1 for layout in layouts)
    refused = replace(cfg, layout=replace(top[0].plan.layout, cp=2, pp=16, dp_shard=2, dp_replicate=1, tp=1,
                                          micro_batch=1, grad_accum=256))
    assert any("runs context parallelism without pipeline parallelism" in e for e in judge(refused).errors)


def test_a_multi_node_cluster_on_the_local_launcher_is_refused_naming_the_launcher_it_needs():
    cfg = compose_run_config(["model=llama3_1_8b", "cluster=h100_8x8", "layout.dp_shard=64", "layout.seq_len=4096"])
    errors = judge(cfg).errors
    assert errors == ("launcher.backend=local starts one node, but cluster.nodes=8 (use launcher=slurm_gpu)",)
    assert judge(compose_run_config(["model=llama3_1_8b", "cluster=h100_8x8", "layout.dp_shard=64",
                                     "layout.seq_len=4096", "launcher=slurm_gpu"])).admitted


def test_a_host_timed_cluster_without_a_profile_is_measured_before_ranking(tmp_path, monkeypatch):
    # a fresh machine has no cached host profile: without one no layout has a time to rank by, and
    # recommend said "no layout fits" of layouts that all fit
    from harness.plan import hardware

    monkeypatch.setenv("HOME", str(tmp_path))  # the calibrating process writes under its home's cache
    monkeypatch.setattr(hardware, "PROFILE_DIR", tmp_path / ".cache" / "harness" / "profiles")
    cfg = compose_run_config(["model=tiny_llama", "engine=deepspeed", "cluster=local_slurm", "launcher=slurm_local",
                              "layout.seq_len=64", "tracking=disabled"])
    top, admitted = ranked(cfg, 4, 1)
    assert admitted and top and top[0].plan.tokens_per_s
    assert hardware.profile_path(hardware.cpu_profile_name()).exists()
