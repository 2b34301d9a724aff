"""Every GPU recipe is the recommender's choice for its model, cluster, engine and global batch: predicted within
CHOICE_TOLERANCE of the best choice's tokens/s, or within it under the constraint the recipe states with its reason."""

from __future__ import annotations

import re

import pytest

from harness import REPO_ROOT
from harness.config.compose import compose_run_config
from harness.engines.admission import judge
from harness.launch.recommend import CHOICE_TOLERANCE, recipe_constraint, standing
from harness.plan.planner import GIB

GPU_RECIPES = sorted(p.stem for p in (REPO_ROOT / "recipes").glob("gpu_*.yaml"))


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_gpu_recipe_is_the_recommenders_choice(recipe):
    found = standing(recipe)
    verdict = judge(compose_run_config([f"recipes={recipe}"]))
    assert verdict.admitted, f"{recipe} is refused: {verdict.errors}"
    assert found.best is not None, f"{recipe}: the recommender admits no layout under {found.constraint}"
    if found.constraint:
        assert len(found.reason) > 20, f"{recipe}: a constraint needs its reason after ' -- '"
    best = max((found.best.plan, *found.best.alike), key=lambda plan: plan.tokens_per_s)
    assert found.ratio >= 1 - CHOICE_TOLERANCE, (
        f"{recipe}: predicted {found.plan.tokens_per_s:,.0f} tokens/s ({found.plan.predicted_mfu:.1%} MFU), the "
        f"recommender's best {best.tokens_per_s:,.0f} ({best.predicted_mfu:.1%}) with {best.layout}")


def test_readme_lists_every_gpu_recipe_with_its_predicted_mfu_and_memory():
    readme = (REPO_ROOT / "README.md").read_text()
    for recipe in GPU_RECIPES:
        row = re.search(rf"^\| `{recipe}` \|.*$", readme, re.M)
        assert row, f"README.md has no row for {recipe}"
        plan = judge(compose_run_config([f"recipes={recipe}"])).plan
        cells = f"| {plan.predicted_mfu:.1%} | {plan.memory.total_bytes / GIB:.1f} GiB |"
        assert cells in row.group(0), f"{row.group(0)} does not show {cells}"


def test_a_constraint_line_reads_its_fields_and_its_wrapped_reason():
    text = "# @package _global_\n# constraint: tp=8 layout.pp=4 -- shows TP8 within a node\n#   and PP4 across\nx: 1\n"
    assert recipe_constraint(text) == ({"tp": "8", "pp": "4"}, "shows TP8 within a node and PP4 across")
    assert recipe_constraint("# @package _global_\n") == ({}, "")
