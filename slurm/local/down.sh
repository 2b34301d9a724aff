#!/usr/bin/env bash
# Stop the local Slurm cluster started by slurm/local/up.sh and leave nothing of it running.
#
#   1. cancel every job still queued/running (while slurmctld still answers) so slurmstepd and the
#      job processes end cleanly;
#   2. SIGTERM the daemons from their pid files (slurmd n1/n2, slurmctld, munged), SIGKILL after a grace;
#   3. kill what is left of THIS cluster's jobs (only after an unclean stop, e.g. slurmctld died first):
#      slurmstepd processes whose environment holds our SLURM_CONF, and job processes whose environment
#      holds our SLURM_CONF and a SLURM_JOB_ID; nothing else is touched.
# In cgroup mode (SLURM_LOCAL_CGROUP=1) the empty slurm_n1/slurm_n2 cgroups are removed too.
# The state directory (configs, logs, saved state, jobcomp.txt) is kept; up.sh reuses it.
# Env: SLURM_LOCAL_DIR (default /tmp/harness-slurm). Idempotent: a stopped cluster stays stopped.
set -euo pipefail

STATE_DIR="${SLURM_LOCAL_DIR:-/tmp/harness-slurm}"
GRACE="${SLURM_LOCAL_STOP_GRACE:-10}"
export PATH="$PATH:/usr/sbin:/sbin"
t0=$(date +%s.%N)
log() { printf '[slurm-down] %s\n' "$*" >&2; }

if [[ ! -d "$STATE_DIR" ]]; then
    log "no state directory $STATE_DIR: nothing to stop"
    exit 0
fi
STATE_DIR="$(cd "$STATE_DIR" && pwd)"
export SLURM_CONF="$STATE_DIR/slurm.conf"
unset SLURM_JOB_ID SLURM_JOBID 2>/dev/null || true   # so our own helpers never look like job processes
RUN="$STATE_DIR/run"

pid_of() {  # pid_of PIDFILE NAME -> prints pid if alive and really NAME
    local pid
    [[ -s "$1" ]] || return 1
    pid="$(cat "$1")"
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    grep -q "$2" "/proc/$pid/cmdline" 2>/dev/null || return 1
    echo "$pid"
}
running() {  # running PID -> alive and not a zombie
    local st
    st="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" || return 1
    [[ -n "$st" && "$st" != Z && "$st" != X ]]
}
stop_pids() {  # stop_pids LABEL PID... : TERM, wait GRACE, KILL
    local label="$1"; shift
    (($#)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    local end=$((SECONDS + GRACE)) p left
    while :; do
        left=()
        for p in "$@"; do running "$p" && left+=("$p"); done
        ((${#left[@]} == 0)) && break
        if ((SECONDS >= end)); then
            log "$label: SIGKILL ${left[*]} after ${GRACE}s"
            kill -KILL "${left[@]}" 2>/dev/null || true
            sleep 0.5
            break
        fi
        sleep 0.2
    done
}
# slurmstepd processes of this cluster: their environment carries our SLURM_CONF (inherited from slurmd).
our_stepds() {
    local d pid
    for d in /proc/[0-9]*; do
        pid="${d#/proc/}"
        [[ "$(cat "$d/comm" 2>/dev/null)" == slurmstepd ]] || continue
        running "$pid" || continue
        tr '\0' '\n' 2>/dev/null <"$d/environ" | grep -qx "SLURM_CONF=$SLURM_CONF" && echo "$pid"
    done
    return 0
}

# Job processes of this cluster: environment has our SLURM_CONF and a SLURM_JOB_ID (set by slurmstepd).
# Never this script or its ancestors (down.sh might be called from inside a job).
our_job_procs() {
    local d pid env a=$$ ancestors=" "
    while [[ "$a" =~ ^[0-9]+$ && "$a" -gt 1 ]]; do
        ancestors+="$a "
        a="$(awk '{print $4}' "/proc/$a/stat" 2>/dev/null || echo 0)"
    done
    for d in /proc/[0-9]*; do
        pid="${d#/proc/}"
        [[ "$ancestors" == *" $pid "* ]] && continue
        running "$pid" || continue
        env="$(tr '\0' '\n' 2>/dev/null <"$d/environ")" || continue
        grep -qx "SLURM_CONF=$SLURM_CONF" <<<"$env" && grep -q '^SLURM_JOB_ID=' <<<"$env" && echo "$pid"
    done
    return 0
}

ctld_pid="$(pid_of "$RUN/slurmctld.pid" slurmctld || true)"
# 1. cancel remaining jobs while the controller is up
if [[ -n "$ctld_pid" ]] && timeout 5 scontrol ping >/dev/null 2>&1; then
    jobs="$(timeout 10 squeue -h -t PENDING,RUNNING,SUSPENDED,CONFIGURING,COMPLETING -o '%A' 2>/dev/null | sort -u || true)"
    if [[ -n "$jobs" ]]; then
        log "cancelling $(wc -w <<<"$jobs") job(s)"
        # shellcheck disable=SC2086
        timeout 10 scancel $jobs >/dev/null 2>&1 || true
        end=$((SECONDS + GRACE))
        while ((SECONDS < end)); do
            [[ -z "$(timeout 5 squeue -h -t RUNNING,COMPLETING,CONFIGURING -o '%A' 2>/dev/null || true)" ]] && break
            sleep 0.5
        done
    fi
fi

# 2. daemons: compute nodes first, then the controller, then munge
slurmd_pids=()
for n in n1 n2; do
    p="$(pid_of "$RUN/slurmd-$n.pid" slurmd || true)"
    [[ -n "$p" ]] && slurmd_pids+=("$p")
done
stepds="$(our_stepds)"
stop_pids slurmd "${slurmd_pids[@]}"
[[ -n "$ctld_pid" ]] && stop_pids slurmctld "$ctld_pid"
munge_pid="$(pid_of "$RUN/munged.pid" munged || true)"
[[ -n "$munge_pid" ]] && stop_pids munged "$munge_pid"

# 3. leftover job steps and job processes of this cluster (e.g. a job that ignored SIGTERM)
stepds="$(printf '%s\n%s\n%s\n' "$stepds" "$(our_stepds)" "$(our_job_procs)" | grep -E '^[0-9]+$' | sort -u || true)"
left=()
for p in $stepds; do running "$p" && left+=("$p"); done
if ((${#left[@]})); then
    log "stopping ${#left[@]} leftover job step process(es): ${left[*]}"
    # slurmstepd ignores SIGTERM: a short grace, then SIGKILL.
    GRACE=3 stop_pids "job steps" "${left[@]}"
fi
# cgroup mode: remove the (now empty) per-node cgroups, deepest first; a busy one is left alone.
if [[ "$(cat "$STATE_DIR/mode" 2>/dev/null || true)" == cgroup ]]; then
    for c in /sys/fs/cgroup/*/slurm_n1 /sys/fs/cgroup/*/slurm_n2; do
        [[ -d "$c" ]] || continue
        find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
fi
rm -f "$RUN"/*.pid "$STATE_DIR/munge/munge.socket" "$STATE_DIR/munge/munge.socket.lock"

# verify
still=()
for p in "${slurmd_pids[@]}" $ctld_pid $munge_pid "${left[@]}"; do running "$p" && still+=("$p"); done
if ((${#still[@]})); then
    log "ERROR: still running: ${still[*]}"
    exit 1
fi
log "cluster down in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
