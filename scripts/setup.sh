#!/usr/bin/env bash
# Installs the Debian packages embcache needs when they are missing (when run as root).
# Sourced by test.sh and demo.sh; safe to run again.
set -euo pipefail

embcache_packages=(
  cmake g++ make pkg-config
  libtbb-dev librocksdb-dev nlohmann-json3-dev libcli11-dev libxxhash-dev zlib1g-dev
  # The RocksDB store's batched direct reads (io_uring; without it, a pread per block).
  liburing-dev
  # absl::flat_hash_map, a baseline of bench_cache.
  libabsl-dev
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev gnuplot-nox
  # The tools' log lines (timestamp, level); brings libfmt-dev.
  libspdlog-dev
  # Debian's CCCL (Thrust, CUB, libcu++): the host space builds against it when NVIDIA's
  # toolkit is absent, and the sanitizer build uses it so that both are tested.
  libthrust-dev libcub-dev libcu++-dev
  # The Redis serving store (embcache::redis, embcache-serve) and the server its tests start.
  libhiredis-dev redis-server
  # Scale-out over MPI (embcache::mpi, tests/distributed run under mpirun, bench_distributed).
  libopenmpi-dev openmpi-bin
  # The disk's random-read floor that bench_store_ssd is compared with (docs/benchmarks.md).
  fio
  # The Python package embcache (python/) for the system interpreter /usr/bin/python3, and its
  # tests (pytest, NumPy, PyTorch).
  python3-dev pybind11-dev python3-pybind11 libdlpack-dev python3-pytest python3-numpy
  python3-torch
)

embcache_missing=()
for p in "${embcache_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    embcache_missing+=("$p")
  fi
done

if ((${#embcache_missing[@]})); then
  echo "embcache: installing missing packages: ${embcache_missing[*]}"
  if [[ $(id -u) -eq 0 ]]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${embcache_missing[@]}"
  elif command -v sudo >/dev/null; then
    sudo apt-get update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${embcache_missing[@]}"
  else
    echo "embcache: please install: ${embcache_missing[*]}" >&2
    exit 1
  fi
fi

if [[ ! -e /usr/local/cuda/include/cccl/cuda/atomic && ! -e /usr/local/cuda/include/cuda/atomic \
      && -z "${CUDAToolkit_ROOT:-}" ]]; then
  echo "embcache: no CUDA toolkit at /usr/local/cuda: the host space builds against Debian's" \
       "Thrust, CUB and libcu++ (/usr/include); the cuda space is left out"
fi

# Use every core for builds and for the tests unless told otherwise.
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
export CTEST_PARALLEL_LEVEL="${CTEST_PARALLEL_LEVEL:-$(nproc)}"
