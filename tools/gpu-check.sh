#!/usr/bin/env bash
# Builds Genie with CUDA (GENIE_WITH_CUDA=ON, build-gpu/), runs the GPU tests
# (tests/python/test_gpu.py) and the GPU benchmarks (perf/bench_gpu.py), which write
# docs/perf/gpu.md and docs/perf/gpu.json, followed by the tests' outcome.
#
#   tools/gpu-check.sh --pack      # here, before going to a GPU machine: writes .gpu-kit/
#   tools/gpu-check.sh [--quick]   # on a machine with a GPU
#   tools/gpu-check.sh --no-gpu    # anywhere (CI): every step that needs no GPU
#
# A GPU machine may have no network and no Debian dev packages: --pack puts what the build
# needs into .gpu-kit/ (ignored by git; carry it there): the files of the Debian packages
# listed in KIT_PACKAGES (headers, CMake configs, libraries, flatc, pkgconf) under
# .gpu-kit/usr, and PyPI's libucx-cu13 wheel for the GPU machine's Python (GENIE_GPU_PYTHON_VERSION,
# default 3.12). Where .gpu-kit/ exists this script builds against it; the machine's own
# torch (python3's, or GENIE_PYTHON) is the one linked. Models are built from their configs:
# nothing is downloaded.
#
# Options: --out DIR copies gpu.md, gpu.json and the logs there too (a lent GPU machine
# returns files from $OUT); --quick: the benchmarks' short sizes; --parts LIST: bench_gpu.py's
# parts (default all: upload,ucx_perftest,decode,models,compile); --tests EXPR: only the GPU
# tests pytest's -k EXPR selects ("compiled", say: a short device loan). GENIE_PYTHON: the
# Python with torch (default: .venv/bin/python if present, else python3).
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then  # the comment above, nothing run
  sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

MODE=gpu OUT_DIR="" QUICK="" PARTS=() TESTS=()
while (($#)); do
  case "$1" in
    --pack) MODE=pack ;;
    --no-gpu) MODE=no-gpu ;;
    --quick) QUICK=--quick ;;
    --out) OUT_DIR="$2"; shift ;;
    --parts) PARTS=(--parts "$2"); shift ;;
    --tests) TESTS=(-k "$2"); shift ;;
    *) echo "gpu-check: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done

KIT="$ROOT/.gpu-kit"
# What the build needs from Debian besides a compiler, CMake and ninja (tools/setup.sh's
# PACKAGES, less the tests', benchmarks', fuzzers' and libcurl's).
KIT_PACKAGES=(flatbuffers-compiler flatbuffers-compiler-dev libflatbuffers-dev libflatbuffers2 libspdlog-dev libspdlog1.10
  libfmt-dev libfmt9 libcli11-dev nlohmann-json3-dev libsodium-dev libsodium23 libxxhash-dev libxxhash0
  pkgconf pkgconf-bin libpkgconf3)

if [ "$MODE" = pack ]; then
  rm -rf "$KIT" && mkdir -p "$KIT/wheels"
  for package in "${KIT_PACKAGES[@]}"; do
    dpkg-query -L "$package" | while read -r path; do
      if [ -f "$path" ] || [ -L "$path" ]; then
        case "$path" in /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/*) continue ;; esac
        mkdir -p "$KIT$(dirname "$path")" && cp -a "$path" "$KIT$path"
      fi
    done
  done
  # .pc files name /usr: make them relative to where they lie.
  sed -i 's|^prefix=/usr$|prefix=${pcfiledir}/../../..|' "$KIT"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
  version="${GENIE_GPU_PYTHON_VERSION:-3.12}"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$KIT/wheels" "libucx-cu13>=1.22"
  du -sh "$KIT"
  exit 0
fi

PYTHON="${GENIE_PYTHON:-}"
if [ -z "$PYTHON" ]; then
  if [ -x .venv/bin/python ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON="$(command -v python3)"; fi
fi
LOGS="$ROOT/build-gpu/logs"
mkdir -p "$LOGS"
step() { echo "== gpu-check: $*"; }
copy_out() {  # on every exit, a failed build's too
  if [ -n "$OUT_DIR" ]; then
    mkdir -p "$OUT_DIR"
    if [ "$MODE" = gpu ]; then cp -f docs/perf/gpu.md docs/perf/gpu.json "$OUT_DIR"/ 2>/dev/null || true; fi
    cp -f "$LOGS"/*.log "$OUT_DIR"/ 2>/dev/null || true
  fi
  return 0
}
trap copy_out EXIT
CMAKE_ARGS=()
if [ -d "$KIT" ]; then
  step "using $KIT (Debian packages' files, libucx wheel)"
  export PATH="$KIT/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$KIT/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LIBRARY_PATH="$KIT/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"  # -lxxhash
  export CPATH="$KIT/usr/include${CPATH:+:$CPATH}"
  export PKG_CONFIG_PATH="$KIT/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  SITE=/tmp/genie-gpu-site
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$KIT"/wheels/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  CMAKE_ARGS+=(-DCMAKE_PREFIX_PATH="$KIT/usr" -DPKG_CONFIG_EXECUTABLE="$KIT/usr/bin/pkgconf")
fi
if "$PYTHON" -c 'import sys, libucx' 2>/dev/null; then :; else
  echo "gpu-check: $PYTHON has no libucx (pip install libucx-cu13, or tools/gpu-check.sh --pack and carry .gpu-kit)" >&2
  exit 1
fi
# A kit is for a machine without Debian's dev packages: no libcurl there, so no etcd membership.
WITH_ETCD=ON
[ -d "$KIT" ] && WITH_ETCD=OFF

step "configure build-gpu (GENIE_WITH_CUDA=ON, GENIE_WITH_ETCD=$WITH_ETCD, Python $PYTHON)"
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1  # shares objects with build/ and build-python/
if [ ! -f build-gpu/build.ninja ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGENIE_WITH_CUDA=ON -DGENIE_BUILD_PYTHON=ON \
    -DGENIE_BUILD_TESTS=OFF -DGENIE_BUILD_BENCHMARKS=OFF -DGENIE_BUILD_FUZZERS=OFF -DGENIE_WITH_ETCD="$WITH_ETCD" \
    -DGENIE_PYTHON="$PYTHON" -DPython_EXECUTABLE="$PYTHON" "${CMAKE_ARGS[@]}" >"$LOGS/configure.log" 2>&1 ||
    { cat "$LOGS/configure.log"; exit 1; }
fi
step "build genie-node, genie-bench and genie._C with CUDA"
if ! cmake --build build-gpu -j "$(nproc)" --target genie-node genie-bench genie_python >"$LOGS/build.log" 2>&1; then
  grep -E -B2 -A8 "error|FAILED" "$LOGS/build.log" | tail -60
  exit 1
fi

# The package as it would be installed: python/genie with _C and bin/genie-node beside it.
rm -rf build-gpu/site && mkdir -p build-gpu/site
cp -r python/genie build-gpu/site/genie
cp build-gpu/python/genie/_C*.so build-gpu/site/genie/
mkdir -p build-gpu/site/genie/bin && cp build-gpu/bin/genie-node build-gpu/site/genie/bin/
export PYTHONPATH="$ROOT/build-gpu/site${PYTHONPATH:+:$PYTHONPATH}"
export GENIE_BUILD_DIR="$ROOT/build-gpu" GENIE_NODE_BIN="$ROOT/build-gpu/bin/genie-node"
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
"$PYTHON" -c 'import genie._C, torch; print("genie._C", genie._C.__file__, "torch", torch.__version__, "cuda", torch.cuda.is_available())'
build-gpu/bin/genie-node --help >/dev/null

status=0
step "GPU tests (tests/python/test_gpu.py)"
"$PYTHON" -m pytest -q -p no:cacheprovider -rs "${TESTS[@]}" tests/python/test_gpu.py 2>&1 | tee "$LOGS/test_gpu.log" || status=1

if [ "$MODE" = no-gpu ]; then
  step "no GPU: the build and the tests' collection ran; benchmarks skipped"
  exit "$status"
fi

step "GPU benchmarks (perf/bench_gpu.py $QUICK)"
PYTHONUNBUFFERED=1 "$PYTHON" perf/bench_gpu.py $QUICK "${PARTS[@]}" 2>&1 | tee "$LOGS/bench_gpu.log" || status=1
if [ -f docs/perf/gpu.md ]; then
  {
    echo
    echo "## GPU tests"
    echo
    echo "\`tools/gpu-check.sh\`: \`pytest tests/python/test_gpu.py\` on the same machine, same run:"
    echo
    echo '```'
    grep -E "passed|failed|error|skipped|PASSED|FAILED|SKIPPED" "$LOGS/test_gpu.log" | tail -20
    echo '```'
  } >>docs/perf/gpu.md
fi
exit "$status"
