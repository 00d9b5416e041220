#!/bin/sh
# run_bench_distributed.sh BENCH [ARGS...]: bench_distributed on 1 and 2 ranks of this machine
# (shared memory transport), then the scaling ratio: 2-rank throughput / (2 x 1-rank throughput)
# of the same per-rank batch. ARGS go to bench_distributed (e.g. --batch=2048 --dim=16).
set -eu
bench=$1
shift
# Waiting ranks yield the core (this VM has as many cores as ranks, and other work).
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl=self,vader
export OMPI_MCA_mpi_yield_when_idle=1
root=""
if [ "$(id -u)" = 0 ]; then root="--allow-run-as-root"; fi
out=$(mktemp -d)
for np in 1 2; do
  mpirun -np "$np" --oversubscribe $root "$bench" "$@" --benchmark_min_time=2 \
    --benchmark_out="$out/np$np.json" --benchmark_out_format=json
done
python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
def step(np):
    for b in json.load(open(f"{d}/np{np}.json"))["benchmarks"]:
        if b["name"].startswith("distributed_step/"):
            return b
one, two = step(1), step(2)
print(f"1 rank:  {one['items_per_second']:.0f} samples/s; 2 ranks: {two['items_per_second']:.0f} samples/s")
print(f"ratio 2-rank / (2 x 1-rank) = {two['items_per_second'] / (2 * one['items_per_second']):.3f}")
for name, b in (("1 rank", one), ("2 ranks", two)):
    print(f"{name}: sent {b['bytes_sent']:.0f} B/step, received {b['bytes_received']:.0f} B/step, "
          f"min {b['min_bytes']:.0f} B/step, unique {b['unique_keys']:.0f}, remote {b['remote_keys']:.0f}")
PY
rm -rf "$out"
