#!/usr/bin/env bash
# Builds embcache for the host space and runs every test (fuzz targets included); runs the
# suite again under AddressSanitizer + UndefinedBehaviorSanitizer (preset `sanitize`); also
# compile-checks the cuda space when nvcc is present. Installs missing Debian packages first.
# Then the threaded tests (training cache, trainer) under ThreadSanitizer (preset `tsan`).
# Exits non-zero on any failure. EMBCACHE_SANITIZE=0 skips the sanitizer run, EMBCACHE_TSAN=0 the
# ThreadSanitizer run.
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
  echo "embcache: compile-checking the cuda space (preset cuda-build, sm_80 and sm_90)"
  cmake --preset cuda-build
  cmake --build --preset cuda-build
fi
echo "embcache: all tests passed"
