"""The layer rules between the harness packages ([tool.importlinter] in pyproject.toml) hold, and break on a
backwards import."""

from __future__ import annotations

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
