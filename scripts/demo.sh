#!/usr/bin/env bash
# Builds embcache (installing missing Debian packages first) and runs the project's main job:
# the continuous-training demo on synthetic data generated on the fly. Train on files 0-1, switch
# to files 3-4, export the increments, save; then a new process resumes from the save and trains
# on file 2. The cache holds one shard's keyset; the table is over 10x larger, so rows really
# swap between the cache and the host store. A few minutes on 2 cores.
#   DEMO_DIR (default build/demo)  where the data, metrics, exports and the save go
#   DEMO_ROWS (default 20000)      rows per shard (5 files of 5 shards, plus 1 eval shard)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

cmake --preset cpu >/dev/null
cmake --build --preset cpu --target embcache-train embcache-continuous-training
echo

demo_dir=${DEMO_DIR:-build/demo}
rows=${DEMO_ROWS:-20000}
bin=./build/cpu
rm -rf "$demo_dir"
mkdir -p "$demo_dir"

echo "== 1. synthetic data and configurations =="
"$bin/samples/continuous_training/embcache-continuous-training" prepare --work "$demo_dir" \
  --rows-per-shard "$rows"
echo
echo "== 2. train on files 0-1, then 3-4; export after every pass; save =="
"$bin/src/trainer/embcache-train" --config "$demo_dir/first.json"
echo
echo "== 3. a new process resumes from the save and trains on file 2 =="
"$bin/src/trainer/embcache-train" --config "$demo_dir/resume.json"

"$bin/samples/continuous_training/embcache-continuous-training" summary --work "$demo_dir"
