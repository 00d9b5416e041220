#!/usr/bin/env bash
# Builds, on a machine with the CUDA toolkit but no GPU, a self-contained kit for a bare GPU machine
# that has the CUDA driver and libraries but none of embcache's Debian dependencies: the GPU test
# binary and the cache and training-cache benchmarks, for one architecture, plus the shared
# libraries they need that are not the C/C++ runtime or CUDA's. Output: .gpu-kit/ (git-ignored)
# with bin/, lib/ and run.sh.
#
#   scripts/gpu_kit.sh            # sm_90 (H100, H200); EMBCACHE_KIT_ARCH=80 for an A100
#   .gpu-kit/run.sh               # there: cuda_tests, then the benchmarks' cuda cases; logs to $OUT
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

arch=${EMBCACHE_KIT_ARCH:-90}
build=build/gpu-kit
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DEMBCACHE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
  -DEMBCACHE_ROCKSDB=OFF "-DEMBCACHE_PARTS=cache;cuda;training"
cmake --build "$build" --target cuda_tests bench_cache bench_training_cache -j"$(nproc)"

kit=.gpu-kit
rm -rf "$kit"
mkdir -p "$kit/bin" "$kit/lib"
cp "$build/tests/cuda/cuda_tests" "$build/benchmarks/cache/bench_cache" \
  "$build/benchmarks/training/bench_training_cache" "$kit/bin/"
strip "$kit"/bin/*
# The C and C++ runtimes and CUDA's libraries come from the GPU machine; everything else travels.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libgcc_s\.|libstdc\+\+\.|libcudart|libcublas|libcuda\.)'
for bin in "$kit"/bin/*; do
  ldd "$bin" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    if ! [[ $name =~ $skip ]]; then cp -L "$path" "$kit/lib/$name"; fi
  done
done

cat > "$kit/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine: every GPU test, then the cuda cases of bench_cache; logs to $OUT (or
# ./out). CUDA's libraries are looked up on that machine (the toolkit's, or pip's nvidia-* ones).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${OUT:-$here/out}
mkdir -p "$out"
libs=$here/lib
for so in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  if ! ldconfig -p | grep -q "$so"; then
    found=$(find /usr/local /usr/lib /opt / -xdev -name "$so" 2>/dev/null | head -1)
    [[ -n $found ]] && libs=$libs:$(dirname "$found")
  fi
done
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
"$here/bin/cuda_tests" 2>&1 | tee "$out/cuda_tests.log"
tests=${PIPESTATUS[0]}
"$here/bin/bench_cache" --benchmark_filter=/cuda/ --benchmark_min_time=0.2 \
  --benchmark_out="$out/bench_cache_cuda.json" --benchmark_out_format=json 2>&1 |
  tee "$out/bench_cache_cuda.log"
# The training cache's pass boundaries at 90% overlap, host and cuda spaces in one run (host store).
"$here/bin/bench_training_cache" \
  --benchmark_filter='training_begin_pass(/cuda)?/overlap:90/.*/rocksdb:0/room:[01]' \
  --benchmark_out="$out/bench_training_cache.json" --benchmark_out_format=json 2>&1 |
  tee "$out/bench_training_cache.log"
echo "cuda_tests exit status: $tests"
exit "$tests"
RUN
chmod +x "$kit/run.sh"
du -sh "$kit"
echo "embcache: GPU kit in $kit (carry it: run with carry [\".gpu-kit\"], command .gpu-kit/run.sh)"
