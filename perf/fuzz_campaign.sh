#!/usr/bin/env bash
# A timed libFuzzer campaign on the wire decoder (build/bin/fuzz_wire_decoder, ASan + UBSan), on
# every core, on a fresh copy of its seed corpus in a temporary directory. Prints the total
# number of executions, executions per second and crashes, each counted once.
#
#   perf/fuzz_campaign.sh [--seconds 300] [--workers N] [--mode jobs|fork] [--max-len N]
#                         [--fuzzer PATH] [--seeds DIR] [--keep]
#
# --mode jobs (default): N independent fuzzer processes (-jobs=N -workers=N) sharing one corpus
#   directory (each reloads what the others add); each prints its own final stats
#   (stat::number_of_executed_units) and the total is their sum.
# --mode fork: libFuzzer's -fork=N; the parent restarts short child runs and merges their
#   corpora; the total is the parent's last "#N: cov:" count (the children's runs, summed once).
# The corpus and the logs go to a temporary directory in /dev/shm (else $TMPDIR or /tmp; or
# $FUZZ_TMPDIR), removed at the end unless --keep or a crash.
# Exit status: 0 when the campaign ran with no crash, 1 on a crash (reproducers are kept and
# named), 2 on a usage or setup error.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
seconds=300
workers=$(nproc)
mode=jobs
max_len=""
fuzzer=$repo/build/bin/fuzz_wire_decoder
seeds=$repo/build/tests/fuzz/seed_corpus
keep=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --max-len) max_len=$2; shift 2 ;;
    --fuzzer) fuzzer=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done
[[ -x $fuzzer ]] || { echo "no fuzzer at $fuzzer: cmake --build build --target fuzz_wire_decoder" >&2; exit 2; }
compgen -G "$seeds/*.seed" >/dev/null || { echo "no seeds in $seeds" >&2; exit 2; }
[[ $mode == jobs || $mode == fork ]] || { echo "--mode is jobs or fork" >&2; exit 2; }

# The corpus lives in memory (/dev/shm) where it can: libFuzzer writes a file for every new unit,
# and creating files on a disk file system cost a tenth of the time early in a campaign.
tmp=${FUZZ_TMPDIR:-$( [[ -d /dev/shm && -w /dev/shm ]] && echo /dev/shm || echo "${TMPDIR:-/tmp}")}
work=$(mktemp -d "$tmp/genie-fuzz.XXXXXX")
cleanup() {
  if [[ $keep == 1 || -n $(ls -A "$work/artifacts" 2>/dev/null) ]]; then
    echo "kept: $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
mkdir -p "$work/corpus" "$work/artifacts"
cp "$seeds"/*.seed "$work/corpus/"

args=(-max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
      -artifact_prefix="$work/artifacts/")
[[ -n $max_len ]] && args+=(-max_len="$max_len")

echo "fuzz_campaign: $fuzzer, $mode x$workers, ${seconds} s, corpus $work/corpus ($(ls "$work/corpus" | wc -l) seeds)"
start=$(date +%s.%N)
set +e
if [[ $mode == jobs ]]; then
  # Each job writes fuzz-<n>.log into the current directory.
  (cd "$work" && "$fuzzer" -jobs="$workers" -workers="$workers" "${args[@]}" corpus) >"$work/parent.log" 2>&1
else
  (cd "$work" && "$fuzzer" -fork="$workers" "${args[@]}" corpus) >"$work/parent.log" 2>&1
fi
rc=$?
set -e
end=$(date +%s.%N)
elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }')

if [[ $mode == jobs ]]; then
  logs=("$work"/fuzz-*.log)
  execs=0
  for log in "${logs[@]}"; do
    n=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$log" | tail -1 || true)
    [[ -n $n ]] || { echo "no final stats in $log:"; tail -5 "$log"; n=0; }
    echo "  $(basename "$log"): $n executions ($(grep -oP 'stat::average_exec_per_sec:\s*\K[0-9]+' "$log" | tail -1 || echo ?) /s)"
    execs=$((execs + n))
  done
  logs+=("$work/parent.log")
else
  logs=("$work/parent.log")
  execs=$(grep -oP '^#\K[0-9]+(?=: cov:)' "$work/parent.log" | tail -1 || true)
  execs=${execs:-0}
fi

# A crash is a reproducer libFuzzer wrote (crash-, leak-, timeout-, oom-) or a sanitizer /
# libFuzzer error report in any log.
artifacts=$(find "$work/artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
reports=$(cat "${logs[@]}" | grep -cE '^==[0-9]+==ERROR: |runtime error: |deadly signal|ERROR: libFuzzer' || true)
crashes=$artifacts
if [[ $crashes -eq 0 && ( $reports -gt 0 || $rc -ne 0 ) ]]; then crashes=1; fi

rate=$(awk -v n="$execs" -v t="$elapsed" 'BEGIN { printf "%d", n / t }')
printf 'executions: %d\nseconds: %.1f\nexecutions/s: %d\ncrashes: %d (fuzzer exit %d, %d reproducer(s), %d error report line(s))\n' \
  "$execs" "$elapsed" "$rate" "$crashes" "$rc" "$artifacts" "$reports"
if [[ $crashes -ne 0 ]]; then
  find "$work/artifacts" -type f | sed 's/^/  reproducer: /'
  grep -hE -A20 '^==[0-9]+==ERROR: |runtime error: |deadly signal' "${logs[@]}" | head -60 || true
  exit 1
fi
