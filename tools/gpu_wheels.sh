#!/usr/bin/env bash
# Fetch the wheels `make gpu-check` installs offline on a GPU machine (no package registry there). Its image
# has Python 3.12, torch, accelerate, transformers, pandas, pyarrow, rich and jinja2; this adds what the check
# imports beyond them: Hydra and OmegaConf (composition), DeepSpeed and its dependencies.
#
# Usage:   tools/gpu_wheels.sh            (run here, where the registries are reachable)
# Env:     PY=.venv/bin/python   the pip that fetches (and builds the two sdist-only packages)
#          DEST=gpu-wheels       the folder (git-ignored; carried to the GPU machine with the tree)
#          GPU_PYTHON=3.12       the GPU machine's Python
# Versions: constraints.txt where it pins a package, else the version installed beside the harness here
# (the combination its tests run with). DeepSpeed and antlr4-python3-runtime publish no wheel (sdist only):
# they are built here with `pip wheel --no-deps`, DS_BUILD_OPS=0, so the wheel holds no compiled op and
# installs without compiling (ops stay JIT, and the check steps the offloaded state with torch's AdamW).
set -euo pipefail

PY=${PY:-.venv/bin/python}
DEST=${DEST:-gpu-wheels}
GPU_PYTHON=${GPU_PYTHON:-3.12}
ABI="cp${GPU_PYTHON/./}"
LIMIT_MIB=48  # what travels with the working tree is at most 64 MiB, the tree itself included
# On the image already (with their dependencies): tests/unit/commands/test_gpu_wheels.py checks that these and
# PACKAGES hold every dependency of PACKAGES.
IMAGE="torch accelerate transformers pandas pyarrow rich jinja2"
PACKAGES="hydra-core omegaconf antlr4-python3-runtime deepspeed hjson py-cpuinfo msgpack einops ninja
pydantic pydantic-core annotated-types typing-inspection typing-extensions"
SDIST_ONLY="antlr4-python3-runtime deepspeed"

version_of() {
    local pinned
    pinned=$(grep -i -E "^$1==" constraints.txt | head -1 | cut -d= -f3 || true)
    if [ -n "$pinned" ]; then echo "$pinned"; return; fi
    "$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1" 2>/dev/null || {
        echo "gpu-wheels: $1 is neither pinned in constraints.txt nor installed in $PY's environment" >&2; exit 2; }
}

mkdir -p "$DEST"
for name in $PACKAGES; do
    spec="$name==$(version_of "$name")"
    if [[ " $SDIST_ONLY " == *" $name "* ]]; then
        # --no-build-isolation: DeepSpeed's setup.py imports torch; the local one is enough to build no ops.
        DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "$spec"
    else
        "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PYTHON" --implementation cp \
            --abi "$ABI" --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
            -d "$DEST" "$spec"
    fi
    echo "gpu-wheels: $spec"
done
size_kib=$(du -sk "$DEST" | cut -f1)
echo "gpu-wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $((size_kib / 1024)) MiB in $DEST/"
if [ "$size_kib" -gt $((LIMIT_MIB * 1024)) ]; then
    echo "gpu-wheels: $DEST/ is over $LIMIT_MIB MiB: it would not travel with the tree (64 MiB in all)" >&2
    exit 1
fi
