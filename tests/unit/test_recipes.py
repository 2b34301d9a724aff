"""Every preset plans without an error, fits its devices, and renders (GPU presets render only)."""

import pytest

from harness import REPO_ROOT
from harness.config.compose import compose_run_config
from harness.launch.prepare import prepare_run
from harness.plan.planner import make_plan

RECIPES = sorted(p.stem for p in (REPO_ROOT / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_plans_fits_and_renders(recipe, tmp_path):
    run = compose_run_config([f"recipes={recipe}"])
    plan = make_plan(run)
    assert plan.valid, plan.errors
    assert plan.fits, f"{recipe}: predicted {plan.memory.total_bytes / 2**30:.1f} GiB per rank does not fit"
    prepared = prepare_run(run, tmp_path / recipe)
    if run.engine.name == "megatron_lm":
        assert prepared.pruned  # export only: the command line is written, nothing is launched
    else:
        assert prepared.rendered is not None
    for name in (prepared.rendered.files if prepared.rendered else ["megatron_args.sh"]):
        assert (tmp_path / recipe / name).exists()
