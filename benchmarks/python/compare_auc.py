"""Eval AUC of the PyTorch Wide&Deep sample against embcache-train on the same data and model
(docs/python.md, docs/benchmarks.md). A measurement, not a test.

    PYTHONPATH=build/cpu/python /usr/bin/python3 benchmarks/python/compare_auc.py \
        --trainer build/cpu/src/trainer/embcache-train --synth build/cpu/src/tools/embcache-synth \
        --work /tmp/compare_auc --seeds 0 1 2

Data: embcache-synth, 120,000 rows in shards of 20,000 (seed 5); shards 0-4 train (one pass),
shard 5 is held out. Model: deep dim 16, MLP 429-256-128-1, dropout 0.5, batch 1024, tables of
131,072 rows, table seed 0, model seed per run. Two comparisons per model seed:

  fresh    both programs train from their own initial weights (torch's generator for the
           sample's MLP and dropout, the trainer's hash for its own);
  init     embcache-train resumes the sample's untrained save (torch's initial MLP, empty
           tables) and trains shards 0-4: the sample's fresh run from the same initial weights;
  shared   embcache-train trains shard 0 and saves; both programs resume that save and train
           shards 1-4 (dropout 0.5, then 0.0), so the starting point is the same model and only
           the dropout masks and the arithmetic differ.

Prints one line per run and the differences (sample - trainer). AUCs are read from the saves'
trainer.json (the last pass's eval_auc).
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "..", "..", "samples", "python", "wide_deep.py")


def run(args, log):
    t0 = time.perf_counter()
    done = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(log, "w") as f:
        f.write(" ".join(args) + "\n" + done.stdout)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{done.stdout}")
    return time.perf_counter() - t0


def last_auc(save):
    with open(os.path.join(save, "trainer.json")) as f:
        h = json.load(f)["history"][-1]
    return h["eval_auc"], h["eval_logloss"], h["samples_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--synth", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--skip-shared", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    data = os.path.join(a.work, "data")
    if not os.path.exists(os.path.join(data, "manifest.json")):
        run([a.synth, "--output", data, "--format", "shards", "--rows", "120000",
             "--rows-per-shard", "20000", "--seed", "5"], os.path.join(a.work, "synth.log"))
    shard = lambda i: os.path.join(data, f"shard-{i:05d}.bin")  # noqa: E731
    held_out = shard(5)

    def trainer(name, shards, seed, dropout, resume=""):
        save = os.path.join(a.work, name)
        cfg = {"mode": "keyset", "passes": [{"shards": [shard(i) for i in shards]}],
               "eval_shard": held_out, "batch_size": 1024, "seed": 0, "log_interval": 0,
               "tables": [{"name": "wide", "capacity": 131072},
                          {"name": "deep", "dim": 16, "capacity": 131072}],
               "model": {"hidden": [256, 128], "dropout": dropout, "seed": seed},
               "save_dir": save, "resume_from": resume}
        path = save + ".json"
        with open(path, "w") as f:
            json.dump(cfg, f)
        run([a.trainer, "--config", path, "--no-plot"], save + ".log")
        return save

    def sample(name, first, count, seed, dropout, resume=""):
        save = os.path.join(a.work, name)
        args = [sys.executable, SAMPLE, "--train", data, "--first-shard", str(first), "--shards",
                str(count), "--eval", held_out, "--hidden", "256,128", "--dropout", str(dropout),
                "--batch-size", "1024", "--capacity", "131072", "--seed", "0", "--model-seed",
                str(seed), "--save", save]
        if resume:
            args += ["--resume", resume]
        run(args, save + ".log")
        return save

    rows = []
    for seed in a.seeds:
        t = last_auc(trainer(f"trainer-fresh-{seed}", range(5), seed, 0.5))
        p = last_auc(sample(f"sample-fresh-{seed}", 0, 5, seed, 0.5))
        rows.append(("fresh", seed, 0.5, t, p))
        print(rows[-1], flush=True)
        init = os.path.join(a.work, f"sample-init-{seed}")
        run([sys.executable, SAMPLE, "--hidden", "256,128", "--capacity", "131072", "--seed", "0",
             "--model-seed", str(seed), "--save", init], init + ".log")
        t = last_auc(trainer(f"trainer-init-{seed}", range(5), seed, 0.5, resume=init))
        rows.append(("init", seed, 0.5, t, p))
        print(rows[-1], flush=True)
        if a.skip_shared:
            continue
        start = trainer(f"start-{seed}", [0], seed, 0.5)
        for dropout in (0.5, 0.0):
            t = last_auc(trainer(f"trainer-shared-{seed}-{dropout}", range(1, 5), seed, dropout,
                                 resume=start))
            p = last_auc(sample(f"sample-shared-{seed}-{dropout}", 1, 4, seed, dropout,
                                resume=start))
            rows.append(("shared", seed, dropout, t, p))
            print(rows[-1], flush=True)
    print("\n| start | model seed | dropout | embcache-train AUC | sample AUC | difference |"
          " embcache-train log loss | sample log loss | embcache-train samples/s |"
          " sample samples/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind, seed, dropout, t, p in rows:
        print(f"| {kind} | {seed} | {dropout} | {t[0]:.4f} | {p[0]:.4f} | {p[0] - t[0]:+.4f} |"
              f" {t[1]:.4f} | {p[1]:.4f} | {t[2]:.0f} | {p[2]:.0f} |")
    for kind in ("fresh", "init", "shared"):
        for dropout in (0.5, 0.0):
            d = [p[0] - t[0] for k, _, dr, t, p in rows if k == kind and dr == dropout]
            if d:
                print(f"{kind}, dropout {dropout}: mean difference {sum(d) / len(d):+.4f}, "
                      f"largest {max(d, key=abs):+.4f} over {len(d)} seeds")


if __name__ == "__main__":
    main()
