# Runs a libFuzzer binary for a bounded time on a fresh copy of a seed corpus; fails when the
# fuzzer exits non-zero (a crash, leak, timeout or sanitizer report), keeping the reproducer.
#   cmake -DFUZZER=<binary> -DSEEDS=<dir> -DWORK=<dir> [-DSECONDS=20] -P run_fuzzer.cmake
foreach(var FUZZER SEEDS WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_fuzzer.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT DEFINED SECONDS)
  set(SECONDS 20)
endif()

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/corpus ${WORK}/artifacts)
file(GLOB seeds ${SEEDS}/*.seed)
if(NOT seeds)
  message(FATAL_ERROR "no seeds in ${SEEDS}: build the fuzz_wire_decoder target first")
endif()
file(COPY ${seeds} DESTINATION ${WORK}/corpus)

execute_process(
  COMMAND ${FUZZER} -max_total_time=${SECONDS} -rss_limit_mb=2048 -timeout=10
          -print_final_stats=1 -artifact_prefix=${WORK}/artifacts/ ${WORK}/corpus
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(GLOB found ${WORK}/artifacts/*)
  message(FATAL_ERROR "${FUZZER} failed (exit ${rc}); reproducer: ${found}\n"
                      "Replay with: ${FUZZER} <reproducer>")
endif()
