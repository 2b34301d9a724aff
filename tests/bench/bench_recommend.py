"""Benchmark: `harness recommend` over the full layout space of Llama-3.1-405B on 16,384 H100 (sequence 8192,
16M-token global batch) within 5 s of CPU, and the top 5 for 8B on 8 and 70B on 64 H100 beside it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.config.compose import compose_run_config  # noqa: E402
from harness.launch.recommend import ranked, recommend_overrides, row, why  # noqa: E402

BUDGET_S = 5.0
GLOBAL_BATCH = 16 * 1024 * 1024 // 8192  # sequences of 8192 tokens in 16M tokens
CASES = (("llama3_1_8b", 1), ("llama3_1_70b", 8), ("llama3_1_405b", 2048))


def main() -> int:
    status = 0
    for model, nodes in CASES:
        overrides, _ = recommend_overrides([f"model={model}", "engine=nd", "cluster=gpu_h100_128x8",
                                            f"cluster.nodes={nodes}", "layout.seq_len=8192"])
        cfg = compose_run_config(overrides)
        cpu, wall = time.process_time(), time.perf_counter()
        top, fitting = ranked(cfg, GLOBAL_BATCH, 5)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(f"\n{model} on {nodes * 8} H100: {fitting} admitted layouts ranked in {cpu:.2f} s CPU ({wall:.2f} s wall)")
        for i, choice in enumerate(top, 1):
            print(row(i, choice))
        if len(top) > 1:
            print(why("#2", top[0].plan, top[1].plan))
        if model == "llama3_1_405b" and cpu > BUDGET_S:
            print(f"over budget: {cpu:.2f} s CPU > {BUDGET_S} s", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
