"""Intra-op threads per rank (OMP_NUM_THREADS): one rule for local runs and Slurm jobs.

torch's intra-op pool and OpenMP size themselves from OMP_NUM_THREADS; DeepSpeed's CPU Adam and the
CPU-offloaded optimizer steps of FSDP and nd run on those threads, so one thread per rank serialises every
offloaded step. torchrun sets 1 when the variable is unset and several ranks share a node; accelerate and
DeepSpeed's launcher pass the variable on as it is. The rule:

- the ranks of a node split its CPUs evenly: CPUs available // ranks per node, at least one. GPU ranks
  always do (their CPU work is data, optimizer offload, launch overhead), and so do CPU ranks whose
  layout offloads the optimizer or the parameters;
- a CPU rank without offload keeps one thread: it stands for one device, and the CPU peak the planner and
  MFU compare with is one core's (`harness calibrate`, measured on one thread).

"CPUs available": locally the CPUs this process may run on (its affinity mask); in a Slurm job the
CPUs of the node's task (SLURM_CPUS_PER_TASK, else SLURM_CPUS_ON_NODE: the whole node with --exclusive),
read at job time by the same rule written in shell (`ThreadRule.shell`). An OMP_NUM_THREADS the caller
exported wins in both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from harness.config.schema import RunConfig

# The shell variable the job script holds the node task's CPU count in.
JOB_CPUS = "node_cpus"
JOB_CPUS_LINE = f'{JOB_CPUS}="${{SLURM_CPUS_PER_TASK:-${{SLURM_CPUS_ON_NODE:-1}}}}"'


@dataclass(frozen=True)
class ThreadRule:
    ranks_per_node: int
    # False: one thread per rank whatever the node holds.
    split: bool

    def threads(self, cpus: int) -> int:
        return max(1, cpus // self.ranks_per_node) if self.split else 1

    def shell(self, cpus: str = JOB_CPUS) -> str:
        """`threads` as a bash arithmetic expansion over the shell variable `cpus`."""
        if not self.split:
            return "1"
        share = f"{cpus} / {self.ranks_per_node}"
        return f"$(( {share} > 1 ? {share} : 1 ))"

    def describe(self) -> str:
        if not self.split:
            return "one thread per CPU rank (each rank is one core)"
        return f"the node's CPUs split among its {self.ranks_per_node} rank(s), at least one each"


def offloads(cfg: RunConfig) -> bool:
    return cfg.layout.offload_optimizer != "none" or cfg.layout.offload_params != "none"


def thread_rule(cfg: RunConfig) -> ThreadRule:
    return ThreadRule(cfg.cluster.accelerators_per_node, split=cfg.cluster.accelerator != "cpu" or offloads(cfg))


def local_cpus() -> int:
    """CPUs this process may run on (a cpuset or taskset narrows os.cpu_count())."""
    return len(os.sched_getaffinity(0))


def local_threads(cfg: RunConfig) -> int:
    return thread_rule(cfg).threads(local_cpus())
