#!/usr/bin/env bash
# Builds embcache (installing missing Debian packages first) and runs the project's main job:
# the continuous-training demo on synthetic data generated on the fly. Train on files 0-1, switch
# to files 3-4, export the increments, save; then a new process resumes from the save and trains
# on file 2. The cache holds one shard's keyset; the table is over 10x larger, so rows really
# swap between the cache and the host store. A few minutes on 2 cores.
#   DEMO_DIR (default build/demo)  where the data, metrics, exports and the save go
#   DEMO_ROWS (default 20000)      rows per shard (5 files of 5 shards, plus 1 eval shard)
#   BUILD_DIR (default build/cpu)  the build folder to use: an existing one (configured by the
#                                  `cpu` preset, scripts/test.sh, or any other configuration of
#                                  this tree) is reused as it is, and only what is stale is built
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

bin=${BUILD_DIR:-build/cpu}
targets=(embcache-train embcache-continuous-training)
if [[ -f "$bin/CMakeCache.txt" ]]; then
  echo "== 0. building ${targets[*]} in $bin (an existing build: only what is stale) =="
elif [[ -z "${BUILD_DIR:-}" ]]; then
  echo "== 0. configuring the cpu preset in $bin, then building ${targets[*]} =="
  echo "   (the first build compiles the library: several minutes on 2 cores; later runs reuse it)"
  cmake --preset cpu
else
  echo "demo.sh: BUILD_DIR=$bin is not a configured build folder (no CMakeCache.txt)" >&2
  exit 2
fi
cmake --build "$bin" --target "${targets[@]}" --parallel "$(nproc)"
echo

demo_dir=${DEMO_DIR:-build/demo}
rows=${DEMO_ROWS:-20000}
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
