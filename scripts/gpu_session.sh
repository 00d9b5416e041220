#!/usr/bin/env bash
# One device call's worth of GPU checks, for a lent GPU machine with a few minutes of time: runs
# the kit's steps (scripts/gpu_kit.sh builds .gpu-kit here; the device call carries it) in order
# of value under one deadline, skips a step that would not fit in what is left, and packs every
# log into $OUT/logs.tar.gz after each step (the device tool returns a few files only, and a call
# killed at its limit returns what $OUT holds). Prints the kit's status lines last.
#
#   device: carry [".gpu-kit"], command: scripts/gpu_session.sh [STEP...]
# STEPs (default: tests bench trainer memcheck synccheck initcheck): those of .gpu-kit/run.sh.
# DEADLINE_S (default 500): seconds the whole script may take; TIMEOUT_S (default 150): the
# limit of each process inside a step.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS
deadline=${DEADLINE_S:-500}
export TIMEOUT_S=${TIMEOUT_S:-150}
out=${OUT:-$PWD/out}
logs=${TMPDIR:-/tmp}/embcache-session
rm -rf "$logs" && mkdir -p "$logs" "$out"
# compute-sanitizer may sit outside PATH (the toolkit's bin, or Nsight Compute's folder).
if ! command -v compute-sanitizer >/dev/null; then
  found=$(find /usr/local/cuda*/bin /usr/local/cuda*/compute-sanitizer /opt -maxdepth 3 \
    -name compute-sanitizer -type f 2>/dev/null | head -1)
  [[ -n $found ]] && export PATH=$PATH:$(dirname "$found")
fi
steps=("$@")
((${#steps[@]})) || steps=(tests bench trainer memcheck synccheck initcheck)
# What a step needs at most, in seconds, from its number of processes and their limit.
need() {
  case $1 in
    tests | memcheck | synccheck | initcheck | scale) echo $((TIMEOUT_S * 2)) ;;
    *) echo "$TIMEOUT_S" ;;
  esac
}
worst=0
for step in "${steps[@]}"; do
  left=$((deadline - (SECONDS - start)))
  if (($(need "$step") > left)); then
    echo "embcache-session: $step skipped: ${left}s left" | tee -a "$logs/session.txt"
    continue
  fi
  mkdir -p "$logs/$step"
  t0=$SECONDS
  SANITIZER_FLAGS=${SANITIZER_FLAGS:---print-limit 2000} OUT=$logs/$step .gpu-kit/run.sh "$step" \
    >"$logs/$step/run.txt" 2>&1
  rc=$?
  if [[ $step == memcheck || $step == synccheck || $step == initcheck ]]; then
    # Where the reports come from: the two innermost embcache frames of each, counted.
    echo "embcache-session: $step reports by their two innermost embcache frames:"
    cat "$logs/$step"/cuda_tests_*.log | awk '
      /^=+ +[A-Z]/ && !/Frame:|Saved host|ERROR SUMMARY/ {want = 2; line = ""}
      want && /Frame:.*embcache/ {
        f = $0; sub(/ \[0x[0-9a-f]+\].*/, "", f); sub(/^.*Frame: */, "", f); sub(/\(.*/, "", f)
        line = line (line == "" ? "" : " <- ") f
        if (--want == 0) print line
      }' |
      sort | uniq -c | sort -rn | head -15
  fi
  ((rc > worst)) && worst=$rc
  echo "embcache-session: $step exit status $rc in $((SECONDS - t0))s" | tee -a "$logs/session.txt"
  tar -C "$logs" -czf "$out/logs.tar.gz" . 2>/dev/null
done
cat "$logs"/*/status.txt 2>/dev/null
tar -C "$logs" -czf "$out/logs.tar.gz" . 2>/dev/null
echo "embcache-session: exit status $worst after $((SECONDS - start))s"
exit "$worst"
