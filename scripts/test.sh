#!/usr/bin/env bash
# Builds embcache for the host space and runs every test (fuzz targets included); runs the
# suite again under AddressSanitizer + UndefinedBehaviorSanitizer (preset `sanitize`); also
# compile-checks the cuda space when nvcc is present. Installs missing Debian packages first.
# Then the threaded tests (training cache, trainer) under ThreadSanitizer (preset `tsan`).
# Exits non-zero on any failure. EMBCACHE_SANITIZE=0 skips the sanitizer run, EMBCACHE_TSAN=0 the
# ThreadSanitizer run; EMBCACHE_CUDA_CHECK_ARCHS sets the compile check's CUDA architectures
# (default 90). The tests run on every core (CTEST_PARALLEL_LEVEL, set by setup.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

cmake --preset cpu
cmake --build --preset cpu
ctest --preset cpu

if [[ "${EMBCACHE_SANITIZE:-1}" != 0 ]]; then
  echo "embcache: the suite under AddressSanitizer + UndefinedBehaviorSanitizer (preset sanitize)"
  cmake --preset sanitize
  cmake --build --preset sanitize
  ctest --preset sanitize
fi

if [[ "${EMBCACHE_TSAN:-1}" != 0 ]]; then
  echo "embcache: the training-cache and trainer tests under ThreadSanitizer (preset tsan)"
  cmake --preset tsan
  cmake --build --preset tsan
  ctest --preset tsan
fi

if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  # sm_90 only by default (the H100/H200 of the GPU runs): each architecture is another device
  # compilation of every .cu; EMBCACHE_CUDA_CHECK_ARCHS="80;90" checks the preset's both.
  cuda_archs="${EMBCACHE_CUDA_CHECK_ARCHS:-90}"
  echo "embcache: compile-checking the cuda space (preset cuda-build, architectures $cuda_archs)"
  cmake --preset cuda-build -DCMAKE_CUDA_ARCHITECTURES="$cuda_archs"
  cmake --build --preset cuda-build
fi
echo "embcache: all tests passed"
