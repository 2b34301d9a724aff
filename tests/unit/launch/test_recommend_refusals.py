"""When nothing can run, `harness recommend` says why: the refusals' most common reasons with their counts, and the
layout that came closest to fitting; and offloaded states a node cannot hold in its host memory are a refusal, in
every command, not a note."""

from __future__ import annotations

import re

import pytest

from harness.config.compose import compose_run_config
from harness.engines.admission import judge
from harness.launch.recommend import recommend_main

OFFLOADED_405B = ["model=llama3_1_405b", "cluster=gpu_h100_1x8", "engine=deepspeed", "layout.seq_len=8192",
                  "layout.dp_shard=8", "layout.zero_stage=3", "layout.micro_batch=1", "layout.grad_accum=8",
                  "layout.activation_checkpointing=full", "layout.offload_optimizer=cpu", "layout.offload_params=cpu"]


def test_offloaded_states_over_the_nodes_host_memory_are_refused_naming_both_sizes():
    # 405.85e9 parameters: fp32 master + two moments (12 B) and bf16 parameters (2 B) on the host, /8 ranks x 8
    # ranks per node = 14 B x 405.85e9 = 5,292 GiB per node before the gradients' buffers: far over 2 TiB.
    verdict = judge(compose_run_config(OFFLOADED_405B))
    assert verdict.plan.fits is True  # its device memory fits: only the host refuses it
    host = [e for e in verdict.errors if "host memory" in e]
    assert len(host) == 1 and verdict.errors == tuple(host), verdict.errors
    need = float(re.search(r"need ([\d.]+) GiB of host memory per node", host[0]).group(1))
    assert need > 14 * 405e9 / 2**30 and "> cluster.host_memory_gib=2048.0: would run out of host memory" in host[0]
    roomy = judge(compose_run_config([*OFFLOADED_405B, "cluster.host_memory_gib=8192"]))
    assert roomy.admitted, roomy.errors


def test_nothing_admitted_prints_the_reasons_by_count_and_the_closest_layout(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_CONFIG_DIR", str(tmp_path))
    argv = ["--global-batch", "64", "model=llama3_1_405b", "cluster=gpu_h100_1x8", "engine=deepspeed",
            "layout.seq_len=8192"]
    assert recommend_main(argv) == 1
    err = capsys.readouterr().err.splitlines()
    head = re.match(r"harness recommend: no layout fits: ([\d,]+) candidate layouts refused; the most common "
                    r"reasons:$", err[0])
    assert head, err
    counts = [int(re.match(r"  ([\d,]+)x(, the only reason:)? \S", line).group(1).replace(",", "")) for line in err[1:4]]
    assert counts == sorted(counts, reverse=True) and counts[0] <= int(head.group(1).replace(",", ""))
    # ZeRO 0-2 build the whole 405B on each of 8 ranks: 12 TiB of fp32 on a 2 TiB host
    assert any("the host runs out of memory first" in line for line in err[1:4])
    closest = re.match(r"  closest to fitting: tp\d.* needs ([\d.]+) GiB per rank of 80\.00 GiB \(over by ([\d.]+) "
                       r"(GiB|MiB)\)$", err[-1])
    assert closest and float(closest.group(1)) > 80, err
    assert not any(tmp_path.iterdir())  # no preset written


def test_a_constraint_no_candidate_has_is_said_as_such(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_CONFIG_DIR", str(tmp_path))
    assert recommend_main(["--global-batch", "64", "--constrain", "tp=3", "model=llama3_1_8b",
                           "cluster=gpu_h100_1x8"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("harness recommend: no layout fits: no candidate has --constrain tp=3 (the search's candidates have "
                   "tp 1, 2, 4, 8)")


def test_a_layout_the_local_launcher_would_stop_is_not_recommended_and_the_refusal_says_so(capsys):
    # Llama-3.1-70B, 512 sequences of 4,096 a step on 8 H100: every fitting layout takes minutes a step, and
    # 7 steps of it overrun the local launcher's 30 minutes; the rule that alone refuses them is printed
    args = ["--no-write", "--global-batch", "512", "model=llama3_1_70b", "cluster=gpu_h100_1x8", "engine=nd"]
    assert recommend_main(args) != 0
    err = capsys.readouterr().err
    assert "the only reason: launcher.timeout_s=1800 (30 min) is shorter than the run" in err, err
    assert "set launcher.timeout_s=" in err


@pytest.mark.parametrize("constrain, message", [
    ("zero_stage=1", "no layout fits: no candidate has --constrain zero_stage=1 (the search's candidates have "
                     "zero_stage 0, 2, 3)"),
    ("seq_len=4096", "--constrain seq_len=4096: the search does not vary layout.seq_len; set layout.seq_len=4096"),
    ("tp=abc", "layout.tp='abc' must be an integer"),
    ("activation_checkpointing=FULL", "layout.activation_checkpointing='FULL' must be one of none, selective, full"),
])
def test_a_constraint_no_candidate_can_have_is_named_with_what_the_search_tries(constrain, message, capsys):
    argv = ["--no-write", "--global-batch", "64", "model=llama3_1_8b", "cluster=gpu_h100_1x8", "engine=nd",
            "--constrain", constrain]
    assert recommend_main(argv) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_a_constraint_value_is_held_as_the_layout_holds_it():
    from harness.launch.recommend import parse_constraint
    assert parse_constraint(["tp=08", "layout.pp=4"]) == {"tp": "8", "pp": "4"}


@pytest.mark.parametrize("engine, family", [("nd", "engine=nd runs llama"),
                                            ("megatron_lm", "the Megatron-LM export knows")])
def test_a_model_family_the_engine_cannot_run_is_one_line_before_any_search(engine, family, tmp_path, monkeypatch,
                                                                             capsys):
    monkeypatch.setenv("HARNESS_CONFIG_DIR", str(tmp_path))
    model = "gemma2_9b" if engine == "megatron_lm" else "gpt2"
    assert recommend_main(["--global-batch", "64", f"model={model}", "cluster=gpu_h100_1x8", f"engine={engine}"]) == 2
    out, err = capsys.readouterr()
    assert family in err and len(err.strip().splitlines()) == 1 and "admitted" not in out, (out, err)


def test_a_layout_the_planner_refuses_is_also_refused_for_the_model_family():
    # the engine's own check reads a plannable layout only; its rule on the model holds whatever else is broken,
    # so a refusal list never calls another rule "the only reason"
    cfg = compose_run_config(["model=gpt2", "cluster=gpu_h100_1x8", "engine=nd", "layout.dp_shard=4",
                              "layout.tp=2", "layout.activation_checkpointing=full", "engine.compile=true"])
    verdict = judge(cfg)
    assert not verdict.plan.valid
    assert any("engine.compile=true with tp=2" in e for e in verdict.errors), verdict.errors
    assert sum("engine=nd runs llama" in e for e in verdict.errors) == 1, verdict.errors


def test_a_compile_the_search_adds_leaves_no_refusal_for_it_and_a_compile_the_user_sets_does(capsys):
    # nd cannot compile tp > 1 blocks under full recomputation nor zero-bubble stages (compile_problem): the search
    # skips those modes of the compiled regime it adds, whose eager twins it tries anyway; asked for, it says why
    args = ["--no-write", "--global-batch", "512", "model=llama3_1_70b", "cluster=gpu_h100_1x8", "engine=nd"]
    assert recommend_main(args) != 0
    searched = capsys.readouterr().err
    assert "no layout fits" in searched and "engine.compile=true" not in searched, searched
    assert recommend_main([*args, "engine.compile=true"]) != 0
    asked = capsys.readouterr().err
    assert "engine.compile=true with tp=2 and layout.activation_checkpointing=full" in asked, asked
