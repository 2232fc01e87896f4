#!/usr/bin/env bash
# Installs what is missing, builds, and runs every C++ (ctest) and Python (pytest) test.
# The README's second command; .ci/run calls it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
tools/setup.sh

# Tests talk over loopback only (the two-host test makes its own namespaces).
export UCX_NET_DEVICES=lo

echo "== C++ tests (ctest)"
# One test at a time: the transport tests busy-poll and check time bounds (2 cores here).
ctest --test-dir build --output-on-failure --timeout 300

echo "== Python tests (pytest)"
.venv/bin/python -m pytest -q tests/python
