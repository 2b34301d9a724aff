#!/usr/bin/env bash
# Install Debian's libaio-dev, which DeepSpeed's async_io op (NVMe offload) is built against.
#
# Usage:   tools/install_libaio.sh
# Env:     HARNESS_NO_INSTALL=1   never run apt-get (exit 3 if libaio is missing)
# Exit codes: 0 installed (or already there); 3 missing and not installable; 1 apt-get failed.
set -euo pipefail

installed() { [ -e /usr/include/libaio.h ] && ldconfig -p 2>/dev/null | grep -q 'libaio\.so'; }

if installed; then
    exit 0
fi
if [ "${HARNESS_NO_INSTALL:-0}" = 1 ]; then
    echo "libaio-dev missing and HARNESS_NO_INSTALL=1: not installing" >&2
    exit 3
fi
command -v apt-get >/dev/null 2>&1 || { echo "libaio-dev missing and no apt-get to install it" >&2; exit 3; }
SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "libaio-dev missing; installing needs root (no sudo)" >&2; exit 3; }
    SUDO="sudo -n"
fi
echo "installing libaio-dev (apt-get)" >&2
if ! $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends libaio-dev >&2; then
    echo "apt-get install failed; trying apt-get update first" >&2
    $SUDO apt-get -o DPkg::Lock::Timeout=300 update >&2
    $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends libaio-dev >&2 || exit 1
fi
installed || { echo "libaio-dev installed but libaio.h / libaio.so not found" >&2; exit 1; }
