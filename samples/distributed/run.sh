#!/bin/sh
# A sharded, data-parallel training run on this machine, then a resume on another number of
# ranks (docs/distributed.md):
#   1. synthetic Criteo-like shards (embcache-synth) and two configurations;
#   2. `mpirun -np 2 embcache-train`: keyset mode, every rank's training cache holding its part of
#      each shard's keyset; passes over shards 0-1 and 2, an incremental export per pass (one
#      delta per rank, named by a parts file) and a sharded save;
#   3. `mpirun -np 4 embcache-train` resumes from that save and trains on shard 3.
# On several hosts the same configurations run under `mpirun -np N --hostfile H` with the work
# folder on a file system every host sees.
#
#   samples/distributed/run.sh BUILD_DIR [WORK_DIR] [ROWS_PER_SHARD]
# BUILD_DIR holds the configured build (e.g. build/cpu); WORK_DIR defaults to BUILD_DIR/distributed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$1
work=${2:-$build/distributed}
rows=${3:-20000}
mpiexec=${MPIEXEC:-mpiexec}
launch="sh $here/../../scripts/mpirun_local.sh $mpiexec"

rm -rf "$work"
mkdir -p "$work"
echo "== 1. synthetic shards and configurations in $work =="
"$build/src/tools/embcache-synth" --output "$work/data" --rows $((rows * 5)) \
  --rows-per-shard "$rows" --cardinality-scale 0.05 --cross
cat > "$work/first.json" <<JSON
{
  "mode": "keyset",
  "data_dir": "$work/data",
  "passes": [["shard-00000.bin", "shard-00001.bin"], ["shard-00002.bin"]],
  "eval_shard": "shard-00004.bin",
  "tables": [{"name": "wide", "capacity": "auto"}, {"name": "deep", "capacity": "auto"}],
  "model": {"hidden": [64, 32]},
  "crossed": true,
  "batch_size": 512,
  "num_blocks": 4,
  "log_interval": 0,
  "export_dir": "$work/export",
  "save_dir": "$work/save",
  "output_dir": "$work/metrics"
}
JSON
sed -e 's|"passes": .*|"passes": [["shard-00003.bin"]],|' \
    -e "s|\"save_dir\": .*|\"save_dir\": \"$work/save2\",|" \
    -e "s|\"export_dir\": .*|\"export_dir\": \"$work/export\", \"resume_from\": \"$work/save\",|" \
    "$work/first.json" > "$work/resume.json"

echo
echo "== 2. two ranks: passes over shards 0-1 and 2, exports, save =="
$launch 2 "$build/src/trainer/embcache-train" --config "$work/first.json" --no-plot
echo
echo "== 3. four ranks resume from the save of two and train on shard 3 =="
$launch 4 "$build/src/trainer/embcache-train" --config "$work/resume.json" --no-plot
echo
echo "== the save: one part per rank per table =="
for table in wide deep; do
  echo "$table: $(grep -o '"world_size": [0-9]*' "$work/save2/sparse/$table/manifest.json"), \
$(grep -o '"rows": [0-9]*' "$work/save2/sparse/$table/manifest.json" | tr '\n' ' ')"
done
echo "== the exports: a delta per rank, named by a parts file per pass =="
for parts in "$work"/export/delta-*.parts.json; do
  named=$(grep -o '"rank-[0-9]*/delta-[0-9]*"' "$parts" | tr -d '"')
  for part in $named; do
    if [ ! -f "$work/export/$part/manifest.json" ]; then
      echo "$parts names $part, which is not there" >&2
      exit 1
    fi
  done
  echo "$(basename "$parts"): $(echo $named | wc -w) parts, $(grep -o '"rows": [0-9]*' "$parts")"
done
