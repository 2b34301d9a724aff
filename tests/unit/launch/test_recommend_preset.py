"""`harness recommend` as a user meets it: a table with units, choices the model can separate, a part-by-part why
(against the runner-up and the user's own recipe), and recipes written outside the source tree that its printed
`harness sweep` line prepares without pruning anything, on the launcher the cluster needs."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from types import SimpleNamespace

from harness import REPO_ROOT
from harness.launch.points import expand
from harness.launch.recommend import label, recommend_main
from harness.plan.recommend import RESOLUTION, choices


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True, text=True).stdout


def test_recommended_recipes_live_outside_the_tree_and_the_printed_sweep_runs_them_on_slurm(tmp_path, monkeypatch,
                                                                                            capsys):
    monkeypatch.setenv("HARNESS_CONFIG_DIR", str(tmp_path / "config"))
    before = _git_status()
    argv = ["--global-batch", "128", "--top", "2", "--name", "rec_test", "model=llama3_1_8b", "cluster=h100_8x8",
            "engine=fsdp", "layout.seq_len=4096", "tracking=disabled"]
    assert recommend_main(argv) == 0
    out = capsys.readouterr().out
    assert _git_status() == before  # nothing written into the source tree
    assert sorted(p.relative_to(tmp_path / "config").as_posix() for p in (tmp_path / "config").rglob("*.yaml")) == [
        "recipes/rec_test_1.yaml", "recipes/rec_test_2.yaml", "sweep/rec_test.yaml"]
    command = re.search(r"run them with: harness sweep (\S+)", out).group(1)
    _, points, backend = expand([command, f"results_dir={tmp_path / 'results'}"], submit_pruned=False)
    assert backend == "slurm" and len(points) == 2
    ranked = re.findall(r"^#\d engine=(\S+) (.+?)(?:  \(\+|$)", out, re.M)
    for point, (engine, layout) in zip(points, ranked):
        assert point.rendered is not None, point.reason  # nothing pruned
        assert point.cfg.engine.name == engine and point.cfg.cluster.nodes == 8
        assert point.cfg.launcher.gpus_per_node_gres == "gpu:8" and point.cfg.layout.seq_len == 4096
        assert f"mb{point.cfg.layout.micro_batch} ga{point.cfg.layout.grad_accum}" in layout


def test_the_table_gives_every_part_with_its_unit_and_the_why_compares_part_by_part(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_CONFIG_DIR", str(tmp_path))
    argv = ["--global-batch", "512", "--top", "2", "--no-write", "--against", "gpu_llama70b_nd_tp8_pp4",
            "model=llama3_1_70b", "cluster=h100_8x8", "engine=nd", "layout.seq_len=4096"]
    assert recommend_main(argv) == 0
    out = capsys.readouterr().out
    assert "ranked for launcher=slurm_gpu" in out
    first = out.split("#1 ", 1)[1].split("#2 ", 1)[0]
    assert first.startswith("engine=nd ")
    assert re.search(r"[\d,]+ tokens/s \(±\d+%(, uncalibrated)?\), MFU [\d.]+%, step [\d.]+ s: compute [\d.]+ s, "
                     r"exposed communication "
                     r"(\w+ [\d.e-]+ s(, )?)+, bubble [\d.e-]+ s, optimizer [\d.e-]+ s, "
                     r"optimizer offload [\d.e-]+ s", first)
    assert re.search(r"memory [\d.]+ GiB per rank of 80.00 GiB \(margin [\d.]+ (GiB|MiB)\)", first)
    assert re.search(r"why #1 over #2: [\d.]+x the tokens/s \([\d,]+ -> [\d,]+\)\n   \w.* [\d.e-]+ s -> [\d.e-]+ s", out)
    versus = out.split("why #1 over gpu_llama70b_nd_tp8_pp4: ", 1)[1]
    assert re.match(r"[\d.]+x the tokens/s", versus)
    assert "exposed tp communication" in versus  # the recipe's tp8 pays its tensor-parallel traffic


def _plan(tokens_per_s, margin=0, tp=1):
    layout = SimpleNamespace(tp=tp, cp=1, pp=1, dp_replicate=1, pp_virtual_stages=1)
    return SimpleNamespace(tokens_per_s=tokens_per_s, margin_bytes=margin, layout=layout)


def test_layouts_the_model_cannot_separate_are_one_choice_led_by_the_simplest():
    near = 100.0 * (1 - RESOLUTION / 2)
    ranked = [_plan(100.0, tp=2), _plan(near, margin=5), _plan(near, margin=1), _plan(90.0), _plan(80.0)]
    top = choices(ranked, top_k=2)
    assert len(top) == 2
    assert top[0].plan is ranked[1] and set(map(id, top[0].alike)) == {id(ranked[0]), id(ranked[2])}
    assert top[1].plan is ranked[3] and top[1].alike == ()


def test_a_run_setting_the_sweep_would_refuse_is_refused_before_ranking(capsys, tmp_path, monkeypatch):
    """bench.warmup_steps=1 passes composition but every prepared run refuses it: recommend says so in one line
    and writes nothing, instead of writing recipes the printed sweep then prunes."""
    from harness.launch.recommend import recommend_main

    monkeypatch.setenv("HARNESS_CONFIG_DIR", str(tmp_path / "config"))
    code = recommend_main(["--global-batch", "8", "--top", "1", "model=tiny_llama", "engine=deepspeed",
                           "cluster=local_slurm", "bench.warmup_steps=1", "tracking=disabled"])
    err = capsys.readouterr().err
    assert code == 2 and "bench.warmup_steps=1 must be >= 2" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "config").exists()


def test_a_layout_line_names_each_offload_so_two_layouts_never_print_alike():
    def plan(optimizer: str, params: str) -> SimpleNamespace:
        layout = SimpleNamespace(tp=1, cp=1, pp=1, ep=1, dp_replicate=1, dp_shard=8, zero_stage=3, micro_batch=1,
                                 grad_accum=4, activation_checkpointing="full", precision="bf16",
                                 offload_optimizer=optimizer, offload_params=params)
        return SimpleNamespace(layout=layout, engine=SimpleNamespace(compile=False))

    lines = {(o, p): label(plan(o, p)) for o in ("none", "cpu", "nvme") for p in ("none", "cpu", "nvme")}
    assert len(set(lines.values())) == len(lines)
    assert lines[("cpu", "none")].endswith("ckpt=full offload_optimizer=cpu")
    assert lines[("cpu", "nvme")].endswith("offload_optimizer=cpu offload_params=nvme")
    assert lines[("none", "none")].endswith("ckpt=full")


def test_a_recommended_uneven_split_is_printed_and_plans_as_printed():
    """Llama-3.1-70B's 80 layers over pp16 x 2 virtual stages split unevenly: the line left the split out, and the
    layout it named (planned without it) was refused."""
    from harness.config.compose import compose_run_config
    from harness.config.naming import run_label, stage_layers_words
    from harness.launch.recommend import pinned_regime, ranked, recommend_overrides
    from harness.plan.planner import make_plan

    assert stage_layers_words([2] * 8 + [3] * 16 + [2] * 8) == "2*8,3*16,2*8" and stage_layers_words([]) == ""
    assert stage_layers_words([5, 4, 4, 5]) == "5,4*2,5"
    overrides, _ = recommend_overrides(["model=llama3_1_70b", "cluster=h100_8x8", "engine=nd", "layout.seq_len=8192",
                                        "layout.precision=bf16", "engine.compile=false"])
    base = compose_run_config(overrides)
    top, _ = ranked(base, 512, 1, constraint={"pp": "16", "pp_virtual_stages": "2", "tp": "1"},
                    pinned=pinned_regime(overrides))
    plan = top[0].plan
    assert plan.layout.pp_stage_layers and f"split={stage_layers_words(plan.layout.pp_stage_layers)}" in label(plan)
    assert "split=2*8,3*16,2*8" in run_label(replace(base, layout=plan.layout))
    assert make_plan(replace(base, layout=plan.layout)).valid


def test_a_layout_field_the_search_sets_is_refused_with_the_constraint_that_keeps_it(capsys):
    """layout.tp=2 layout.zero_stage=1 were silently overwritten: the answer had tp1 and ZeRO-3."""
    code = recommend_main(["--global-batch", "64", "--no-write", "model=llama3_1_8b", "cluster=gpu_h100_1x8",
                           "engine=fsdp", "layout.seq_len=4096", "layout.zero_stage=1", "layout.tp=2"])
    err = capsys.readouterr().err
    assert code == 2 and "layout.zero_stage=1, layout.tp=2: the search sets these for every candidate" in err
    assert "`harness recommend --constrain zero_stage=1 --constrain tp=2` ranks only layouts that have it" in err
    assert err.count("\n") == 1  # one line, no traceback


def test_against_names_a_different_batch_and_regime(capsys):
    """--against compared an FP8 + compile winner at 64 sequences with a bf16 eager recipe at 32 and said
    neither: the parts read as if the layout alone made the 2x."""
    argv = ["--global-batch", "64", "--top", "1", "--no-write", "model=llama3_1_8b", "cluster=gpu_h100_1x8",
            "engine=fsdp", "layout.seq_len=4096", "--against", "gpu_llama8b_fsdp_tp2_8gpu"]
    assert recommend_main(argv) == 0
    out = capsys.readouterr().out
    assert "gpu_llama8b_fsdp_tp2_8gpu runs 32 sequences a step, #1 64 (--global-batch)" in out
    assert "#1 runs fp8 compile, gpu_llama8b_fsdp_tp2_8gpu bf16 eager" in out
    assert recommend_main(["--global-batch", "32", *argv[2:9], "layout.precision=bf16", "engine.compile=false",
                           "--against", "gpu_llama8b_fsdp_tp2_8gpu"]) == 0
    out = capsys.readouterr().out
    assert "sequences a step" not in out and "runs bf16 eager, gpu_llama8b" not in out


def test_a_group_chosen_after_a_written_recipe_takes_effect(tmp_path, monkeypatch, capsys):
    # the recipe keeps the overrides the search ran with (the accelerator, the ranked engine options), not the
    # whole sections of its groups, so `launcher=slurm_gpu` after it is the launcher that runs it
    from harness.config.compose import compose_run_config
    monkeypatch.setenv("HARNESS_CONFIG_DIR", str(tmp_path))
    argv = ["--global-batch", "64", "--top", "1", "--name", "rec_groups", "model=llama3_1_8b",
            "cluster=gpu_h100_1x8", "cluster.accelerator=a100_sxm_40gb", "engine=nd"]
    assert recommend_main(argv) == 0
    alone = compose_run_config(["recipes=rec_groups_1"])
    assert alone.launcher.backend == "local" and alone.cluster.accelerator == "a100_sxm_40gb"
    later = compose_run_config(["recipes=rec_groups_1", "launcher=slurm_gpu"])
    assert later.launcher.backend == "slurm" and later.cluster.accelerator == "a100_sxm_40gb"
    assert later.layout == alone.layout and later.engine == alone.engine


def test_against_names_a_different_sequence_length_and_the_groups_the_command_line_replaced(capsys):
    # gpu_llama8b_fsdp_8gpu runs 8 x 2 x 4 = 64 sequences of 4,096 tokens: against #1 at 64 sequences of 8,192
    # the difference is the sequence length, not the global batch; with model=qwen2_5_7b it is planned as Qwen
    argv = ["--global-batch", "64", "--top", "1", "--no-write", "model=llama3_1_8b", "cluster=gpu_h100_1x8",
            "engine=fsdp", "--against", "gpu_llama8b_fsdp_8gpu"]  # the layout group's sequences: 8,192 tokens
    assert recommend_main(argv) == 0
    out = capsys.readouterr().out
    assert "gpu_llama8b_fsdp_8gpu runs sequences of 4,096 tokens, #1 8,192 (layout.seq_len)" in out
    assert "sequences a step" not in out and "is planned with the command line's" not in out
    assert recommend_main([*argv[:5], "model=qwen2_5_7b", *argv[6:]]) == 0
    out = capsys.readouterr().out
    assert "gpu_llama8b_fsdp_8gpu is planned with the command line's model=qwen2_5_7b (its own: llama3_1_8b)" in out
