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


# Why a pending job waits, for the reasons waiting can change (squeue(1), "JOB REASON CODES";
# resource_limits.html for the per-user and per-account limits). squeue prints "None" while the
# scheduler has not yet looked at a new job.
WAITING = {
    "": "waiting for the scheduler",
    "None": "waiting for the scheduler",
    "Priority": "waiting for jobs of higher priority to start first",
    "Resources": "waiting for enough free nodes, CPUs or memory",
    "Dependency": "waiting for the job it depends on to end",
    "BeginTime": "waiting for its earliest start time (--begin)",
    "JobHeldUser": "held by its user (scontrol release lets it go)",
    "JobHeldAdmin": "held by an administrator",
    "ReqNodeNotAvail": "waiting for a node it needs that is down, drained or reserved",
    "NodeDown": "waiting for a node it needs that is down",
    "Reservation": "waiting for its reservation to start",
    "PartitionDown": "waiting for its partition, which is down",
    "PartitionInactive": "waiting for its partition, which is inactive",
    "Licenses": "waiting for licenses it needs",
    "JobArrayTaskLimit": "waiting for other tasks of its array to end (the array's %N limit)",
    "launch failed requeued held": "held after a failed launch (scontrol release lets it go)",
}
# An association's or QOS's limit on one user's or account's running jobs or resources, e.g.
# QOSMaxJobsPerUserLimit, AssocGrpCpuLimit: the job starts once earlier jobs of that user or account end.
PER_USER_LIMIT_PREFIXES = ("Assoc", "QOS")


def pending_reason(reason: Optional[str]) -> str:
    """Why a job that may still start is pending, in words, with Slurm's own code kept in brackets."""
    code = (reason or "").strip()
    if code in WAITING:
        words = WAITING[code]
    elif code.startswith(PER_USER_LIMIT_PREFIXES) and code.endswith("Limit"):
        words = "waiting until earlier jobs of the same user or account end (a QOS or account limit)"
    else:
        words = "waiting"
    return f"{words} (Slurm reason {code})" if code and code != "None" else words
