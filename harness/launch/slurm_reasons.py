"""Slurm's pending reasons that mean a job will never start, in words.

Slurm leaves a job whose request no node or partition can satisfy PENDING for ever (unless the cluster
sets EnforcePartLimits, which refuses it at sbatch time instead); squeue's reason code is the only sign.
The codes and meanings are Slurm's own (squeue(1), "JOB REASON CODES"; resource_limits.html for the
per-job association and QOS limits): each names a request that exceeds what the cluster is configured
to give one job, which waiting cannot change. Reasons that waiting can change (Priority, Resources,
per-user limits) are not here. ReqNodeNotAvail is "never" only when the nodes say so: `nodes_never_come`
decides it from sinfo's node states, once too few usable nodes have stayed so for NODES_GRACE_S.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

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


# ------------------------------------------------------------------------------- ReqNodeNotAvail

REQ_NODE_NOT_AVAIL = "ReqNodeNotAvail"
# Node states (sinfo %T, base name) in which a node takes no new job and will not by itself (sinfo(1),
# "NODE STATE CODES"): down, drained or draining (only an administrator's `scontrol update` ends a
# drain), failed or failing, future (configured, not yet in service), inval (its registration did not
# match slurm.conf). A "*" suffix is "not responding". Every other state (idle, mixed, allocated,
# completing, reserved, planned, powered down "~" and powering up "#", which resume on demand) may
# still run the job later.
UNUSABLE_STATES = frozenset({"down", "drain", "drained", "draining", "fail", "failing", "future", "inval"})
NOT_RESPONDING = "*"
STATE_FLAGS = "*~#!%$@^-+"  # sinfo's state suffixes (sinfo(1), "NODE STATE CODES")
# How long too few usable nodes must last before a ReqNodeNotAvail job is declared never to start:
# a node that stops answering is marked DOWN after SlurmdTimeout (slurm.conf default 300 s) and, with
# ReturnToService=1/2, comes back by itself once its slurmd registers again (a restart, a reboot).
# Twice that default covers a node going down and coming back on its own.
NODES_GRACE_S = 600.0
SHOWN_NODES = 8  # unusable nodes named in the reason; the rest are counted


def hostnames(hostlist: str) -> List[str]:
    """Slurm's compact host list expanded: 'n[1-3,7],gpu05' -> n1 n2 n3 n7 gpu05 (zero padding kept)."""
    names: List[str] = []
    for prefix, ranges, suffix in re.findall(r"([^,\[]+)(?:\[([^\]]*)\])?([^,\[]*)", hostlist or ""):
        if not ranges:
            names.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            width = len(first)
            names += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(first), int(last or first) + 1)]
    return [name for name in names if name]


def node_problem(node: Mapping[str, str]) -> Optional[str]:
    """Why a node (a parsed sinfo line) takes no new job, in words ('drained (maintenance)'); None when usable."""
    state = (node.get("state") or "").lower()
    base = state.rstrip(STATE_FLAGS)
    if base not in UNUSABLE_STATES and NOT_RESPONDING not in state[len(base):]:
        return None
    words = base if NOT_RESPONDING not in state[len(base):] else f"{base} and not responding"
    reason = (node.get("reason") or "").strip()
    return f"{words} ({reason})" if reason and reason.lower() != "none" else words


def nodes_never_come(job: Mapping[str, Any], nodes: Sequence[Mapping[str, str]], since: Optional[float],
                     now: float) -> Tuple[Optional[float], Optional[str]]:
    """For a job pending with ReqNodeNotAvail: (since when its nodes have been short, None when they are
    not; why it will never start, in words, once that has lasted NODES_GRACE_S; else None).

    The rule: the job needs `node_count` nodes of its partition, and by name each of `required_nodes`
    (less `excluded_nodes`, as squeue --json reports them). Its nodes are short when, in each of its
    partitions (a job may name several), a required node is absent or unusable (`node_problem`), or fewer
    than `node_count` of the partition's nodes are usable. `since` is when they were first seen short
    (kept by the caller between polls); a poll that finds them sufficient resets it.
    """
    needed = max(1, int(job.get("node_count") or 1))
    required = hostnames(str(job.get("required_nodes") or ""))
    excluded = set(hostnames(str(job.get("excluded_nodes") or "")))
    shortages: List[str] = []
    for partition in [p for p in str(job.get("partition") or "").split(",") if p]:
        members: Dict[str, Mapping[str, str]] = {n["node"]: n for n in nodes if n.get("partition") == partition}
        problems = {name: "excluded by the job (--exclude)" if name in excluded else node_problem(node)
                    for name, node in members.items()}
        usable = [name for name, problem in problems.items() if problem is None]
        missing = [name for name in required if name not in members]
        bad = [name for name in required if problems.get(name)]
        if not missing and not bad and len(usable) >= needed:
            return None, None  # this partition can still run it
        if missing or bad:
            named = [f"{name} does not exist in partition {partition}" for name in missing]
            named += [f"{name} {problems[name]}" for name in bad]
            shortages.append(f"it asks for node{'s' if len(required) > 1 else ''} {','.join(required)} by name: "
                             + "; ".join(named))
            continue
        down = sorted(name for name, problem in problems.items() if problem)
        listed = ", ".join(f"{name} {problems[name]}" for name in down[:SHOWN_NODES])
        more = f" and {len(down) - SHOWN_NODES} more" if len(down) > SHOWN_NODES else ""
        shortages.append(f"it needs {needed} node{'s' if needed > 1 else ''} of partition {partition}, "
                         f"only {len(usable)} usable: {listed or f'the partition has {len(members)} nodes'}{more}")
    if not shortages:
        return None, None  # no partition named: nothing to judge
    since = now if since is None else since
    if now - since < NODES_GRACE_S:
        return since, None
    return since, f"{'; '.join(shortages)}, for {(now - since) / 60:.0f} min (Slurm reason {REQ_NODE_NOT_AVAIL})"
