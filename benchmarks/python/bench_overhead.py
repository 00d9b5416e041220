"""Python overhead per batch: the same work called from Python and from C++ in one process.

Each row times a batch of 64k keys both ways and reports the fastest of `--repeats` calls: from
Python (argument checks, borrowing the arrays, releasing the GIL) and the C++ baseline in the same
module (`_time_cpp`: the same C++ calls in a loop with no Python between them). Overhead =
python / C++ - 1. On a busy machine the two sides of a 64k batch differ by more than the overhead
itself, so the last rows measure the overhead directly: the same calls on a batch of one key
(where the call costs next to nothing), as a share of the C++ time of the 64k batch.

    PYTHONPATH=build/cpu/python /usr/bin/python3 benchmarks/python/bench_overhead.py
"""

import argparse
import time

import numpy as np

import embcache
from embcache import _embcache


def best(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def row(name, py_s, cpp_s):
    print(f"{name:<44} {py_s * 1e3:9.3f} {cpp_s * 1e3:9.3f} {100 * (py_s / cpp_s - 1):+8.1f}%")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--rows", type=int, default=1 << 20)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=0, help="max_threads of the cache (0: all)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n, r = args.batch, args.repeats
    print(f"batch {n} keys, {args.rows} resident rows, fastest of {r}")
    print(f"{'call':<44} {'python ms':>9} {'C++ ms':>9} {'overhead':>9}")

    cache = embcache.EmbeddingCache(slots=args.rows * 5 // 4, dim=16, state_width=32,
                                    max_threads=args.threads)
    all_keys = np.arange(args.rows, dtype=np.int64) * 7919
    cache.find_or_insert(all_keys)
    keys = rng.choice(all_keys, n)
    out = np.empty((n, cache.row_width), np.float32)
    slots = np.empty(n, np.int64)
    for _ in range(2):  # alternate, so that both see the same machine state
        cpp = _embcache._time_cpp(cache, "find", keys, r)
        row("EmbeddingCache.find(keys, out=out)", best(lambda: cache.find(keys, out=out), r), cpp)
        row("EmbeddingCache.find(keys) (new arrays)", best(lambda: cache.find(keys), r), cpp)
        cpp = _embcache._time_cpp(cache, "lookup_slots", keys, r)
        row("EmbeddingCache.lookup_slots(keys, out=slots)",
            best(lambda: cache.lookup_slots(keys, out=slots), r), cpp)

    try:
        import torch
    except ImportError:
        torch = None
    tc = embcache.TrainingCache([embcache.TableOptions(
        "deep", dim=16, capacity=args.rows, optimizer={"kind": "adam", "learning_rate": 1e-3})])
    tc.begin_pass([all_keys])
    bag = embcache.EmbeddingBag(tc, "deep")
    pooled = np.empty((n, 16), np.float32)
    grad = np.full((n, 16), 0.01, np.float32)

    def python_bag():
        bag.forward(keys, out=pooled)
        bag.backward(grad)

    if torch is not None:
        from embcache.torch import EmbeddingBagCollection
        ebc = EmbeddingBagCollection(tc)
        tkeys = torch.from_numpy(keys).reshape(n, 1)
        tgrad = torch.from_numpy(grad).reshape(n, 1, 16)

        def torch_bag():
            ebc({"deep": tkeys})["deep"].backward(tgrad)

    for _ in range(2):
        cpp = bag._time_cpp(keys, 0.01, r)
        row("EmbeddingBag forward + backward (adam)", best(python_bag, r), cpp)
        if torch is not None:
            row("embcache.torch forward + autograd backward", best(torch_bag, r), cpp)
    cpp_find = _embcache._time_cpp(cache, "find", keys, r)
    cpp_bag = bag._time_cpp(keys, 0.01, r)

    # The fixed cost of a call: one key.
    one = keys[:1].copy()
    out1 = np.empty((1, cache.row_width), np.float32)
    pooled1 = np.empty((1, 16), np.float32)
    grad1 = grad[:1].copy()

    def python_bag1():
        bag.forward(one, out=pooled1)
        bag.backward(grad1)

    many = 20 * r
    print(f"\nper call with one key, fastest of {many}, as a share of the 64k-key C++ call")
    print(f"{'call':<44} {'python us':>9} {'C++ us':>9} {'share':>9}")

    def share(name, py_s, cpp_s, cpp_batch):
        print(f"{name:<44} {py_s * 1e6:9.1f} {cpp_s * 1e6:9.1f} "
              f"{100 * (py_s - cpp_s) / cpp_batch:8.3f}%")

    share("EmbeddingCache.find(key, out=out)", best(lambda: cache.find(one, out=out1), many),
          _embcache._time_cpp(cache, "find", one, many), cpp_find)
    share("EmbeddingBag forward + backward", best(python_bag1, many),
          bag._time_cpp(one, 0.01, many), cpp_bag)
    if torch is not None:
        t1 = tkeys[:1].clone()
        g1 = tgrad[:1].clone()
        share("embcache.torch forward + autograd backward",
              best(lambda: ebc({"deep": t1})["deep"].backward(g1), many),
              bag._time_cpp(one, 0.01, many), cpp_bag)


if __name__ == "__main__":
    main()
