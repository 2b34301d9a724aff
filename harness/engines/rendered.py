"""`RenderedRun`: what an engine writes into a run directory and how its ranks are started."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List

from harness.rundir import RENDERED_FILE, write_text

# Placeholders in `argv` that the launcher fills: locally with concrete values, on Slurm with env vars.
NODE_RANK, MASTER_ADDR, MASTER_PORT = "{node_rank}", "{master_addr}", "{master_port}"
RANK_PROGRAM = ["-m", "harness.runtime.bench"]
# Rendezvous port of a Slurm job: PORT_BASE + job id mod PORT_SPAN. 20000-29999 stays below Linux's ephemeral
# range (32768-60999), so a port is never taken by an outgoing connection; two jobs collide only if their ids
# differ by a multiple of 10000. Used by the job template and by the Megatron-LM export's script.
PORT_BASE, PORT_SPAN = 20000, 10000
# Rendezvous ports of local runs: drawn from 10000-19999, below the ephemeral range for the same reason (gloo
# opens dozens of connections a run, each on an ephemeral port, and one could take a port between the harness's
# check and the launcher's bind) and apart from the Slurm jobs' ports on a host that also runs them.
LOCAL_PORTS = range(10000, PORT_BASE)


@dataclass(frozen=True)
class RenderedRun:
    run_dir: str
    engine: str
    launcher: str
    nnodes: int
    nproc_per_node: int
    # One node's launch line, with the placeholders above.
    argv: List[str]
    env: Dict[str, str] = field(default_factory=dict)
    files: List[str] = field(default_factory=list)

    def argv_for(self, node_rank: str, master_addr: str, master_port: str) -> List[str]:
        values = {NODE_RANK: node_rank, MASTER_ADDR: master_addr, MASTER_PORT: master_port}
        out = []
        for token in self.argv:
            for placeholder, value in values.items():
                token = token.replace(placeholder, value)
            out.append(token)
        return out

    def save(self) -> Path:
        path = Path(self.run_dir) / RENDERED_FILE
        return write_text(path, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> "RenderedRun":
        return cls(**json.loads((Path(run_dir) / RENDERED_FILE).read_text()))

    def command_line(self) -> str:
        return shlex.join(self.argv)


# How often torchrun (and accelerate, which runs torch elastic) looks at its ranks, seconds (torch's default 0.1).
# A rank that died stays a zombie until then, so the run's watchdog (harness.launch.watchdog, 20 ms) reads its
# exit signal before the launcher reaps it, and its peers write their own errors before the launcher SIGTERMs
# them: the root-cause rank is told apart from the ranks its death took down. The agent also sees success only
# at its next look, so every run ends up to 1 s later (0.5 s on average): noise beside a training run, and the
# price of naming the rank that failed (at 0.1 s the watchdog's 20 ms samples would miss about one exit in ten).
MONITOR_INTERVAL = ["--monitor_interval", "1"]


def launcher_argv(launcher: str, nnodes: int, nproc_per_node: int, run_dir: str, extra: List[str]) -> List[str]:
    """The standard launchers' own flags for one node; `extra` holds engine flags (e.g. accelerate's config)."""
    program = [*RANK_PROGRAM, run_dir]
    rendezvous = ["--master_addr", MASTER_ADDR, "--master_port", MASTER_PORT]
    if launcher == "torchrun":
        return [
            "torchrun", "--nnodes", str(nnodes), "--nproc_per_node", str(nproc_per_node),
            "--node_rank", NODE_RANK, *rendezvous, *MONITOR_INTERVAL, *extra, *program,
        ]  # fmt: skip
    if launcher == "deepspeed":
        # One launcher per node under `--no_ssh`; --num_accelerators makes it start every rank on CPU too;
        # --no_local_rank keeps `--local_rank=N` out of the program's arguments (bench reads argv[1] as the
        # run directory; LOCAL_RANK is in the environment). One node only: see harness.config.checks.
        return [
            "deepspeed", "--no_ssh", "--num_nodes", str(nnodes), "--num_accelerators", str(nproc_per_node),
            "--node_rank", NODE_RANK, *rendezvous, *extra, "--no_local_rank", "--module", *program[1:],
        ]  # fmt: skip
    if launcher == "accelerate":
        return [
            "accelerate", "launch", "--num_machines", str(nnodes),
            "--num_processes", str(nnodes * nproc_per_node), "--machine_rank", NODE_RANK,
            "--main_process_ip", MASTER_ADDR, "--main_process_port", MASTER_PORT, *MONITOR_INTERVAL, *extra,
            *program,
        ]  # fmt: skip
    raise ValueError(f"engine.launcher={launcher!r} is not one of torchrun, deepspeed, accelerate")


def render_launch(cfg, run_dir, launcher: str, files: List[str], env: Dict[str, str] = None,
                  extra: List[str] = ()) -> RenderedRun:
    """The RenderedRun every engine returns: its launcher started on each of the cluster's nodes."""
    nodes, per_node = cfg.cluster.nodes, cfg.cluster.accelerators_per_node
    return RenderedRun(
        run_dir=str(run_dir),
        engine=cfg.engine.name,
        launcher=launcher,
        nnodes=nodes,
        nproc_per_node=per_node,
        argv=launcher_argv(launcher, nodes, per_node, str(run_dir), list(extra)),
        env=dict(env or {}),
        files=list(files),
    )
