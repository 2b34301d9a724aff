"""The one pipeline module: layers per stage (explicit or even), stage -> rank placement, schedule rules."""

import pytest

from harness.plan.pipeline import pipeline_problems, rank_stages, stage_layer_counts, stage_layer_indices, stage_to_rank


def test_even_split_or_the_explicit_one():
    assert stage_layer_counts(8, 4, 1) == (2, 2, 2, 2)
    assert stage_layer_counts(8, 2, 2) == (2, 2, 2, 2)
    assert stage_layer_counts(10, 4, 1, [1, 4, 4, 1]) == (1, 4, 4, 1)
    assert stage_layer_counts(5, 1, 1) == (5,)
    assert stage_layer_indices((1, 0, 2)) == [[0], [], [1, 2]]


@pytest.mark.parametrize("num_layers, pp, virtual, explicit", [(10, 4, 1, ()), (8, 4, 1, [1, 3, 3]),
                                                               (8, 2, 1, [5, 4])])
def test_a_split_validation_refuses_raises(num_layers, pp, virtual, explicit):
    with pytest.raises(ValueError):
        stage_layer_counts(num_layers, pp, virtual, explicit)


def test_loop_and_v_placement():
    assert [stage_to_rank(s, 2, "Interleaved1F1B") for s in range(4)] == [0, 1, 0, 1]
    assert [stage_to_rank(s, 2, "ZBVZeroBubble") for s in range(4)] == [0, 1, 1, 0]
    assert [stage_to_rank(s, 4, "DualPipeV") for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert rank_stages("Interleaved1F1B", 4, 3, 1) == (1, 5, 9)
    assert rank_stages("ZBVZeroBubble", 4, 2, 1) == (1, 6)
    assert rank_stages("1F1B", 1, 1, 0) == (0,)


def test_uneven_only_when_explicit():
    errors, _ = pipeline_problems(4, 1, 4, "1F1B", (), 10)
    assert errors == ("pp=4 x pp_virtual_stages=1 = 4 must divide num_hidden_layers=10 (or give pp_stage_layers)",)
    errors, warnings = pipeline_problems(4, 1, 4, "1F1B", (1, 4, 4, 1), 10)
    assert errors == () and warnings == ("pp_stage_layers=[1, 4, 4, 1]: uneven split, the largest stage sets the pace",)


def test_middle_stages_need_a_layer_the_ends_may_hold_none():
    assert pipeline_problems(3, 1, 3, "1F1B", (0, 2, 0), 2)[0] == ()
    errors, _ = pipeline_problems(3, 1, 3, "1F1B", (1, 0, 1), 2)
    assert "the middle stages need >= 1 layer" in errors[0]
