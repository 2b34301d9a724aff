"""Slurm's pending reasons that mean a job will never start, in words.

Slurm leaves a job whose request no node or partition can satisfy PENDING for ever (unless the cluster
sets EnforcePartLimits, which refuses it at sbatch time instead); squeue's reason code is the only sign.
The codes and meanings are Slurm's own (squeue(1), "JOB REASON CODES"; resource_limits.html for the
per-job association and QOS limits): each names a request that exceeds what the cluster is configured
to give one job, which waiting cannot change. Reasons that waiting can change (Priority, Resources,
ReqNodeNotAvail while a node is only busy or down for a while, per-user limits) are not here.
"""

from __future__ import annotations

from typing import Optional

NEVER_STARTS = {
    "PartitionConfig": "its request (CPUs, memory or GPUs per node) exceeds what the partition's nodes have",
    "PartitionNodeLimit": "it asks for more nodes than the partition holds or allows",
    "PartitionTimeLimit": "its time limit exceeds the partition's MaxTime",
    "BadConstraints": "no node has the features (--constraint) it asks for",
    "InvalidAccount": "its account is not valid",
    "InvalidQOS": "its QOS is not valid",
    "DependencyNeverSatisfied": "it depends on a job that ended in a way its dependency excludes",
}
# An association's or QOS's limit on one job ("MaxCPUsPerJob" and the like): squeue prints
# Assoc<Limit>PerJobLimit or QOS<Limit>PerJobLimit, e.g. QOSMaxCpuPerJobLimit, AssocMaxNodePerJobLimit.
PER_JOB_LIMIT_SUFFIX = "PerJobLimit"


def never_starts(reason: str) -> Optional[str]:
    """Why a pending job with squeue reason `reason` will never start, in words; None when it may."""
    if reason in NEVER_STARTS:
        return f"{NEVER_STARTS[reason]} (Slurm reason {reason})"
    if reason.endswith(PER_JOB_LIMIT_SUFFIX) and reason.startswith(("Assoc", "QOS")):
        return f"it exceeds a limit its account or QOS sets on any one job (Slurm reason {reason})"
    return None
