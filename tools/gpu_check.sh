#!/usr/bin/env bash
# Run the GPU check (harness/commands/gpu_check.py) with the machine's own Python and torch: no venv is made
# and nothing is fetched. Where torch sees no CUDA device it skips in one line. Otherwise the wheels of
# `make gpu-wheels` are installed offline into a folder that goes on PYTHONPATH: the launchers' entry
# scripts (torchrun, accelerate) run the image's Python, and their ranks inherit PYTHONPATH, where a venv
# would not be seen. Tracking is off; the summary is $OUT/summary.json.
#
# Usage:   tools/gpu_check.sh [gpu_check options, e.g. --only fsdp2 | --cpu | --dry-run]
# Env:     PY=python3  WHEELS=gpu-wheels  SITE=.gpu-site  OUT=results/gpu_check
set -euo pipefail

PY=${PY:-python3}
WHEELS=${WHEELS:-gpu-wheels}
SITE=${SITE:-.gpu-site}
OUT=${OUT:-results/gpu_check}
export PYTHONPATH="$PWD:$PWD/$SITE${PYTHONPATH:+:$PYTHONPATH}"
export WANDB_MODE=disabled HF_HUB_OFFLINE=1
# The launchers (torchrun, accelerate) where this Python's pip put them, whatever PATH the shell had.
PATH="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null || true):$HOME/.local/bin:$PATH"
export PATH

if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    if ! ls "$WHEELS"/*.whl > /dev/null 2>&1; then
        echo "gpu-check: no wheels in $WHEELS/: run 'make gpu-wheels' where the registries are reachable, and carry $WHEELS/" >&2
        exit 2
    fi
    if ! "$PY" -m pip --version > /dev/null 2>&1; then
        echo "gpu-check: $PY has no pip, so $WHEELS/ cannot be installed; give another Python with PY=..." >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "$WHEELS"/*.whl
fi
exec "$PY" -m harness.commands.gpu_check --out "$OUT" "$@"
