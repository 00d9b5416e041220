#!/usr/bin/env bash
# Builds embcache for the host space and runs every test; also compile-checks the cuda space
# when nvcc is present. Installs missing Debian packages first. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

cmake --preset cpu
cmake --build --preset cpu
ctest --preset cpu

if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "embcache: compile-checking the cuda space (preset cuda-build, sm_80 and sm_90)"
  cmake --preset cuda-build
  cmake --build --preset cuda-build
fi
echo "embcache: all tests passed"
