"""Family tests: `family_helpers` and the plan tests' `plan_helpers` importable under importlib mode."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "unit" / "plan"))
