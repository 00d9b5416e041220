#!/usr/bin/env bash
# Builds, on a machine with the CUDA toolkit but no GPU, a self-contained kit for a bare GPU machine
# that has the CUDA driver and libraries but none of embcache's Debian dependencies: the GPU test
# binary, the cache and training-cache benchmarks, the trainer (with the RocksDB store) and the
# synthetic-data tool, for one architecture, plus the shared libraries they need that are not the
# C/C++ runtime or CUDA's, and benchmarks/scale/run_scale.sh for the trainer's store ratio.
# Output: .gpu-kit/ (git-ignored): kit.tar.xz (bin/ and lib/, about 14 MiB against 83 MB
# unpacked) and run.sh, which unpacks it on first use; it must stay under the device tool's carry
# limit (64 MiB with the working tree), which this script checks.
#
#   scripts/gpu_kit.sh            # sm_90 (H100, H200); EMBCACHE_KIT_ARCH=80 for an A100;
#                                 # EMBCACHE_KIT_JOBS: build jobs (default: every core)
#   .gpu-kit/run.sh STEP          # there; logs to $OUT. STEP: tests, memcheck, synccheck,
#                                 # initcheck, bench, trainer, python, scale, or all (tests,
#                                 # bench, trainer).
#                                 # Exits with the worst status of its steps (run.sh's header).
#   EMBCACHE_KIT_CHECK=1 scripts/gpu_kit.sh   # also checks here that every binary loads with the
#                                 # kit's libraries alone (the system's copies hidden), by running
#                                 # cuda_tests, which skips its cases without a device; and, with
#                                 # no device here, that `run.sh tests` exits non-zero with every
#                                 # suite group failed (EMBCACHE_REQUIRE_CUDA=1)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

arch=${EMBCACHE_KIT_ARCH:-90}
build=build/gpu-kit
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
# -lineinfo: compute-sanitizer's reports name the source line of a device fault.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DEMBCACHE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
  -DCMAKE_CUDA_FLAGS=-lineinfo "${launcher[@]}" \
  -DEMBCACHE_ROCKSDB=ON "-DEMBCACHE_PARTS=cache;cuda;training"
cmake --build "$build" --target cuda_tests bench_cache bench_training_cache embcache-train \
  embcache-synth -j"${EMBCACHE_KIT_JOBS:-$(nproc)}"

kit=$build/kit
rm -rf "$kit" .gpu-kit
mkdir -p "$kit/bin" "$kit/lib" .gpu-kit
cp "$build/tests/cuda/cuda_tests" "$build/benchmarks/cache/bench_cache" \
  "$build/benchmarks/training/bench_training_cache" "$build/src/trainer/embcache-train" \
  "$build/src/tools/embcache-synth" "$kit/bin/"
# Debug sections go; the symbol table stays, so sanitizer backtraces name host functions.
strip --strip-debug "$kit"/bin/*
cp scripts/bench_trainer_device.sh benchmarks/scale/run_scale.sh "$kit/bin/"
# The C and C++ runtimes and CUDA's libraries come from the GPU machine; everything else travels.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libgcc_s\.|libstdc\+\+\.|libcudart|libcublas|libcuda\.)'
for bin in "$kit"/bin/*; do
  [[ $bin == *.sh ]] && continue
  ldd "$bin" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    if ! [[ $name =~ $skip ]]; then cp -L "$path" "$kit/lib/$name"; fi
  done
done

# The Python bindings for the GPU machine's own interpreter, built there by run.sh's `python` step:
# the sources, the cuda-build preset's static libraries (host space, cuda space, serving; no
# trainer, RocksDB or Redis), pybind11's headers (a release that supports Python 3.12) and the
# only outside headers the bindings include (dlpack, xxhash, nlohmann-json).
if [[ ${EMBCACHE_KIT_PYTHON:-1} != 0 ]]; then
  cmake --preset cuda-build -DCMAKE_CUDA_ARCHITECTURES="$arch" "${launcher[@]}" >/dev/null
  cmake --build build/cuda-build --target embcache_cuda embcache_serving \
    -j"${EMBCACHE_KIT_JOBS:-$(nproc)}"
  py=$kit/python
  mkdir -p "$py/lib" "$py/sysinc" "$py/tests"
  cp -r python/src python/embcache "$py/"
  cp python/tests/conftest.py python/tests/test_{cuda,cache,torch,training,stores,keys_u32}.py \
    "$py/tests/"
  cp -r include "$py/include" && cp -r build/cuda-build/include/. "$py/include/"
  cp build/cuda-build/src/libembcache_cuda.a build/cuda-build/src/serving/libembcache_serving.a \
    build/cuda-build/src/libembcache.a "$py/lib/"
  cp -r /usr/include/dlpack /usr/include/nlohmann /usr/include/xxhash.h "$py/sysinc/"
  pybind=build/gpu-kit/pybind11-2.13.6
  if [[ ! -d $pybind ]]; then
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$pybind" pybind11==2.13.6
    (cd "$pybind" && python3 -m zipfile -e pybind11-2.13.6-py3-none-any.whl .)
  fi
  cp -r "$pybind/pybind11/include" "$py/pybind11"
fi

cat >.gpu-kit/run.sh <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine; logs to $OUT (or ./out). CUDA's libraries are looked up on that machine
# (the toolkit's, or pip's nvidia-* ones). STEP:
#   tests      every GPU test, one suite group per process, each under `timeout`
#   memcheck   cuda_tests under compute-sanitizer's memcheck, a suite group per process
#   synccheck  the same under synccheck (the warp-per-key lookups' ballots and shuffles)
#   initcheck  the same under initcheck (reads of device memory never written)
#   bench      bench_cache's cuda cases, the training cache's boundaries at 90% overlap (or at
#              BENCH_OVERLAPS, e.g. '0|50|90')
#   trainer    the trainer with device embeddings against host-hybrid and all-resident
#   python     builds the Python bindings for this machine's python3 and runs the Python tests,
#              the cuda space's among them (must pass, not skip)
#   scale      the trainer over a RocksDB store (under a memory budget and, where a memory cgroup
#              is writable, its cap) against a host store: run_scale.sh --trainer-only on every
#              core, then on two (taskset -c 0,1: the development VM's count); each prints the
#              RocksDB / host samples/s ratio of passes 2 and 3 (#31's 0.7 target). CPU only.
#   all        tests, bench, trainer
# GTEST_FILTER replaces the suite groups by one run of that filter; SANITIZER_FLAGS adds options
# to compute-sanitizer (e.g. --print-limit 5000). Exit status: the worst of
# every step (0 only when each passed); EMBCACHE_REQUIRE_CUDA=1 (set here unless the caller set
# it) makes every cuda test fail, not skip, without a usable device, so a run that could not use
# the GPU never exits 0. TIMEOUT_S (default 300): the limit of each process.
set -uo pipefail
step=${1:-all}
kit_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${OUT:-$kit_dir/out}
limit=${TIMEOUT_S:-300}
export EMBCACHE_REQUIRE_CUDA=${EMBCACHE_REQUIRE_CUDA:-1}
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
# What ran where: the device and driver, and which CUDA libraries each binary loaded.
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || echo "nvidia-smi exit status: $?" >>"$out/nvidia-smi.txt"
for bin in "$here"/bin/*; do
  [[ $bin == *.sh ]] && continue
  echo "== $(basename "$bin")"
  ldd "$bin"
done >"$out/ldd.txt" 2>&1
: >"$out/status.txt"
worst=0
note() {  # $1: what ran, $2: its exit status; keeps the worst (highest) status
  echo "embcache-kit: $1 exit status: $2" | tee -a "$out/status.txt"
  ((${2} > worst)) && worst=$2
  return 0
}
# Suite groups of cuda_tests, one process each: a device fault fails every later test of its
# process and a hang loses the rest, so neither may take other groups with it.
groups=('space_cuda.*:several_devices_cuda.*:cache_cuda.*:cuda/cache_conformance*'
        'sparse_cuda.*:dense_network_cuda.*:dense_backend_cuda.*'
        'training_cache_cuda*:cuda/expiry_cases*:-training_cache_cuda.without_a_device_*'
        'trainer_*_device.*')
# Cases that test the absence of a device (run by the host suite, not here).
host_only='training_cache_cuda.without_a_device_*'
if [[ -n ${GTEST_FILTER:-} ]]; then
  groups=("$GTEST_FILTER")
else
  # Every case of cuda_tests must be in a group: a suite left out never runs on the GPU.
  list() { "$here/bin/cuda_tests" --gtest_list_tests --gtest_filter="$1" |
    awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}'; }
  missing=$(comm -23 <(list "*-$host_only" | sort) \
    <(for g in "${groups[@]}"; do list "$g"; done | sort -u))
  if [[ -n $missing ]]; then
    echo "embcache-kit: cases in no suite group (add them to run.sh's groups):" $missing |
      tee -a "$out/status.txt"
    worst=1
  fi
fi
unset GTEST_FILTER
run_group() {  # $1: log name, $2: filter, rest: the command prefix (empty or compute-sanitizer)
  local name=$1 filter=$2
  shift 2
  timeout -k 10 "$limit" "$@" "$here/bin/cuda_tests" --gtest_filter="$filter" >"$out/$name.log" 2>&1
  local rc=$?
  tail -3 "$out/$name.log"
  # A group that matched no test or skipped one did not test the device.
  if ((rc == 0)) && ! grep -q '^\[  PASSED  \] [1-9]' "$out/$name.log"; then
    echo "embcache-kit: $name ran no test" && rc=1
  fi
  # Skips for want of a device fail under EMBCACHE_REQUIRE_CUDA=1; the others (no root for a
  # tmpfs) are listed for the reader.
  grep '^\[  SKIPPED \] [a-z]' "$out/$name.log" || true
  note "$name ($filter)" "$rc"
}
run_tests() {  # $1: "" or a compute-sanitizer tool
  local i=0
  for g in "${groups[@]}"; do
    i=$((i + 1))
    if [[ -z $1 ]]; then
      run_group "cuda_tests_$i" "$g"
    else
      # The planted out-of-memory of this test is an API error that memcheck reports by design.
      local planted=space_cuda.a_handled_out_of_memory_does_not_fail_the_next_launch
      if [[ $g == *-* ]]; then g="$g:$planted"; else g="$g-$planted"; fi
      # shellcheck disable=SC2086  # SANITIZER_FLAGS: more options, split on spaces
      run_group "cuda_tests_${1}_$i" "$g" compute-sanitizer --tool "$1" --error-exitcode 3 \
        ${SANITIZER_FLAGS:-}
    fi
  done
}
run_bench() {
  timeout -k 10 "$limit" "$here/bin/bench_cache" --benchmark_filter=/cuda/ \
    --benchmark_min_time=0.2 --benchmark_out="$out/bench_cache_cuda.json" \
    --benchmark_out_format=json >"$out/bench_cache_cuda.log" 2>&1
  local rc=$?
  ((rc == 0)) && ! grep -q '/cuda/' "$out/bench_cache_cuda.json" && rc=1
  note bench_cache "$rc"
  # The training cache's pass boundaries, host and cuda spaces in one run: at 90% overlap, or at
  # the overlaps BENCH_OVERLAPS names (a regex alternation, e.g. '0|50|90'); EMBCACHE_BENCH_KEYS
  # sets the keyset size (the binary's default: 1Mi).
  timeout -k 10 "$limit" "$here/bin/bench_training_cache" \
    --benchmark_filter="training_begin_pass(/cuda)?/overlap:(${BENCH_OVERLAPS:-90})/.*/rocksdb:0/room:[01]" \
    --benchmark_out="$out/bench_training_cache.json" --benchmark_out_format=json \
    >"$out/bench_training_cache.log" 2>&1
  rc=$?
  ((rc == 0)) && ! grep -q '/cuda/' "$out/bench_training_cache.json" && rc=1
  note bench_training_cache "$rc"
}
run_trainer() {
  # The data stays outside $OUT; each setup's config, log and metrics come back.
  local work=${TMPDIR:-/tmp}/embcache_device_bench
  TRAIN=$here/bin/embcache-train SYNTH=$here/bin/embcache-synth timeout -k 10 "$limit" \
    "$here/bin/bench_trainer_device.sh" "$work" >"$out/trainer.log" 2>&1
  note trainer "$?"
  cat "$out/trainer.log"
  mkdir -p "$out/trainer"
  for f in "$work"/*.json "$work"/*.log; do [[ -f $f ]] && cp "$f" "$out/trainer/"; done
  for d in "$work"/out-*; do
    [[ -f $d/metrics.jsonl ]] && cp "$d/metrics.jsonl" "$out/trainer/$(basename "$d").metrics.jsonl"
  done
  return 0
}
run_scale() {
  # Data and databases stay outside $OUT (about 2.5 GB); the logs come back.
  local work=${TMPDIR:-/tmp}/embcache_scale rc=0 cores
  for cores in "" 0,1; do
    # shellcheck disable=SC2086  # --cores LIST only when set
    timeout -k 10 "$limit" "$here/bin/run_scale.sh" --trainer-only --keep --dir "$work" \
      --tools "$here/bin" --train-exe "$here/bin/embcache-train" --openblas-thread-timeout 4 \
      ${cores:+--cores $cores} >"$out/scale${cores:+_cores_$cores}.log" 2>&1 || rc=$?
    grep -E '^#|^## |pass [0-9]+ done|max_rss|cgroup|ratio|rror' \
      "$out/scale${cores:+_cores_$cores}.log" | cut -c1-220
  done
  rm -rf "$work"
  note scale "$rc"
}
run_python() {
  # The bindings built for this machine's python3 (its headers, this machine's g++), then the
  # Python tests of the cuda space and of the host classes, under its numpy and torch.
  local src=$here/python py=${PYTHON:-python3} build=${TMPDIR:-/tmp}/embcache-python
  local inc ext cudart rc=0 pids=() f
  inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  ext=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  # shellcheck disable=SC2046  # the library path's folders, one argument each
  cudart=$(find /usr/local/cuda/ $(tr : ' ' <<<"$libs") -xdev -name 'libcudart.so.13*' \
    2>/dev/null | head -1)
  [[ -n $cudart ]] || cudart=$(find / -xdev -name 'libcudart.so.13*' 2>/dev/null | head -1)
  rm -rf "$build" && mkdir -p "$build/obj" && cp -r "$src/embcache" "$build/"
  local flags=(-std=c++17 -O2 -fPIC -fvisibility=hidden -DEMBCACHE_PYTHON_CUDA=1
    "-I$src/include" -isystem "$src/sysinc" -isystem "$src/pybind11" -isystem "$inc"
    -isystem /usr/local/cuda/include/cccl -isystem /usr/local/cuda/include)
  {
    echo "python: $py ($("$py" --version 2>&1)), headers $inc, cudart $cudart"
    for f in "$src"/src/*.cpp; do
      "${CXX:-g++}" "${flags[@]}" -c "$f" -o "$build/obj/$(basename "$f").o" &
      pids+=($!)
    done
    for f in "${pids[@]}"; do wait "$f" || rc=1; done
    ((rc == 0)) && "${CXX:-g++}" -shared -o "$build/embcache/_embcache$ext" "$build"/obj/*.o \
      -Wl,--start-group "$src"/lib/*.a -Wl,--end-group "$here"/lib/libtbb.so.* \
      "$here"/lib/libxxhash.so.* "$here"/lib/libz.so.* "$cudart" -lpthread -ldl || rc=1
    ((rc == 0)) && (cd "$src/tests" && export PYTHONPATH=$build \
      EMBCACHE_SYNTH=$here/bin/embcache-synth && timeout -k 10 "$limit" "$py" -m pytest -v -rs \
      -p no:cacheprovider .) || rc=1
  } >"$out/python.log" 2>&1
  # The cuda test must have run, not skipped.
  ((rc == 0)) && ! grep -q 'test_cuda.py::.* PASSED' "$out/python.log" && rc=1
  tail -15 "$out/python.log"
  note python "$rc"
}
case $step in
  tests) run_tests "" ;;
  python) run_python ;;
  memcheck | synccheck | initcheck) run_tests "$step" ;;
  bench) run_bench ;;
  trainer) run_trainer ;;
  scale) run_scale ;;
  all) run_tests ""; run_bench; run_trainer ;;
  *) echo "unknown step '$step'" >&2; exit 2 ;;
esac
echo "embcache-kit: $step: exit status $worst (the worst of its steps; $out/status.txt)"
exit "$worst"
RUN
chmod +x .gpu-kit/run.sh
tar -C "$kit" -cf - bin lib $([[ -d $kit/python ]] && echo python) | xz -T0 -6 >.gpu-kit/kit.tar.xz
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
  if ! nvidia-smi -L >/dev/null 2>&1; then
    # A run that cannot use a device must not look green: run.sh's tests fail, group by group.
    check_dir=$(mktemp -d)
    rc=0
    OUT=$check_dir/out TMPDIR=$check_dir EMBCACHE_REQUIRE_CUDA=1 .gpu-kit/run.sh tests || rc=$?
    failed=$(grep -l 'EMBCACHE_REQUIRE_CUDA=1 but no usable CUDA device' "$check_dir"/out/*.log | wc -l)
    rm -rf "$check_dir"
    if ((rc == 0 || failed != 4)); then
      echo "embcache: run.sh tests without a device exited $rc, $failed of 4 groups failed for want of it" >&2
      exit 1
    fi
    echo "embcache: without a device run.sh tests exits $rc, every suite group failed (EMBCACHE_REQUIRE_CUDA=1)"
  fi
fi
size=$(du -sm .gpu-kit | cut -f1)
tree=$(git ls-files -z | du -cm --files0-from=- | tail -1 | cut -f1)
echo "embcache: kit $(du -sh "$kit" | cut -f1) unpacked, ${size} MiB packed; working tree ${tree} MiB"
if ((size + tree > 60)); then
  echo "embcache: the kit and the working tree pass 60 MiB; a device call carries 64 MiB in all" >&2
  exit 1
fi
echo "embcache: GPU kit in .gpu-kit (carry it: run with carry [\".gpu-kit\"], command .gpu-kit/run.sh STEP)"
