#!/usr/bin/env bash
# `make test`: every test, in three parts that always all run.
#   1. the pure unit tests on TEST_WORKERS processes (pytest-xdist): they keep every core busy by themselves;
#   2. the Slurm tests (marker `slurm`: tests/slurm, the README walk, the Slurm faults), in the background
#      beside part 3: much of their time is jobs waiting on the scheduler, and they share one local cluster,
#      so they stay in one pytest process;
#   3. the others: the integration and model-family runs on TEST_WORKERS processes, a file to a process (a
#      file's module fixtures run its reference grids once); they compare losses and bytes, never times, so
#      a loaded host slows them but does not change them. Then the fault tests one at a time: they time how
#      ranks die, stall and get cleaned up, and stay off a host their own peers load.
# Part 2's output is printed once it ends (the two would interleave). Ctrl-C stops both. The two long parts list
# their ten slowest tests (--durations), where the suite's time goes.
# Env: PY (the venv's python), TEST_WORKERS (processes for the unit tests and for the multi-process runs).
set -u
PY=${PY:-.venv/bin/python}
TEST_WORKERS=${TEST_WORKERS:-2}

"$PY" -m pytest -q -n "$TEST_WORKERS" tests/unit; unit=$?
[ "$unit" -eq 2 ] && exit 130  # pytest's "interrupted" (Ctrl-C): start nothing more

# Job control: the Slurm part gets its own process group and keeps the default SIGINT (a background job of a
# script without it ignores SIGINT, and pytest would then not stop on the interrupt forwarded below).
set -m
slurm_log=$(mktemp -t harness-slurm-tests.XXXXXX)
"$PY" -m pytest -q -m slurm --ignore=tests/unit --durations=10 >"$slurm_log" 2>&1 &
slurm_pid=$!
set +m
stop_slurm_part() {
  kill -INT -- "-$slurm_pid" 2>/dev/null && wait "$slurm_pid" 2>/dev/null
  cat "$slurm_log"; rm -f "$slurm_log"
  exit 130
}
trap stop_slurm_part INT TERM
echo "[test] the Slurm tests run beside the others; their output follows at the end ($slurm_log)"

"$PY" -m pytest -q -n "$TEST_WORKERS" --dist loadfile -m "not slurm" --ignore=tests/unit --ignore=tests/faults \
  --durations=10
runs=$?
"$PY" -m pytest -q -m "not slurm" tests/faults; faults=$?
rest=$(( runs > faults ? runs : faults ))
echo "[test] waiting for the Slurm tests"
wait "$slurm_pid"; slurm=$?
trap - INT TERM
echo "[test] the Slurm tests:"
cat "$slurm_log"; rm -f "$slurm_log"
echo "[test] unit tests exit $unit, Slurm tests exit $slurm, the others exit $rest"
[ "$unit" -eq 0 ] && [ "$slurm" -eq 0 ] && [ "$rest" -eq 0 ]
