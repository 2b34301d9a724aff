"""Instrumentation overhead: the default recipe's timed steps vs the same engine's bare loop, one run.

Prepares the default recipe's run directory, starts its ranks with the rendered launcher, and on every
rank alternates blocks of instrumented steps (`harness.runtime.bench.timed_steps`) and bare
`session.train_step` calls, so drift on a shared machine hits both alike. Prints the ratio of their
total times (target: at most 1.01).
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

BLOCKS, STEPS_PER_BLOCK = 8, 10


def rank_main(run_dir: Path) -> None:
    import time

    import torch
    import torch.distributed as dist

    from harness.engines.registry import rank_side
    from harness.modeling import device
    from harness.modeling.model import build_model
    from harness.runtime.bench import batch_maker, load_run, timed_steps, warm_up
    from harness.runtime.data import token_source
    from harness.runtime.meter import StepTimer

    cfg, _ = load_run(run_dir)
    kind = device.choose_device_kind(cfg.cluster.accelerator, torch.cuda.is_available())
    model = build_model(cfg.model.hf_config, cfg.bench.seed)
    session = rank_side(cfg.engine.name).apply(cfg, run_dir, model, kind)
    batches = batch_maker(session, token_source(cfg.data, cfg.model.hf_config["vocab_size"], cfg.layout.seq_len), cfg)
    warm_up(session, batches, replace(cfg.bench, warmup_steps=3, warmup_max_steps=3), kind)
    totals_s = {"instrumented": 0.0, "bare": 0.0}

    def instrumented(steps):
        losses: list = []
        timed_steps(session, batches, steps, StepTimer(kind), losses)
        [float(loss) for loss in losses]

    def bare(steps):
        for s in steps:
            float(session.train_step(batches(s)))

    step = 3
    for block in range(BLOCKS):
        # ABBA order, so drift and warm-up effects fall on both loops alike.
        order = (("instrumented", instrumented), ("bare", bare))
        for name, loop in order if block % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            loop(range(step, step + STEPS_PER_BLOCK))
            totals_s[name] += time.perf_counter() - start
            step += STEPS_PER_BLOCK
    instrumented, bare = totals_s["instrumented"], totals_s["bare"]
    totals = [None] * dist.get_world_size()
    dist.all_gather_object(totals, (instrumented, bare))
    if dist.get_rank() == 0:
        instrumented, bare = max(t[0] for t in totals), max(t[1] for t in totals)
        print(json.dumps({"instrumented_s": instrumented, "bare_s": bare, "ratio": instrumented / bare}))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    import subprocess

    from harness.config.compose import compose_run_config
    from harness.launch.local import free_port, rank_environment, resolve_executable
    from harness.launch.prepare import prepare_run

    cfg = compose_run_config(["recipes=cpu_zero2", "tracking=disabled"])
    run_dir = Path(tempfile.mkdtemp(prefix="harness-overhead-"))
    prepared = prepare_run(cfg, run_dir)
    argv = prepared.rendered.argv_for("0", "127.0.0.1", str(free_port()))
    program = argv.index("-m")
    argv[0] = resolve_executable(argv[0])
    argv[program:] = [str(Path(__file__).resolve()), "--rank", str(run_dir)]
    out = subprocess.run(argv, env=rank_environment(prepared.rendered, {}), capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        sys.exit(f"overhead benchmark failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    result = json.loads(lines[-1])
    verdict = "ok" if result["ratio"] <= 1.01 else "ABOVE TARGET"
    print(f"instrumentation overhead: instrumented {result['instrumented_s']:.3f} s / bare {result['bare_s']:.3f} s"
          f" = {result['ratio']:.4f} (target <= 1.01: {verdict}; {BLOCKS}x{STEPS_PER_BLOCK} steps each)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rank":
        rank_main(Path(sys.argv[2]))
    else:
        main()
