"""`harness run -m` names its run directories as `harness sweep` does: by the values that differ."""

import os
import subprocess
import sys

from harness import REPO_ROOT


def test_multirun_directories_are_named_by_what_differs(tmp_path):
    # bench.warmup_steps=1 is refused when each point is prepared, after Hydra made its directory: nothing
    # launches, and the directory names are what is under test.
    out = subprocess.run([sys.executable, "-m", "harness.cli", "run", "-m", "layout.zero_stage=1,3",
                          "bench.warmup_steps=1", "tracking=disabled", f"results_dir={tmp_path}"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert out.returncode == 1, out.stderr
    names = sorted(path.name for path in tmp_path.glob("adhoc/*/*") if path.is_dir())
    # Before: both were `N-deepspeed-dp2_zero2`, the layout preset's name, whatever zero stage ran.
    assert names == ["000-zero1", "001-zero3"], names
    assert not any(tmp_path.rglob("rendered.json"))


def test_a_run_folder_is_named_by_the_layout_it_runs(tmp_path):
    """recipes=cpu_zero2 layout.zero_stage=3 ran ZeRO-3 in a `deepspeed-dp2_zero2` folder, beside a dp2_zero3
    layout in its own summary row; a name of the generated form follows the fields, another stays the user's."""
    from harness.config.compose import compose_config, register_schemas
    from omegaconf import OmegaConf

    register_schemas()
    for overrides, name in ((["recipes=cpu_zero2", "layout.zero_stage=3"], "deepspeed-dp2_zero3"),
                            (["recipes=cpu_zero2"], "deepspeed-dp2_zero2"),
                            (["recipes=cpu_zero2", "layout.name=mine", "layout.zero_stage=3"], "deepspeed-mine")):
        cfg = compose_config([*overrides, f"results_dir={tmp_path}"], return_hydra_config=True)
        assert OmegaConf.to_container(cfg.hydra.run, resolve=True)["dir"].endswith("/" + name), overrides
