"""Training throughput of the PyTorch Wide&Deep sample against embcache-train on the same CPU, data
and model (docs/python.md, docs/benchmarks.md). A measurement, not a test.

    PYTHONPATH=build/cpu/python /usr/bin/python3 benchmarks/python/bench_throughput.py \
        --trainer build/cpu/src/trainer/embcache-train --synth build/cpu/src/tools/embcache-synth \
        --work /tmp/bench_throughput --rounds 3

Data and model as in compare_auc.py: embcache-synth, 120,000 rows in shards of 20,000 (seed 5),
one pass over shards 0-4 (100,000 samples), shard 5 evaluated after the pass; deep dim 16, MLP
429-256-128-1, dropout 0.5, batch 1024, tables of 131,072 rows. The two programs run one after the
other, alternated `--rounds` times (trainer, sample, trainer, sample, ...), so that both see the
same machine load; each reports the samples/s of its training pass (the pass alone: no start-up,
no evaluation, no save) in its save's trainer.json. Prints every run, the load average before and
after, the medians and their ratio (sample / embcache-train), and the CPU seconds of each whole
run (all threads; less sensitive to the machine's load than samples/s, though a busy-waiting
thread counts too).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "..", "..", "samples", "python", "wide_deep.py")


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(args, log):
    """Runs a program; returns the CPU seconds (user + system, all its threads) it used."""
    before = cpu_seconds()
    done = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(log, "w") as f:
        f.write(" ".join(args) + "\n" + done.stdout)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{done.stdout}")
    return cpu_seconds() - before


def samples_per_s(save):
    with open(os.path.join(save, "trainer.json")) as f:
        return json.load(f)["history"][-1]["samples_per_s"]


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--synth", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", default="",
                    help="also run the sample once under cProfile, writing the stats here")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    data = os.path.join(a.work, "data")
    if not os.path.exists(os.path.join(data, "manifest.json")):
        run([a.synth, "--output", data, "--format", "shards", "--rows", "120000",
             "--rows-per-shard", "20000", "--seed", "5"], os.path.join(a.work, "synth.log"))
    shard = lambda i: os.path.join(data, f"shard-{i:05d}.bin")  # noqa: E731

    def trainer(name):
        save = os.path.join(a.work, name)
        cfg = {"mode": "keyset", "passes": [{"shards": [shard(i) for i in range(5)]}],
               "eval_shard": shard(5), "batch_size": 1024, "seed": 0, "log_interval": 0,
               "tables": [{"name": "wide", "capacity": 131072},
                          {"name": "deep", "dim": 16, "capacity": 131072}],
               "model": {"hidden": [256, 128], "dropout": 0.5, "seed": 0},
               "save_dir": save}
        with open(save + ".json", "w") as f:
            json.dump(cfg, f)
        cpu = run([a.trainer, "--config", save + ".json", "--no-plot"], save + ".log")
        return samples_per_s(save), cpu

    def sample(name, profile=""):
        save = os.path.join(a.work, name)
        pre = [sys.executable] + (["-m", "cProfile", "-o", profile] if profile else [])
        cpu = run(pre + [SAMPLE, "--train", data, "--shards", "5", "--eval", shard(5),
                   "--hidden", "256,128", "--dropout", "0.5", "--batch-size", "1024",
                   "--capacity", "131072", "--seed", "0", "--model-seed", "0", "--save", save],
            save + ".log")
        return samples_per_s(save), cpu

    print(f"load average before: {load_average()}", flush=True)
    t, p, tc, pc = [], [], [], []
    for r in range(a.rounds):
        speed, cpu = trainer(f"trainer-{r}")
        t.append(speed)
        tc.append(cpu)
        print(f"round {r}: embcache-train {speed:.0f} samples/s, {cpu:.1f} CPU s", flush=True)
        speed, cpu = sample(f"sample-{r}")
        p.append(speed)
        pc.append(cpu)
        print(f"round {r}: sample         {speed:.0f} samples/s, {cpu:.1f} CPU s", flush=True)
    print(f"load average after: {load_average()}")
    mt, mp = statistics.median(t), statistics.median(p)
    print(f"median embcache-train {mt:.0f} samples/s, sample {mp:.0f} samples/s, "
          f"ratio {mp / mt:.2f}")
    print(f"median CPU seconds of a whole run (start-up, pass, evaluation, save): "
          f"embcache-train {statistics.median(tc):.1f}, sample {statistics.median(pc):.1f}")
    if a.profile:
        sample("sample-profile", a.profile)
        print(f"profile of one sample run: {a.profile}")


if __name__ == "__main__":
    main()
