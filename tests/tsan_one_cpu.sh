#!/bin/bash
# Runs a test of preset `tsan` (its CMAKE_CROSSCOMPILING_EMULATOR) on one CPU. oneTBB then starts
# no worker threads, so every TBB loop runs on the thread that calls it: libtbb is not built with
# -fsanitize=thread, so ThreadSanitizer cannot see the hand-off of a task to a worker and would
# report each as a race. The threads under test (the caller, the prefetch worker, the write-behind
# flusher) still interleave on that CPU, and ThreadSanitizer finds races by happens-before, not by
# timing. Tests run side by side (ctest -j) take different CPUs: the first whose lock file is
# free, held until the test exits; when none is, the process id picks one.
cpus=()
for part in $(taskset -pc $$ | sed 's/.*: //; s/,/ /g'); do
  if [[ $part == *-* ]]; then
    for ((c = ${part%-*}; c <= ${part#*-}; ++c)); do cpus+=("$c"); done
  else
    cpus+=("$part")
  fi
done
cpu=${cpus[$(($$ % ${#cpus[@]}))]}
for c in "${cpus[@]}"; do
  exec 9>"${TMPDIR:-/tmp}/embcache-tsan-cpu$c.lock"
  if flock -n 9; then
    cpu=$c
    break
  fi
  exec 9>&-
done
exec taskset -c "$cpu" "$@"
