"""The printed and stored command of a local run is runnable as shown: no placeholders, its variables in it."""

from __future__ import annotations

import os
import subprocess
import sys

from harness.engines.rendered import RenderedRun
from harness.launch.local import COMMAND_FILE, local_command

PROGRAM = "import os, sys; print(os.environ['DS_ACCELERATOR'], os.environ.get('WANDB_MODE'), sys.argv[1:])"


def _rendered(tmp_path):
    return RenderedRun(run_dir=str(tmp_path), engine="deepspeed", launcher="torchrun", nnodes=1, nproc_per_node=2,
                       argv=[sys.executable, "-c", PROGRAM, "--node_rank", "{node_rank}", "--master_addr",
                             "{master_addr}", "--master_port", "{master_port}"], env={"DS_ACCELERATOR": "cpu"})


def test_printed_line_runs_as_shown(tmp_path):
    command = local_command(_rendered(tmp_path), {"WANDB_MODE": "offline"})
    assert "{" not in command.line.replace(PROGRAM, "")
    env = {k: v for k, v in os.environ.items() if k not in ("DS_ACCELERATOR", "WANDB_MODE")}
    out = subprocess.run(["bash", "-c", command.line], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    port = command.argv[command.argv.index("--master_port") + 1]
    assert out.stdout.strip() == f"cpu None ['--node_rank', '0', '--master_addr', '127.0.0.1', '--master_port', '{port}']"


def test_stored_script_adds_the_tracking_variables(tmp_path):
    local_command(_rendered(tmp_path), {"WANDB_MODE": "offline"})
    script = tmp_path / COMMAND_FILE
    assert os.access(script, os.X_OK)
    env = {k: v for k, v in os.environ.items() if k not in ("DS_ACCELERATOR", "WANDB_MODE")}
    out = subprocess.run([str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("cpu offline ["), out.stderr
