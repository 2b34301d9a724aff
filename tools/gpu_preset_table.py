"""Print README's GPU-preset table rows (harness.launch.recommend.preset_row), one per recipes/gpu_*.yaml."""

from harness import REPO_ROOT
from harness.launch.recommend import preset_row

for path in sorted((REPO_ROOT / "recipes").glob("gpu_*.yaml")):
    print(preset_row(path.stem))
