#!/usr/bin/env bash
# Start a real, local two-node Slurm cluster on this host (Debian's Slurm 22.05 packages).
#
#   munged (own key and socket) + slurmctld + two slurmd ("slurmd -N n1", "slurmd -N n2") as two
#   virtual nodes on 127.0.0.1, each with fake GPUs as gres. Everything lives in one state directory;
#   nothing under /etc is written: every Slurm command and daemon is pointed at the config with
#   SLURM_CONF.
#
# Usage:   slurm/local/up.sh            then   export SLURM_CONF=<printed path>
#          slurm/local/down.sh
# Env:     SLURM_LOCAL_DIR       state directory            (default /tmp/harness-slurm)
#          SLURM_LOCAL_PORT      slurmctld port; slurmd use +1 and +2   (default 16817)
#          SLURM_LOCAL_CPUS      CPUs declared per node     (default 4)
#          SLURM_LOCAL_MEM_MB    memory declared per node   (default 8192)
#          SLURM_LOCAL_DEF_MEM_PER_CPU  MB per allocated CPU by default (default 2048)
#          SLURM_LOCAL_GPUS      fake GPUs per node         (default 2)
#          SLURM_LOCAL_TIMEOUT   seconds to wait for idle nodes (default 60)
#          SLURM_LOCAL_CGROUP    0 (default): proctrack/linuxproc + task/none, memory enforced by RSS
#                                polling (OOM ends FAILED 0:9); 1: cgroup v1 (proctrack/task cgroup,
#                                OOM ends OUT_OF_MEMORY); auto: 1 if the cgroup v1 tree is writable
#          SLURM_LOCAL_CLEAN=1   wipe saved controller state / job history first
#          SLURM_LOCAL_NO_INSTALL=1  never run apt-get (fail with exit 3 if Slurm is missing)
# Exit codes: 0 up; 3 Slurm/munge not installed and not installable; 1 anything else.
# Idempotent: daemons already running from this state directory are left alone.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE_DIR="${SLURM_LOCAL_DIR:-/tmp/harness-slurm}"
CTLD_PORT="${SLURM_LOCAL_PORT:-16817}"
CPUS="${SLURM_LOCAL_CPUS:-4}"
MEM_MB="${SLURM_LOCAL_MEM_MB:-8192}"
DEF_MEM_PER_CPU="${SLURM_LOCAL_DEF_MEM_PER_CPU:-2048}"
GPUS="${SLURM_LOCAL_GPUS:-2}"
TIMEOUT="${SLURM_LOCAL_TIMEOUT:-60}"
CGROUP="${SLURM_LOCAL_CGROUP:-0}"
NODES=(n1 n2)
PACKAGES=(slurmctld slurmd slurm-client munge)
BINARIES=(slurmctld slurmd slurmstepd sinfo munged mungekey)

t0=$(date +%s.%N)
log() { printf '[slurm-up] %s\n' "$*" >&2; }
die() { log "ERROR: $1"; exit "${2:-1}"; }  # die MESSAGE [EXIT_CODE]

if [[ "$(id -u)" != 0 ]]; then
    die "must run as root (slurmd/slurmstepd need it; this cluster runs jobs as root)" 3
fi
[[ "$GPUS" =~ ^[1-9][0-9]*$ ]] || die "SLURM_LOCAL_GPUS must be >= 1 (got '$GPUS')"
STATE_DIR="$(mkdir -p "$STATE_DIR" && cd "$STATE_DIR" && pwd)"

# ---------------------------------------------------------------- packages
missing_binaries() {
    local b out=()
    for b in "${BINARIES[@]}"; do
        command -v "$b" >/dev/null 2>&1 || [[ -x "/usr/sbin/$b" ]] || out+=("$b")
    done
    echo "${out[*]:-}"
}
export PATH="$PATH:/usr/sbin:/sbin"
if [[ -n "$(missing_binaries)" ]]; then
    [[ "${SLURM_LOCAL_NO_INSTALL:-0}" == 1 ]] && die "missing: $(missing_binaries) (SLURM_LOCAL_NO_INSTALL=1)" 3
    command -v apt-get >/dev/null 2>&1 || die "missing: $(missing_binaries), and no apt-get to install ${PACKAGES[*]}" 3
    log "installing ${PACKAGES[*]} (apt-get)"
    ti=$(date +%s.%N)
    export DEBIAN_FRONTEND=noninteractive
    # policy-rc.d/no systemd: the packages' own services are not started (we start our own daemons).
    if ! apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends "${PACKAGES[@]}" >"$STATE_DIR/apt.log" 2>&1; then
        log "apt-get install failed; trying apt-get update first"
        { apt-get -o DPkg::Lock::Timeout=300 update && apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends "${PACKAGES[@]}"; } \
            >>"$STATE_DIR/apt.log" 2>&1 \
            || { tail -n 20 "$STATE_DIR/apt.log" >&2; die "could not install ${PACKAGES[*]}" 3; }
    fi
    log "installed in $(awk -v a="$ti" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
    [[ -z "$(missing_binaries)" ]] || die "still missing after install: $(missing_binaries)" 3
fi

# ---------------------------------------------------------------- directories, keys, devices
umask 022
mkdir -p "$STATE_DIR"/{ctld,run,log,munge,spool/n1,spool/n2,dev/n1,dev/n2}
# munged refuses sockets in group/world-writable dirs, and clients (any user) must reach the socket.
chmod 755 "$STATE_DIR" "$STATE_DIR/munge"
chmod 700 "$STATE_DIR/ctld"
MUNGE_SOCKET="$STATE_DIR/munge/munge.socket"
MUNGE_KEY="$STATE_DIR/munge/munge.key"
if [[ ! -s "$MUNGE_KEY" ]]; then
    mungekey --create --keyfile="$MUNGE_KEY" >/dev/null
fi
chmod 600 "$MUNGE_KEY"
for n in "${NODES[@]}"; do
    for ((i = 0; i < GPUS; i++)); do
        dev="$STATE_DIR/dev/$n/nvidia$i"
        [[ -c "$dev" ]] || { rm -f "$dev"; mknod "$dev" c 1 3; chmod 666 "$dev"; }
    done
done

# ---------------------------------------------------------------- configs
cgroup_v1_writable() {
    local c d
    for c in memory freezer cpuacct; do
        [[ -d "/sys/fs/cgroup/$c" ]] || return 1
        d="/sys/fs/cgroup/$c/harness_probe_$$"
        mkdir "$d" 2>/dev/null || return 1
        rmdir "$d" 2>/dev/null || true
    done
}
case "$CGROUP" in
    0|no|false) MODE=linuxproc ;;
    1|yes|true) cgroup_v1_writable || die "SLURM_LOCAL_CGROUP=1 but cgroup v1 (memory, freezer, cpuacct) is not writable"
                MODE=cgroup ;;
    auto)       if cgroup_v1_writable; then MODE=cgroup; else MODE=linuxproc; fi ;;
    *)          die "SLURM_LOCAL_CGROUP must be 0, 1 or auto (got '$CGROUP')" ;;
esac
render() {  # render TEMPLATE OUT
    sed -e "s|@STATE_DIR@|$STATE_DIR|g" \
        -e "s|@MUNGE_SOCKET@|$MUNGE_SOCKET|g" \
        -e "s|@CTLD_PORT@|$CTLD_PORT|g" \
        -e "s|@N1_PORT@|$((CTLD_PORT + 1))|g" \
        -e "s|@N2_PORT@|$((CTLD_PORT + 2))|g" \
        -e "s|@CPUS@|$CPUS|g" \
        -e "s|@MEM_MB@|$MEM_MB|g" \
        -e "s|@DEF_MEM_PER_CPU@|$DEF_MEM_PER_CPU|g" \
        -e "s|@GPUS@|$GPUS|g" \
        -e "s|@GPU_MAX@|$((GPUS - 1))|g" \
        "$1" >"$2.new"
    if grep -q '@[A-Z_0-9]*@' "$2.new"; then die "unfilled placeholder in $2: $(grep -o '@[A-Z_0-9]*@' "$2.new" | head -1)"; fi
}
any_daemon_alive() {
    local f
    for f in "$STATE_DIR"/run/{slurmctld,slurmd-n1,slurmd-n2}.pid; do
        [[ -s "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null && return 0
    done
    return 1
}
if [[ "${SLURM_LOCAL_CLEAN:-0}" == 1 ]]; then
    if [[ -s "$STATE_DIR/run/slurmctld.pid" ]] && kill -0 "$(cat "$STATE_DIR/run/slurmctld.pid")" 2>/dev/null; then
        die "SLURM_LOCAL_CLEAN=1 but the cluster is running; run down.sh first"
    fi
    log "clean start: removing saved controller state and job history"
    rm -rf "${STATE_DIR:?}/ctld/"* "$STATE_DIR/spool/n1/"* "$STATE_DIR/spool/n2/"* "$STATE_DIR/jobcomp.txt"
fi
render "$HERE/slurm.conf.in" "$STATE_DIR/slurm.conf"
render "$HERE/gres.conf.in" "$STATE_DIR/gres.conf"
render "$HERE/cgroup.conf.in" "$STATE_DIR/cgroup.conf"
render "$HERE/tracking-$MODE.conf.in" "$STATE_DIR/tracking.conf"
changed=()
for f in slurm.conf gres.conf cgroup.conf tracking.conf; do
    cmp -s "$STATE_DIR/$f.new" "$STATE_DIR/$f" || changed+=("$f")
done
if ((${#changed[@]})) && any_daemon_alive; then
    rm -f "$STATE_DIR"/*.new
    die "the cluster in $STATE_DIR is running with a different configuration (${changed[*]}); run slurm/local/down.sh first"
fi
for f in slurm.conf gres.conf cgroup.conf tracking.conf; do mv -f "$STATE_DIR/$f.new" "$STATE_DIR/$f"; done
echo "$MODE" >"$STATE_DIR/mode"
: >"$STATE_DIR/plugstack.conf"   # keep /etc/slurm/plugstack.conf (SPANK plugins) out of this cluster
export SLURM_CONF="$STATE_DIR/slurm.conf"
# Do not let an outer job's environment (e.g. running inside an allocation) leak into the daemons.
unset SLURM_JOB_ID SLURM_JOBID SLURM_NODELIST SLURM_JOB_NODELIST SLURM_STEP_ID 2>/dev/null || true

# ---------------------------------------------------------------- daemons
alive() {  # alive PIDFILE NAME -> pid alive and is NAME
    local pid
    [[ -s "$1" ]] || return 1
    pid="$(cat "$1")"
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    grep -q "$2" "/proc/$pid/cmdline" 2>/dev/null
}
wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
    local secs="$1" what="$2"; shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < end)) || return 1
        sleep 0.2
    done
}
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
tails() {
    local f
    for f in "$STATE_DIR"/log/*.log; do
        [[ -f "$f" ]] || continue
        printf '\n===== tail %s =====\n' "$f" >&2
        tail -n 25 "$f" >&2
    done
}
fail() {
    log "ERROR: $*"
    tails
    log "ERROR: $* (logs above; state directory $STATE_DIR; stop what started with slurm/local/down.sh)"
    exit 1
}

# munged: own key, socket, pid, seed and log in the state directory.
if alive "$STATE_DIR/run/munged.pid" munged; then
    log "munged already running (pid $(cat "$STATE_DIR/run/munged.pid"))"
else
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_KEY" \
        --pid-file="$STATE_DIR/run/munged.pid" --seed-file="$STATE_DIR/munge/munged.seed" \
        --log-file="$STATE_DIR/log/munged.log" </dev/null >>"$STATE_DIR/log/munged.log" 2>&1 \
        || fail "munged did not start"
    wait_for 10 munge test -S "$MUNGE_SOCKET" || fail "munged socket $MUNGE_SOCKET did not appear"
    chmod 755 "$STATE_DIR/munge"
fi
munge --socket="$MUNGE_SOCKET" -n </dev/null | unmunge --socket="$MUNGE_SOCKET" >/dev/null 2>&1 \
    || fail "munge credential round trip failed"

started_ctld=0
if alive "$STATE_DIR/run/slurmctld.pid" slurmctld; then
    log "slurmctld already running (pid $(cat "$STATE_DIR/run/slurmctld.pid"))"
else
    port_free "$CTLD_PORT" || fail "port $CTLD_PORT is taken by something else (set SLURM_LOCAL_PORT)"
    # -i: ignore unreadable saved state instead of refusing to start.
    started_ctld=1
    slurmctld -i -f "$SLURM_CONF" </dev/null >>"$STATE_DIR/log/slurmctld.log" 2>&1 \
        || fail "slurmctld did not start"
fi
wait_for 20 slurmctld scontrol ping || fail "slurmctld does not answer 'scontrol ping'"

port=$CTLD_PORT
for n in "${NODES[@]}"; do
    port=$((port + 1))
    if alive "$STATE_DIR/run/slurmd-$n.pid" slurmd; then
        log "slurmd $n already running (pid $(cat "$STATE_DIR/run/slurmd-$n.pid"))"
    else
        port_free "$port" || fail "port $port (slurmd $n) is taken by something else (set SLURM_LOCAL_PORT)"
        slurmd -N "$n" -f "$SLURM_CONF" </dev/null >>"$STATE_DIR/log/slurmd-$n.log" 2>&1 \
            || fail "slurmd -N $n did not start"
    fi
done

# ---------------------------------------------------------------- wait for two idle nodes
# Up = both nodes registered and responding: idle on a fresh start; mix/alloc/comp if up.sh is re-run
# while jobs are running. Not down/drain/inval/unk, and no "*" (not responding) suffix.
both_idle() {
    local out
    out="$(sinfo -h -N -p debug -o '%N %t' 2>/dev/null)" || return 1
    [[ "$(grep -cE '^n[12] (idle|mix|alloc|comp)$' <<<"$out")" == 2 ]]
}
both_really_idle() { [[ "$(sinfo -h -N -p debug -o '%N %t' 2>/dev/null | grep -cE '^n[12] idle$')" == 2 ]]; }
if ! wait_for "$TIMEOUT" nodes both_idle; then
    # A node left DOWN by an earlier, unclean stop may need a nudge (ReturnToService=2 usually does it).
    scontrol update nodename=n[1-2] state=resume >/dev/null 2>&1 || true
    wait_for 10 nodes both_idle || {
        sinfo -N -o '%N %t %E' >&2 || true
        fail "nodes n1, n2 not idle after ${TIMEOUT}s"
    }
fi

# After an unclean stop (slurmctld died before down.sh could cancel jobs), slurmctld recovers jobs as
# RUNNING whose processes down.sh has killed; Slurm would hold them (and their CPUs) for a long time.
# If no slurmstepd of this cluster is alive, cancel those jobs so the cluster starts idle.
our_stepds_alive() {
    local d
    for d in /proc/[0-9]*; do
        [[ "$(cat "$d/comm" 2>/dev/null)" == slurmstepd ]] || continue
        tr '\0' '\n' 2>/dev/null <"$d/environ" | grep -qx "SLURM_CONF=$SLURM_CONF" && return 0
    done
    return 1
}
if ((started_ctld)); then
    stale="$(squeue -h -t RUNNING,COMPLETING,CONFIGURING,SUSPENDED -o '%A' 2>/dev/null | sort -u | tr '\n' ' ')"
    if [[ -n "${stale// /}" ]] && ! our_stepds_alive; then
        log "cancelling job(s) ${stale% } recovered as running although their processes are gone (unclean stop)"
        # shellcheck disable=SC2086
        scancel $stale >/dev/null 2>&1 || true
        wait_for 30 nodes both_really_idle || fail "nodes not idle after cancelling stale jobs"
    fi
fi

t1=$(date +%s.%N)
log "cluster up in $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s (mode: $MODE)"
sinfo -N -o '%N %P %t %c %m %G' >&2
echo "export SLURM_CONF=$SLURM_CONF"
