#!/usr/bin/env bash
# Installs what Genie needs and is missing (Debian packages, the project's virtual
# environment), then configures and builds into build/, and installs the Python package
# `genie` with its extension genie._C into .venv (editable; built in build-python/).
# Idempotent: fast when nothing changed.
#
#   tools/setup.sh            # install + build
#   GENIE_CMAKE_ARGS="-DGENIE_WITH_CUDA=ON" tools/setup.sh
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then  # the comment above, nothing run
  sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PACKAGES=(
  cmake ninja-build ccache pkg-config g++
  libucx-dev                                 # a site's UCX with verbs (GENIE_UCX=system; the ASan build)
  flatbuffers-compiler libflatbuffers-dev    # the wire schema
  libgtest-dev libgmock-dev libbenchmark-dev # tests and benchmarks
  libibverbs-dev librdmacm-dev               # RDMA fabrics (UCX's verbs transports)
  libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libxxhash-dev
  libsodium-dev                              # constant-time token comparison
  clang-14 libclang-rt-14-dev                # libFuzzer targets
  iproute2                                   # network namespaces for two-host tests
  libcurl4-openssl-dev etcd-server           # cluster membership: genie-node --etcd (docs/node.md)
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
# Reinstalled whenever a requirements file changes (a stamp holds their hash).
requirements_hash="$(cat python/requirements.txt python/requirements-test.txt | sha256sum | cut -d' ' -f1)"
if [ "$(cat .venv/.genie-requirements 2>/dev/null)" != "$requirements_hash" ]; then
  echo "setup: installing python/requirements*.txt into .venv (first time: torch is several GB, minutes)"
  # A fresh install takes ~6 GiB in .venv, plus pip's temporary files (and its cache when it
  # downloads): say so up front when the disk is short (pip only says "No space left on device").
  free_kib="$(df --output=avail -k . | tail -1 | tr -d ' ')"
  if [ -n "$free_kib" ] && [ "$free_kib" -lt $((10 * 1024 * 1024)) ]; then
    echo "setup: warning: $((free_kib / 1024 / 1024)) GiB free on the disk of $ROOT; a first install of" \
      "torch and its CUDA libraries needs about 10 GiB (6 in .venv, the rest pip's temporary files and cache)" >&2
  fi
  .venv/bin/pip install -q --disable-pip-version-check -r python/requirements.txt -r python/requirements-test.txt
  echo "$requirements_hash" > .venv/.genie-requirements
fi

# ccache: paths made relative to the repository and the build directory left out of the
# hash, so build/ and build-python/ (same depth, same flags) share objects.
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1

# Configure once, then build incrementally (ccache keeps rebuilds of a fresh clone fast).
if [ ! -f build/build.ninja ]; then
  # shellcheck disable=SC2086
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${GENIE_CMAKE_ARGS:-} >/dev/null
fi
cmake --build build -j "$(nproc)"

# The Python package: `pip install -e .` builds genie._C and genie-node in build-python/
# (scikit-build-core, pyproject.toml) and installs them into .venv; the Python sources stay in
# python/genie. pip takes ~20 s even when nothing changed (CMake configure, wheel), so it is
# skipped when the last install is newer than pyproject.toml and the build outputs, and ninja
# has nothing to do. CC/CXX as the main build's (scikit-build-core would pick Python's g++,
# and ccache hashes the compiler's name).
python_installed() {
  local stamp=build-python/.genie-installed platlib
  [ -f "$stamp" ] && [ -f build-python/build.ninja ] && [ pyproject.toml -ot "$stamp" ] || return 1
  for output in build-python/python/genie/_C*.so build-python/bin/genie-node; do
    [ -f "$output" ] && [ "$output" -ot "$stamp" ] || return 1
  done
  platlib="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')"
  compgen -G "$platlib/genie/_C*.so" >/dev/null || return 1
  ninja -C build-python -n genie_python genie-node 2>/dev/null | grep -q "no work to do"
}
if ! python_installed; then
  echo "setup: pip install -e . (genie._C in build-python/)"
  CC="${CC:-cc}" CXX="${CXX:-c++}" .venv/bin/pip install -q --disable-pip-version-check --no-build-isolation -e .
  touch build-python/.genie-installed
fi
