#!/usr/bin/env bash
# Installs what Genie needs and is missing (Debian packages, the project's virtual
# environment), then configures and builds into build/. Idempotent: fast when nothing changed.
#
#   tools/setup.sh            # install + build
#   GENIE_CMAKE_ARGS="-DGENIE_WITH_CUDA=ON" tools/setup.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PACKAGES=(
  cmake ninja-build ccache pkg-config g++
  libucx-dev ucx-utils                       # the data plane, and ucx_perftest to compare with
  flatbuffers-compiler libflatbuffers-dev    # the wire schema
  libgtest-dev libgmock-dev libbenchmark-dev # tests and benchmarks
  libibverbs-dev librdmacm-dev               # RDMA fabrics (UCX's verbs transports)
  libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libxxhash-dev
  clang-14 libclang-rt-14-dev                # libFuzzer targets
  iproute2                                   # network namespaces for two-host tests
)
missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The project's virtual environment: the one torch that both the C++ side (find_package
# through torch.utils.cmake_prefix_path) and, later, the Python frontend use. PyPI's torch is
# a CUDA build of several GB: pip's cache keeps reinstalls fast.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "setup: installing torch into .venv (first time: several GB, minutes)"
  .venv/bin/pip install -q --disable-pip-version-check -r python/requirements.txt
fi
if ! .venv/bin/python -c "import pytest" 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check -r python/requirements-test.txt
fi

# Configure once, then build incrementally (ccache keeps rebuilds of a fresh clone fast).
if [ ! -f build/build.ninja ]; then
  # shellcheck disable=SC2086
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${GENIE_CMAKE_ARGS:-} >/dev/null
fi
cmake --build build -j "$(nproc)"
