"""Host-bound steps of the engines on one GPU: gpu-check's 1B Llama at 64 tokens a micro-batch (two micro-batches,
no checkpointing), run through the harness as gpu-check runs its shapes, so that each step is its host's work:
the model's dispatch, the engine's hooks, the optimizer and the clip. Written for DeepSpeed ZeRO-3's hooks,
whose cost on a GPU host the time model does not otherwise know, beside nd running the bare model.
Usage (on the GPU machine, gpu-wheels installed on PYTHONPATH):  python tools/gpu_engine_floor.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.commands import gpu_check

POINTS = (
    ("nd_seq64", ("engine=nd", "layout.zero_stage=3", "model.init=full")),
    ("deepspeed_zero3_seq64", ("engine=deepspeed", "layout.zero_stage=3", "model.init=full")),
)
COMMON = ("layout.seq_len=64", "layout.activation_checkpointing=none")


def main(path: str) -> None:
    mode = gpu_check.gpu_mode_here()
    runs = Path(path).parent / "runs"
    out = {"rows": []}
    for name, extra in POINTS:
        stage = gpu_check.Stage(name, "shape", (*extra, *COMMON, f"layout.name={name}"))
        outcome = gpu_check.run_stage(stage, gpu_check.stage_overrides(mode, stage, runs, 150), runs / name, None,
                                      print)
        out["rows"].append({"name": name, "status": outcome.status, "reason": outcome.reason,
                            "measured": outcome.measured, "predicted": outcome.predicted})
        Path(path).write_text(json.dumps(out, indent=1))
        print(name, outcome.status, outcome.measured.get("step_time_s"), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
