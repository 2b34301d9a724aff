"""Time `build_report` on a synthetic sweep (default 100 runs): python tests/unit/report/bench_build_report.py [N]."""

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from harness.report.build import build_report  # noqa: E402
from tests.unit.report.synthetic_runs import make_big_sweep  # noqa: E402


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    with tempfile.TemporaryDirectory() as tmp:
        sweep_dir = make_big_sweep(Path(tmp), runs)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            paths = build_report([sweep_dir], sweep_dir)
            times.append(time.perf_counter() - start)
        sizes = ", ".join(f"{p.name} {p.stat().st_size / 1024:.0f} KiB" for p in paths.values())
        print(f"build_report on {runs} runs: first {times[0]:.2f} s (imports included), "
              f"then {min(times[1:]):.2f} s; {sizes}")


if __name__ == "__main__":
    main()
