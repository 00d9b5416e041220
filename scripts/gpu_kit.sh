#!/usr/bin/env bash
# Builds, on a machine with the CUDA toolkit but no GPU, a self-contained kit for a bare GPU machine
# that has the CUDA driver and libraries but none of embcache's Debian dependencies: the GPU test
# binary, the cache and training-cache benchmarks, the trainer and the synthetic-data tool, for
# one architecture, plus the shared libraries they need that are not the C/C++ runtime or CUDA's.
# Output: .gpu-kit/ (git-ignored): kit.tar.xz (bin/ and lib/, about 10 MB against 62 MB
# unpacked) and run.sh, which unpacks it on first use; it must stay under the device tool's carry
# limit (64 MiB with the working tree), which this script checks.
#
#   scripts/gpu_kit.sh            # sm_90 (H100, H200); EMBCACHE_KIT_ARCH=80 for an A100
#   .gpu-kit/run.sh STEP          # there; logs to $OUT. STEP: tests, memcheck, racecheck, bench,
#                                 # trainer, or all (tests, bench, trainer). Each fits in one call.
#   EMBCACHE_KIT_CHECK=1 scripts/gpu_kit.sh   # also checks here that every binary loads with the
#                                 # kit's libraries alone (the system's copies hidden), by running
#                                 # cuda_tests, which skips its cases without a device
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

arch=${EMBCACHE_KIT_ARCH:-90}
build=build/gpu-kit
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DEMBCACHE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
  -DEMBCACHE_ROCKSDB=OFF "-DEMBCACHE_PARTS=cache;cuda;training"
cmake --build "$build" --target cuda_tests bench_cache bench_training_cache embcache-train \
  embcache-synth -j"$(nproc)"

kit=$build/kit
rm -rf "$kit" .gpu-kit
mkdir -p "$kit/bin" "$kit/lib" .gpu-kit
cp "$build/tests/cuda/cuda_tests" "$build/benchmarks/cache/bench_cache" \
  "$build/benchmarks/training/bench_training_cache" "$build/src/trainer/embcache-train" \
  "$build/src/tools/embcache-synth" "$kit/bin/"
strip "$kit"/bin/*
cp scripts/bench_trainer_device.sh "$kit/bin/"
# The C and C++ runtimes and CUDA's libraries come from the GPU machine; everything else travels.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libgcc_s\.|libstdc\+\+\.|libcudart|libcublas|libcuda\.)'
for bin in "$kit"/bin/*; do
  [[ $bin == *.sh ]] && continue
  ldd "$bin" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    if ! [[ $name =~ $skip ]]; then cp -L "$path" "$kit/lib/$name"; fi
  done
done

cat >.gpu-kit/run.sh <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine; logs to $OUT (or ./out). CUDA's libraries are looked up on that machine
# (the toolkit's, or pip's nvidia-* ones). STEP:
#   tests      every GPU test (cuda_tests)
#   memcheck   cuda_tests under compute-sanitizer's memcheck (GTEST_FILTER narrows it)
#   racecheck  the same under racecheck
#   bench      bench_cache's cuda cases, the training cache's boundaries at 90% overlap
#   trainer    the trainer with device embeddings against host-hybrid and all-resident
#   all        tests, bench, trainer
set -uo pipefail
step=${1:-all}
kit_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${OUT:-$kit_dir/out}
mkdir -p "$out"
# The binaries and libraries travel packed; unpack them once per machine.
here=${TMPDIR:-/tmp}/embcache-kit
if [[ ! -f $here/unpacked || $kit_dir/kit.tar.xz -nt $here/unpacked ]]; then
  rm -rf "$here" && mkdir -p "$here"
  tar -C "$here" -xJf "$kit_dir/kit.tar.xz" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$kit_dir/kit.tar.xz" "$here" || exit 1
  touch "$here/unpacked"
fi
libs=$here/lib
for so in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  if ! ldconfig -p | grep -q "$so"; then
    found=$(find /usr/local /usr/lib /opt / -xdev -name "$so" 2>/dev/null | head -1)
    [[ -n $found ]] && libs=$libs:$(dirname "$found")
  fi
done
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
filter=${GTEST_FILTER:-*}
status=0
run_tests() {
  "$here/bin/cuda_tests" --gtest_filter="$filter" 2>&1 | tee "$out/cuda_tests.log"
  status=${PIPESTATUS[0]}
  echo "cuda_tests exit status: $status"
}
run_sanitizer() {  # $1: memcheck or racecheck
  compute-sanitizer --tool "$1" --error-exitcode 3 "$here/bin/cuda_tests" \
    --gtest_filter="$filter" 2>&1 | tee "$out/cuda_tests_$1.log"
  status=${PIPESTATUS[0]}
  echo "compute-sanitizer $1 exit status: $status"
}
run_bench() {
  "$here/bin/bench_cache" --benchmark_filter=/cuda/ --benchmark_min_time=0.2 \
    --benchmark_out="$out/bench_cache_cuda.json" --benchmark_out_format=json 2>&1 |
    tee "$out/bench_cache_cuda.log"
  # The training cache's pass boundaries at 90% overlap, host and cuda spaces in one run.
  "$here/bin/bench_training_cache" \
    --benchmark_filter='training_begin_pass(/cuda)?/overlap:90/.*/rocksdb:0/room:[01]' \
    --benchmark_out="$out/bench_training_cache.json" --benchmark_out_format=json 2>&1 |
    tee "$out/bench_training_cache.log"
}
run_trainer() {
  TRAIN=$here/bin/embcache-train SYNTH=$here/bin/embcache-synth \
    "$here/bin/bench_trainer_device.sh" /tmp/embcache_device_bench 2>&1 | tee "$out/trainer.log"
}
case $step in
  tests) run_tests ;;
  memcheck | racecheck) run_sanitizer "$step" ;;
  bench) run_bench ;;
  trainer) run_trainer ;;
  all) run_tests; run_bench; run_trainer ;;
  *) echo "unknown step '$step'" >&2; exit 2 ;;
esac
exit "$status"
RUN
chmod +x .gpu-kit/run.sh
if [[ ${EMBCACHE_KIT_CHECK:-0} == 1 ]]; then
  # Hide this machine's copies of the bundled libraries, as on a bare image, then load everything.
  hide=()
  for lib in "$kit"/lib/*; do
    sys=$(ldconfig -p | awk -v n="$(basename "$lib")" '$1 == n {print $NF}')
    for p in $sys; do hide+=("$(readlink -f "$p")"); done
  done
  unshare -m --propagation private bash -c '
    set -e
    for p in "${@:2}"; do mount --bind /dev/null "$p"; done
    for bin in "$1"/bin/*; do
      [[ $bin == *.sh ]] && continue
      if LD_LIBRARY_PATH="$1/lib" ldd "$bin" | grep "not found"; then exit 1; fi
    done
    LD_LIBRARY_PATH="$1/lib" "$1/bin/cuda_tests" --gtest_brief=1 | tail -3
  ' check "$kit" "${hide[@]}"
  echo "embcache: every kit binary loads with the kit's libraries alone"
fi
tar -C "$kit" -cf - bin lib | xz -T0 -6 >.gpu-kit/kit.tar.xz
size=$(du -sm .gpu-kit | cut -f1)
tree=$(git ls-files -z | du -cm --files0-from=- | tail -1 | cut -f1)
echo "embcache: kit $(du -sh "$kit" | cut -f1) unpacked, ${size} MiB packed; working tree ${tree} MiB"
if ((size + tree > 60)); then
  echo "embcache: the kit and the working tree pass 60 MiB; a device call carries 64 MiB in all" >&2
  exit 1
fi
echo "embcache: GPU kit in .gpu-kit (carry it: run with carry [\".gpu-kit\"], command .gpu-kit/run.sh STEP)"
