"""The layer rules between the harness packages ([tool.importlinter] in pyproject.toml) hold, and break on a
backwards import."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness import REPO_ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter over the `harness` package found at `root`, with the contracts of `root`/pyproject.toml."""
    assert LINT_IMPORTS.exists(), (f"{LINT_IMPORTS} is missing: import-linter is in the test extra "
                                   "(`make setup`, or pip install -c constraints.txt import-linter)")
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_every_layer_contract_is_kept():
    result = lint_imports(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_backwards_import_breaks_the_contracts(tmp_path):
    """report importing launch, in a copy of the package: both the report rule and the layers rule break."""
    shutil.copytree(REPO_ROOT / "harness", tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    table = tmp_path / "harness" / "report" / "table.py"
    table.write_text(table.read_text() + "\nfrom harness.launch.status import refresh  # noqa: E402,F401\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "report imports neither runtime nor launch BROKEN" in result.stdout
    assert "packages are layered (no cycles between them) BROKEN" in result.stdout
    assert "harness.report.table -> harness.launch.status" in result.stdout


# Packages a rank needs and run preparation must not load: importing them takes seconds and, for DeepSpeed,
# probes the accelerator.
RANK_ONLY_PACKAGES = ("torch", "deepspeed", "accelerate", "transformers")
NO_RANK_IMPORTS = """
import sys
from harness.engines.registry import ENGINES, launch_side
import harness.launch.prepare, harness.plan.planner
for name in ENGINES:
    launch_side(name)
print(" ".join(sorted({{m.split(".")[0] for m in sys.modules}} & {packages!r})))
"""


def loaded_rank_packages() -> str:
    """Rank-only packages a fresh interpreter has loaded after importing every engine's launch side."""
    code = NO_RANK_IMPORTS.format(packages=set(RANK_ONLY_PACKAGES))
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=300, check=True)
    return result.stdout.strip()


def test_render_modules_import_no_torch_at_module_level():
    """Every engine's launch side (check, render) and run preparation load no torch, DeepSpeed, Accelerate or
    transformers; a render step that needs one (fsdp's wrapped layer class) imports it inside the function."""
    assert loaded_rank_packages() == ""


MAX_FUNCTION_LINES = 60


def long_functions(root: Path) -> list:
    """(file, function, lines) of every function in `root` longer than MAX_FUNCTION_LINES."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append((str(path.relative_to(root.parent)), node.name, lines))
    return found


def test_no_function_in_the_harness_is_over_60_lines():
    assert long_functions(REPO_ROOT / "harness") == []
