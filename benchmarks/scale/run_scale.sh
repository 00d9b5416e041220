#!/usr/bin/env bash
# The scale benchmark: the training cache over a RocksDB table far larger than the process's
# memory, under a hard memory cap, beside the same passes over a table that fits in memory.
# Not in CI: it writes tens of GB and runs for many minutes. Run as root (the memory cgroup).
#
#   benchmarks/scale/run_scale.sh [options]
#     --bin DIR        the build's benchmark folder (default build/cpu/benchmarks/scale)
#     --dir DIR        where the tables go (default /var/tmp/embcache_scale); on the disk measured
#     --rows N         rows of the big table (default 16000000: about 12.5 GB at width 192)
#     --width N        floats per row (default 192: dim 64 with Adam's two moments)
#     --fraction F     distinct keys per pass as a fraction of the big table (default 0.05)
#     --passes N       keyset passes (default 4; the first fills the cache and is not averaged)
#     --cap-mib N      the memory cgroup's limit for the big runs (default 2560; bench_scale needs budget >= its plan)
#     --budget-mib N   the memory budget given to bench_scale (default: the cap less 256 MiB)
#     --train-rate R   keys/s at which the simulated training consumes a keyset (default 50000:
#                      embcache-train's ~25k samples/s here over passes of 1M samples whose
#                      keysets hold ~2M keys)
#     --fio-seconds N  seconds per fio run (default 20; 0 skips fio)
#     --trainer        also item 4: embcache-train with a RocksDB store under the cap against a
#                      host store (--tools DIR holds embcache-synth, default build/cpu/src/tools;
#                      --train-exe FILE is embcache-train, default build/cpu/src/trainer/...)
#     --train-samples N, --train-shard-samples N, --train-passes N, --train-dim N,
#     --train-cardinality F   the synthetic dataset and passes of --trainer (defaults 3000000,
#                      250000, 3, 64, 0.5: the 3-pass run of 4 shards of 250k samples)
#     --train-cap-mib N, --train-budget-mib N   the cap and memory_budget_bytes of the capped
#                      trainer run (defaults 1536 and, for rocksdb, 1280: the 1.5 GiB cap; for
#                      log 1472: the budget counts the log stores' indexes and buffers, about
#                      90 MiB a table here, and the write-behind's buffers grow with the budget)
#     --skip-passes    skip the bench_scale runs (the tables are still built)
#     --pass-stores LIST   the stores of the bench_scale runs over the big table: rocksdb, log or
#                      rocksdb,log (default rocksdb; log builds its own copy of the table)
#     --trainer-only   only item 4 (implies --trainer): no fio, no tables, no bench_scale runs
#     --train-staging-mib N, --train-write-back-mib N   staging_bytes and write_back_bytes of
#                      the RocksDB trainer run (defaults 192 and 0; 0: from its memory budget,
#                      whose quarter for the staging no longer fits 1280 MiB once the shard
#                      reader's two 66 MB shards are counted)
#     --train-store S  the store of the capped trainer run: rocksdb (default) or log (a
#                      log_store: segment files and an index in memory; docs/stores.md)
#     --train-block-bytes N   store_block_bytes of the RocksDB run's deep table (default 0:
#                      derived from the row, a 4 KiB page; its shards' keysets cover a tenth of
#                      it or more, read by scans, which larger blocks make cheaper: see
#                      docs/stores.md, "Block size")
#     --train-blas-threads N   blas_threads of both trainer runs (default 0: OpenBLAS's own
#                      setting, a thread per core; 1 leaves the other cores to the background work)
#     --openblas-thread-timeout N   OPENBLAS_THREAD_TIMEOUT of both trainer runs: OpenBLAS's idle
#                      threads spin 2^N cycles before they sleep (4 to 30; default: unset, OpenBLAS's
#                      own, 2^28); docs/tuning.md, "OpenBLAS's idle threads"
#     --cores LIST     run both trainer runs on these cores only (taskset -c LIST, e.g. 0,1: this
#                      VM's two cores on a larger machine; default: every core)
#     --train-copy-staged-rows   move_staged_rows false in both trainer runs: staged rows copied
#                      into the caches (default: the trainer's, moved by index into spare rows
#                      beside the slots, counted in the budget)
#     --keep           keep the tables afterwards (default: removed)
# Output: the fio floor, then one JSON line per run (bench_scale's summary), then a table in
# Markdown on stdout; everything also goes to DIR/results.txt.
set -euo pipefail

bin=build/cpu/benchmarks/scale
tools=build/cpu/src/tools
train=build/cpu/src/trainer/embcache-train
dir=/var/tmp/embcache_scale
rows=16000000
width=192
fraction=0.05
passes=4
cap_mib=2560
budget_mib=
train_rate=50000
fio_seconds=20
trainer=0
keep=0
skip_passes=0
trainer_only=0
train_staging_mib=192
train_write_back_mib=0
train_block_bytes=0
train_store=rocksdb
pass_stores=rocksdb
train_samples=3000000
train_shard_samples=250000
train_passes=3
train_dim=64
train_cardinality=0.5
train_cap_mib=1536
train_blas_threads=0
train_move=default
train_budget_mib=
cores=
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --tools) tools=$2; shift 2 ;;
    --train-exe) train=$2; shift 2 ;;
    --skip-passes) skip_passes=1; shift ;;
    --trainer-only) trainer_only=1; trainer=1; skip_passes=1; fio_seconds=0; shift ;;
    --train-staging-mib) train_staging_mib=$2; shift 2 ;;
    --train-write-back-mib) train_write_back_mib=$2; shift 2 ;;
    --train-block-bytes) train_block_bytes=$2; shift 2 ;;
    --train-store) train_store=$2; shift 2 ;;
    --pass-stores) pass_stores=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --width) width=$2; shift 2 ;;
    --fraction) fraction=$2; shift 2 ;;
    --passes) passes=$2; shift 2 ;;
    --cap-mib) cap_mib=$2; shift 2 ;;
    --budget-mib) budget_mib=$2; shift 2 ;;
    --train-rate) train_rate=$2; shift 2 ;;
    --fio-seconds) fio_seconds=$2; shift 2 ;;
    --trainer) trainer=1; shift ;;
    --train-samples) train_samples=$2; shift 2 ;;
    --train-shard-samples) train_shard_samples=$2; shift 2 ;;
    --train-passes) train_passes=$2; shift 2 ;;
    --train-dim) train_dim=$2; shift 2 ;;
    --train-cardinality) train_cardinality=$2; shift 2 ;;
    --train-cap-mib) train_cap_mib=$2; shift 2 ;;
    --train-budget-mib) train_budget_mib=$2; shift 2 ;;
    --train-blas-threads) train_blas_threads=$2; shift 2 ;;
    --openblas-thread-timeout) export OPENBLAS_THREAD_TIMEOUT=$2; shift 2 ;;
    --train-copy-staged-rows) train_move=false; shift ;;
    --cores) cores=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "run_scale.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$budget_mib" ] || budget_mib=$((cap_mib - 256))
exe="$bin/bench_scale"
if [ "$trainer_only" = 0 ] && [ ! -x "$exe" ]; then
  echo "run_scale.sh: no $exe (build target bench_scale)" >&2
  exit 1
fi
mkdir -p "$dir"
out="$dir/results.txt"
: > "$out"
say() { echo "$@" | tee -a "$out"; }

say "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores${cores:+ (the trainer on cores $cores)}, $(free -g | awk '/Mem:/{print $2}') GiB," \
    "load $(cut -d' ' -f1-3 /proc/loadavg), disk: $(df -h "$dir" | awk 'NR==2{print $1, $4 " free"}')"

# --- The memory cap: cgroup v1 (memory.limit_in_bytes also charges the page cache) or v2.
cg=""
cg_kind=none
name="embcache_scale_$$"
if [ -w /sys/fs/cgroup/memory ] && [ -e /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
  cg=/sys/fs/cgroup/memory/$name
  cg_kind=v1
elif [ -e /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers \
    && [ -w /sys/fs/cgroup ]; then
  cg=/sys/fs/cgroup/$name
  cg_kind=v2
fi
cleanup() {
  [ -n "$cg" ] && [ -d "$cg" ] && rmdir "$cg" 2>/dev/null || true
  if [ "$keep" = 0 ]; then rm -rf "$dir/big" "$dir/small" "$dir/fio.dat" "$dir/train"; fi
}
trap cleanup EXIT

# Runs "$@" in a fresh memory cgroup of $1 MiB (0: no cap); prints the cgroup's peak and OOM
# kills as a JSON line after the command's own output.
capped() {
  local mib=$1; shift
  if [ "$mib" = 0 ] || [ "$cg_kind" = none ]; then
    [ "$mib" != 0 ] && say "WARNING: no writable memory cgroup (neither v1 nor v2 with the memory" \
      "controller): running WITHOUT a memory cap"
    "$@"
    return
  fi
  mkdir -p "$cg"
  if [ "$cg_kind" = v1 ]; then
    echo $((mib << 20)) > "$cg/memory.limit_in_bytes"
    echo 0 > "$cg/memory.max_usage_in_bytes" 2>/dev/null || true
  else
    echo $((mib << 20)) > "$cg/memory.max"
    echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
  fi
  local rc=0
  sh -c 'echo $$ > "$0/cgroup.procs"; shift; exec "$@"' "$cg" -- "$@" || rc=$?
  local peak oom
  if [ "$cg_kind" = v1 ]; then
    peak=$(cat "$cg/memory.max_usage_in_bytes")
    oom=$(awk '/oom_kill /{print $2}' "$cg/memory.oom_control" 2>/dev/null || echo "?")
  else
    peak=$(cat "$cg/memory.peak" 2>/dev/null || echo 0)
    oom=$(awk '/oom_kill /{print $2}' "$cg/memory.events")
  fi
  echo "{\"cgroup\": \"$cg_kind\", \"cap_mib\": $mib, \"cgroup_peak_mib\": $((peak >> 20)), \"oom_kills\": ${oom:-0}, \"exit\": $rc}"
  rmdir "$cg" 2>/dev/null || true
  return 0
}

# --- The disk's floor: 4 KiB random reads with direct I/O, queue depth 1 and 32.
if [ "$fio_seconds" != 0 ] && command -v fio > /dev/null; then
  for qd in 1 32; do
    iops=$(fio --name=floor --filename="$dir/fio.dat" --size=4G --rw=randread --bs=4k --direct=1 \
      --ioengine=libaio --iodepth=$qd --runtime="$fio_seconds" --time_based --group_reporting \
      --output-format=json 2>/dev/null | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))')
    say "{\"fio_randread_4k_qd\": $qd, \"iops\": $iops}"
  done
  rm -f "$dir/fio.dat"
fi

# --- The tables: the big one, and one that fits in memory with the same keyset size.
if [ "$trainer_only" = 0 ]; then
keys=$(python3 -c "print(int($rows * $fraction))")
small_rows=$((keys * 4))
small_fraction=0.25
has_store() { case ",$pass_stores," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
for t in big small; do
  n=$rows
  [ $t = small ] && n=$small_rows
  if [ $t = big ] && ! has_store rocksdb; then
    :
  elif [ "$(cat "$dir/$t/built" 2>/dev/null)" != "$n $width" ]; then
    rm -rf "${dir:?}/$t"
    mkdir -p "$dir/$t"
    say "$(/usr/bin/time -f '{"build_max_rss_kib": %M}' "$exe" build "$dir/$t" "$n" "$width" 2>&1 \
      | grep -v -e '^bench_scale: .* rows written' -e '^rocksdb: \[WARN\]' | tr '\n' ' ')"
    echo "$n $width" > "$dir/$t/built"
  fi
  if [ $t = big ] && has_store log && [ "$(cat "$dir/$t/log_built" 2>/dev/null)" != "$n $width" ]; then
    rm -rf "${dir:?}/$t/log"
    mkdir -p "$dir/$t"
    say "$(/usr/bin/time -f '{"build_max_rss_kib": %M}' "$exe" build-log "$dir/$t" "$n" "$width" 2>&1 | tr '\n' ' ')"
    echo "$n $width" > "$dir/$t/log_built"
  fi
  say "{\"table\": \"$t\", \"rows\": $n, \"disk_mib\": $(du -sm "$dir/$t" | cut -f1)}"
done

run() {  # label cap_mib table rows fraction extra-options...
  local label=$1 mib=$2 t=$3 n=$4 f=$5; shift 5
  say "## $label"
  capped "$mib" "$exe" passes "$dir/$t" "$n" "$width" passes="$passes" fraction="$f" \
    train_rows_per_s="$train_rate" "$@" 2>&1 | tee -a "$out"
}
fi
budget=$((budget_mib << 20))
if [ "$skip_passes" = 0 ]; then
if has_store rocksdb; then
run "ssd, prefetch, cap ${cap_mib} MiB" "$cap_mib" big "$rows" "$fraction" budget=$budget prefetch=1
run "ssd, synchronous, cap ${cap_mib} MiB" "$cap_mib" big "$rows" "$fraction" budget=$budget prefetch=0
run "ssd, prefetch, DRAM tier, cap ${cap_mib} MiB" "$cap_mib" big "$rows" "$fraction" \
  budget=$budget prefetch=1 dram_tier=1
fi
if has_store log; then
run "ssd log store, prefetch, cap ${cap_mib} MiB" "$cap_mib" big "$rows" "$fraction" \
  budget=$budget prefetch=1 log=1
run "ssd log store, synchronous, cap ${cap_mib} MiB" "$cap_mib" big "$rows" "$fraction" \
  budget=$budget prefetch=0 log=1
fi
run "in memory (host store), prefetch, no cap" 0 small "$small_rows" "$small_fraction" host=1 prefetch=1
run "in memory (host store), synchronous, no cap" 0 small "$small_rows" "$small_fraction" host=1 prefetch=0
fi

# --- Item 4: embcache-train with a RocksDB store under the cap, beside a host store uncapped.
[ "$trainer" = 1 ] || exit 0
synth="$tools/embcache-synth"
[ -x "$synth" ] && [ -x "$train" ] || { echo "run_scale.sh: no $synth or $train" >&2; exit 1; }
data="$dir/train/data"
if [ ! -e "$data/manifest.json" ]; then
  mkdir -p "$dir/train"
  "$synth" -o "$data" -r "$train_samples" -n "$train_shard_samples" \
    --cardinality-scale "$train_cardinality" > /dev/null
fi
shards=$(cd "$data" && ls shard-*.bin | sort)
set -- $shards
per=$(( $# / train_passes ))
passes_json=$(python3 -c "
import json, sys
s = sys.argv[2:]; per = int(sys.argv[1])
print(json.dumps([{'shards': s[i * per:(i + 1) * per]} for i in range(len(s) // per)]))" "$per" "$@")
move_field=""  # the trainer's default unless --train-copy-staged-rows
[ "$train_move" = false ] && move_field=', "move_staged_rows": false'
config() {  # store budget staging write_back deep_block_bytes
  local blocks=""
  [ "$1" = rocksdb ] && blocks=" \"store_block_bytes\": $5,"
  cat <<JSON
{"mode": "keyset", "data_dir": "$data", "passes": $passes_json,
 "tables": [
   {"name": "wide", "capacity": "auto", "store": "$1", "store_path": "$dir/train/db-$1"},
   {"name": "deep", "dim": $train_dim, "capacity": "auto", "store": "$1",
    "store_path": "$dir/train/db-$1",$blocks
    "optimizer": {"kind": "adam", "learning_rate": 0.001}}],
 "model": {"hidden": [64, 32], "dropout": 0, "learning_rate": 0.001, "seed": 0},
 "batch_size": 2048, "prefetch": true, "log_interval": 0, "dense_device": "host",
 "embedding_device": "host", "memory_budget_bytes": $2, "staging_bytes": $3,
 "write_back_bytes": $4, "blas_threads": $train_blas_threads$move_field}
JSON
}
case "$train_store" in rocksdb|log) ;; *) echo "--train-store: rocksdb or log, not $train_store" >&2; exit 2 ;; esac
[ -n "$train_budget_mib" ] || { [ "$train_store" = log ] && train_budget_mib=1472 || train_budget_mib=1280; }
for store in "$train_store" host; do
  rm -rf "$dir/train/db-$store"
  if [ $store != host ]; then
    config $store $((train_budget_mib << 20)) $((train_staging_mib << 20)) \
      $((train_write_back_mib << 20)) "$train_block_bytes" > "$dir/train/$store.json"
  else
    config $store 0 0 0 0 > "$dir/train/$store.json"
  fi
done
# The trainer's command: on --cores only, with its peak RSS where GNU time is there.
trainer_cmd=()
[ -n "$cores" ] && trainer_cmd+=(taskset -c "$cores")
[ -x /usr/bin/time ] && trainer_cmd+=(/usr/bin/time -f '{"max_rss_kib": %M}')
trainer_cmd+=("$train")
say "## embcache-train, $train_store store, budget ${train_budget_mib} MiB, cap ${train_cap_mib} MiB, deep table's blocks ${train_block_bytes} bytes (0: derived; rocksdb only)${OPENBLAS_THREAD_TIMEOUT:+, OPENBLAS_THREAD_TIMEOUT $OPENBLAS_THREAD_TIMEOUT}, move_staged_rows $train_move"
capped "$train_cap_mib" "${trainer_cmd[@]}" --config "$dir/train/$train_store.json" 2>&1 \
  | awk '{print; fflush()}' | grep --line-buffered -E "memory plan|pass [0-9]+ done|cgroup|max_rss|rror" | tee -a "$out" || true
say "## embcache-train, host store, no cap${OPENBLAS_THREAD_TIMEOUT:+, OPENBLAS_THREAD_TIMEOUT $OPENBLAS_THREAD_TIMEOUT}, move_staged_rows $train_move"
capped 0 "${trainer_cmd[@]}" --config "$dir/train/host.json" 2>&1 \
  | awk '{print; fflush()}' | grep --line-buffered -E "pass [0-9]+ done|max_rss|rror" | tee -a "$out"  || true
# Samples/s of the passes after the first, each store's mean, and their ratio (the 0.7 target).
awk -v disk="$train_store" '$0 ~ "^## embcache-train, " disk " store" {s = "disk"} /^## embcache-train, host/ {s = "host"}
     s && /pass [0-9]+ done/ && !/pass 1 done/ {
       x = $0; sub(/.*\(/, "", x); sub(/ samples\/s\).*/, "", x); sum[s] += x; n[s]++ }
     END { if (n["disk"] && n["host"]) {
             r = sum["disk"] / n["disk"]; h = sum["host"] / n["host"]
             printf "{\"trainer_samples_per_s\": {\"%s\": %.0f, \"host\": %.0f}, \"ratio\": %.3f}\n", disk, r, h, r / h } }' \
  "$out" | tee -a "$out"
