"""`harness tune`'s loop with a stand-in for the cluster: runs that take the predicted parts times known factors
are refitted to those factors (prediction error to zero), the refitted profile is written under a new name and
never over an existing one, and the pick is the measured best."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from harness.config.compose import compose_run_config
from harness.launch import tune as tune_module
from harness.launch.tune import Measurement, Space, key, report, tune
from harness.plan import hardware
from harness.plan.engine_factors import median_error, parts

TRUE = {"compute": 2.0, "comm": 0.5}
OVERRIDES = ("model=tiny_llama", "engine=fsdp", "cluster=h100_8x8", "cluster.nodes=1", "layout.seq_len=256")


def stand_in(calls):
    def measure(round_, name):
        calls.append(name)
        out = {}
        for _, plan in round_:
            compute, comm = parts(plan.time)
            step = TRUE["compute"] * compute + TRUE["comm"] * comm
            out[key(plan)] = Measurement(step, plan.tokens_per_s * plan.time.step_time_s / step)
        return out
    return measure


def test_tune_refits_known_factors_writes_a_new_profile_and_picks_the_measured_best(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "PROFILE_DIR", tmp_path)
    space = Space(OVERRIDES, compose_run_config(list(OVERRIDES)))
    calls = []
    tuned = tune([space], 64, 4, "t", stand_in(calls))
    assert calls[0] == "t_r1" and len(tuned.recommended) == 4
    samples = tuned.samples()
    assert median_error(samples) > 0.2
    new = tuned.after["fsdp"]
    fitted = {k: new[k] for k in TRUE}
    assert median_error(samples, fitted) == pytest.approx(0.0, abs=1e-6)
    assert tuned.profile == tmp_path / "h100_sxm-t.json"
    written = json.loads(tuned.profile.read_text())
    assert written["engine_factors"]["fsdp"] == pytest.approx(fitted) and written["name"] == "h100_sxm-t"
    assert hardware.load_profile(tuned.profile) is not None  # the planner can read it back
    best = tuned.best()
    assert all(tuned.measured[best].tokens_per_s >= m.tokens_per_s for m in tuned.measured.values())
    lines = "\n".join(report(tuned))
    assert "engine factors fsdp: compute 1.000 ->" in lines and "0.0% after" in lines
    assert f"measured best (the pick): {best[0]} {best[1]}" in lines
    again = tune([space], 64, 4, "t", stand_in([]))
    assert again.profile == tmp_path / "h100_sxm-t-2.json"  # the first profile is kept
    assert json.loads(tuned.profile.read_text()) == written


def test_tune_refuses_a_cluster_with_no_profile_in_one_line(capsys):
    code = tune_module.tune_main(["--global-batch", "8", "model=tiny_llama", "cluster=cpu", "cluster.profile=null",
                                  "launcher=local"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cluster.accelerator=cpu" in err


def test_the_report_shows_an_engine_measured_only_after_the_refit_with_its_factors_kept(tmp_path, monkeypatch):
    """The re-ranked top may be another engine's layout, run after the refit: it is reported, not refitted."""
    monkeypatch.setattr(hardware, "PROFILE_DIR", tmp_path)
    space = Space(OVERRIDES, compose_run_config(list(OVERRIDES)))
    tuned = tune([space], 64, 2, "t", stand_in([]))
    other = replace(tuned.predicted[key(tuned.recommended[0])], engine=replace(space.cfg.engine, name="deepspeed"))
    tuned.predicted[key(other)] = other
    tuned.measured[key(other)] = Measurement(other.time.step_time_s, 1.0)
    lines = "\n".join(report(tuned))
    assert "engine factors deepspeed: compute 1.000 -> 1.000, comm 1.000 -> 1.000" in lines


def test_over_several_engines_each_engine_is_measured():
    spaces = [Space(o, compose_run_config(list(o))) for o in
              (OVERRIDES, tuple(x if x != "engine=fsdp" else "engine=deepspeed" for x in OVERRIDES))]
    chosen = tune_module.top_k(spaces, 64, 2)
    assert sorted(plan.engine.name for _, plan in chosen) == ["deepspeed", "fsdp"]
    assert len(tune_module.top_k(spaces[:1], 64, 2)) == 2


def test_the_command_line_tunes_several_engines_each_best_measured_and_refitted(tmp_path, monkeypatch, capsys):
    """`engine=deepspeed,fsdp` on `harness tune`'s command line searches both engines, each one's best in the
    round, and refits each engine's own factors."""
    monkeypatch.setattr(hardware, "PROFILE_DIR", tmp_path)
    rounds = []
    monkeypatch.setattr(tune_module, "sweep_measure", lambda results_dir: stand_in_rounds(rounds))
    others = [o for o in OVERRIDES if not o.startswith("engine=")]
    code = tune_module.tune_main(["--global-batch", "64", "--top", "2", *others, "engine=deepspeed,fsdp",
                                  f"results_dir={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0
    first = rounds[0]
    assert sorted(plan.engine.name for _, plan in first) == ["deepspeed", "fsdp"]
    for space, plan in first:  # each layout was ranked in its own engine's space
        assert f"engine={plan.engine.name}" in space.overrides and space.cfg.engine.name == plan.engine.name
        best = tune_module.ranked(space.cfg, 64, 1)[0][0].plan
        assert key(best) == key(plan)
    assert "engine factors deepspeed: compute 1.000 ->" in out and "engine factors fsdp: compute 1.000 ->" in out


def stand_in_rounds(rounds):
    measure = stand_in([])

    def record(round_, name):
        rounds.append(list(round_))
        return measure(round_, name)
    return record


@pytest.mark.parametrize("value, said", [("deepspeed,deepspeed", "names deepspeed more than once"),
                                         ("fsdp,", "has an empty engine name")])
def test_a_bad_engine_list_is_refused_in_one_line(value, said, capsys):
    code = tune_module.tune_main(["--global-batch", "8", "model=tiny_llama", f"engine={value}"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and said in err and f"engine={value}" in err


def test_tune_with_no_layout_admitted_runs_nothing_and_says_why(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hardware, "PROFILE_DIR", tmp_path)
    monkeypatch.setenv("HARNESS_CONFIG_DIR", str(tmp_path / "config"))
    started = []
    monkeypatch.setattr(tune_module, "sweep_measure", lambda results: lambda round_, name: started.append(name))
    code = tune_module.tune_main(["--global-batch", "64", "--top", "2", "model=llama3_1_405b", "cluster=gpu_h100_1x8",
                                  "engine=deepspeed", "layout.seq_len=8192", f"results_dir={tmp_path / 'results'}"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("harness tune: no layout fits: ") and started == []
    assert "the host runs out of memory first" in err and "closest to fitting: " in err
    assert not (tmp_path / "config").exists() and not (tmp_path / "results").exists()
