"""The recommender's ties: choices whose predicted tokens/s bands overlap the first's are named as a tie the
prediction cannot break, and each choice shows its tokens/s with its band."""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

from harness.config.compose import compose_run_config
from harness.launch.recommend import recommend_main, ties_line, why
from harness.plan.planner import make_plan
from harness.plan.recommend import Choice, band_ties
from harness.plan.uncertainty import Band

NINE = Band(0.09, 10, "calibrated", "hopper/data-parallel", 10 / 11)


def _choice(tokens_per_s, band=NINE):
    return Choice(SimpleNamespace(tokens_per_s=tokens_per_s, prediction_band=band), ())


def test_choices_whose_bands_overlap_the_first_are_ties():
    # #1's band reaches down to 91; a choice ties when its band reaches up to it (x * 1.09 >= 91: x >= 83.5)
    top = [_choice(100.0), _choice(90.0), _choice(84.0), _choice(83.0)]
    assert band_ties(top) == [2, 3]
    assert band_ties([_choice(100.0), _choice(99.0, None)]) == [2]  # a point inside the band
    assert band_ties([_choice(100.0, None), _choice(99.0, None)]) == []


def test_the_tie_is_said_in_words_with_how_to_measure_it():
    measure = "harness sweep sweep=mine"
    assert ties_line([_choice(100.0), _choice(90.0), _choice(80.0)], measure) == (
        "#2 is within the model's error of #1 (the ±9% bands overlap): a tie the prediction cannot break; measure "
        "them (harness sweep sweep=mine)")
    assert ties_line([_choice(100.0), _choice(95.0), _choice(85.0)], measure).startswith(
        "#2 and #3 are within the model's error of #1 (the ±9% bands overlap)")
    assert ties_line([_choice(100.0), _choice(80.0), _choice(70.0)], measure) == (
        "#2 to #3 lie beyond the model's error of #1 (no ±9% band overlaps #1's): the prediction separates them")
    assert ties_line([_choice(100.0)], measure) == ""


def test_recommend_prints_each_choice_with_its_band_and_names_the_ties(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_CONFIG_DIR", str(tmp_path))
    argv = ["--global-batch", "64", "--top", "3", "--no-write", "model=llama3_1_8b", "cluster=gpu_h100_1x8",
            "engine=fsdp", "layout.seq_len=4096",
            # the regime the public FSDP tables calibrate: eager bf16 (the search would add compile and fp8)
            "layout.precision=bf16", "engine.compile=false"]
    assert recommend_main(argv) == 0
    out = capsys.readouterr().out
    rates = re.findall(r"\n   ([\d,]+ tokens/s \(±\d+%(?:, uncalibrated)?\)), MFU", out)
    assert len(rates) == 3, out
    assert re.search(r"\n#2( and #3)? (is|are) within the model's error of #1 \(the ±\d+% bands overlap\): a tie the "
                     r"prediction cannot break; measure them \(drop --no-write, then harness sweep sweep=recommended\)",
                     out), out
    assert "note: band ±" in out and "(hopper/data-parallel)" in out


def test_the_why_of_two_tied_choices_says_they_tie():
    plan = make_plan(compose_run_config(["recipes=gpu_llama8b_fsdp_8gpu"]))
    close, far = replace(plan, tokens_per_s=plan.tokens_per_s * 0.98), replace(plan, tokens_per_s=plan.tokens_per_s / 3)
    assert "bands overlap: a tie on the prediction" in why("#2", plan, close)
    assert "overlap" not in why("#2", plan, far)
