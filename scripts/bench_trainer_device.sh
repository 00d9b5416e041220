#!/usr/bin/env bash
# The trainer's samples/s with its embeddings on the device against host-hybrid and against
# all-resident tables, on the same synthetic data (docs/benchmarks.md, "Trainer with the
# embeddings on the device"). Four setups, each trains 3 passes over 6 shards of 20,000 rows:
#   device_swap      tables in the cuda space, keyset mode, caches the size of the largest shard
#                    keyset (every shard swaps), prefetch on
#   device_resident  the same with every row resident (the no-swap baseline on the device)
#   host_hybrid      embeddings and sparse optimizers on the host stores (MindSpore's split)
#   host_resident    every row resident in a host cache
# Prints, per setup, where the dense network and the embeddings ran and the samples/s of passes
# 2 and 3 (pass 1 fills the caches), then the ratios. Setups that cannot run here (no device)
# are reported and skipped; the exit status is then 1 (also when a device_* setup ran its
# embeddings on the host), so a run that measured nothing on the device is not taken for one.
#
#   scripts/bench_trainer_device.sh WORK_DIR
# Environment: TRAIN, SYNTH (the embcache-train and embcache-synth binaries; default: build/gpu),
# DENSE (dense_device, default cuda), SETUPS (default: all four), ROWS (default 120000).
set -uo pipefail
work=${1:?usage: bench_trainer_device.sh WORK_DIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
train=${TRAIN:-$here/../build/gpu/src/trainer/embcache-train}
synth=${SYNTH:-$here/../build/gpu/src/tools/embcache-synth}
dense=${DENSE:-cuda}
setups=${SETUPS:-device_swap device_resident host_hybrid host_resident}
rows=${ROWS:-120000}
per_shard=$((rows / 6))
mkdir -p "$work"
if [[ ! -f $work/data/keysets.done ]]; then
  "$synth" -f shards -r "$rows" -n "$per_shard" -o "$work/data" --force >/dev/null || exit 1
  touch "$work/data/keysets.done"
fi
declare -A rate
failed=0
for setup in $setups; do
  case $setup in
    device_swap) extra='"mode": "keyset", "embedding_device": "cuda", "tables": [{"name": "wide", "capacity": "auto"}, {"name": "deep", "capacity": "auto"}]' ;;
    device_resident) extra='"mode": "keyset", "embedding_device": "cuda"' ;;
    host_hybrid) extra='"mode": "host_hybrid", "embedding_device": "host"' ;;
    host_resident) extra='"mode": "keyset", "embedding_device": "host"' ;;
    *) echo "unknown setup $setup" >&2; exit 2 ;;
  esac
  rm -rf "$work/out-$setup"
  cat >"$work/$setup.json" <<JSON
{"data_dir": "$work", "passes": ["data", "data", "data"], "batch_size": 1024,
 "model": {"hidden": [1024, 1024], "dropout": 0.5}, "dense_device": "$dense",
 "log_interval": 0, "output_dir": "$work/out-$setup", $extra}
JSON
  if ! "$train" --config "$work/$setup.json" --no-plot >"$work/$setup.log" 2>&1; then
    echo "$setup: did not run: $(grep -m1 -i 'error\|unsupported' "$work/$setup.log")"
    failed=1
    continue
  fi
  if [[ $setup == device_* ]] && ! grep -q 'embeddings on cuda' "$work/$setup.log"; then
    echo "$setup: its embeddings did not run on the device"
    failed=1
  fi
  echo "$setup: $(grep -m1 'dense network on' "$work/$setup.log"); $(grep -m1 'embeddings on' "$work/$setup.log")"
  rate[$setup]=$(python3 - "$work/out-$setup/metrics.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(" ".join(str(round(l["samples_per_s"])) for l in lines[1:]))
PY
)
  echo "$setup: samples/s of passes 2 and 3: ${rate[$setup]}"
done
ratio() {  # mean of passes 2-3 of $1 over that of $2
  [[ -n ${rate[$1]:-} && -n ${rate[$2]:-} ]] || return 0
  python3 -c 'import sys; a=[float(x) for x in sys.argv[1].split()]; b=[float(x) for x in sys.argv[2].split()]; print(f"{sys.argv[3]} / {sys.argv[4]}: {sum(a)/len(a)/(sum(b)/len(b)):.2f}")' \
    "${rate[$1]}" "${rate[$2]}" "$1" "$2"
}
ratio device_swap device_resident
ratio device_resident host_hybrid
ratio device_swap host_hybrid
ratio device_resident host_resident
exit "$failed"
