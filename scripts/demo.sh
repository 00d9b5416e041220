#!/usr/bin/env bash
# Builds embcache (installing missing Debian packages first) and runs the project's main job.
# Until the reference trainer lands, that is the cache demonstration: fill a cache, look rows up,
# update some, export the changes, evict on demand.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

cmake --preset cpu >/dev/null
cmake --build --preset cpu --target embcache-cache-demo
echo
./build/cpu/samples/cache_demo/embcache-cache-demo
