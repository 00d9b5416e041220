"""Wide&Deep on Criteo-format shards in PyTorch, with the embeddings in an embcache training cache.

The model of embcache-train (docs/model.md): a dim-1 "wide" table (FTRL) summed over the 26 slots
plus a bias, a dim-16 "deep" table (lazy Adam) whose 26 embeddings and the 13 dense features feed
an MLP (ReLU, dropout), the two logits added, binary cross-entropy. The tables, their initial rows
and their sparse optimizers are the trainer's (same TableOptions, same seeds), applied in the
cache's rows on backward; the MLP and the wide bias are torch modules trained by torch's Adam.

    PYTHONPATH=build/cpu/python /usr/bin/python3 samples/python/wide_deep.py \
        --train data/day_0 --eval data/day_1/shard-00000.bin --save out/save

Each pass walks a dataset folder shard by shard (keyset mode: the shard's keyset is made resident,
the next shard's is prefetched in the background while this one trains), then evaluates AUC and
log loss on --eval (keys the tables never saw pool as zero rows, as embcache-train does), exports
the rows changed in the pass (--export) and, at the end, saves the model in embcache-train's save
format (--save DIR: DIR/sparse, DIR/dense.bin, DIR/trainer.json; trainer_save.py), which
embcache-train resumes (config resume_from) and this sample resumes (--resume), from either.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

import embcache
from embcache.torch import EmbeddingBagCollection, keyset_passes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # trainer_save beside this file
import trainer_save  # noqa: E402

SLOTS = embcache.CRITEO_SLOT_COUNT
DENSE = embcache.CRITEO_DENSE_COUNT


def trainer_config(args, hidden, passes):
    """The embcache-train configuration of this model (docs/trainer.md), written to trainer.json."""
    return {
        "mode": "keyset", "batch_size": args.batch_size, "crossed": False, "seed": args.seed,
        "move_staged_rows": not args.copy_staged_rows,
        "num_dense": DENSE, "num_slots": SLOTS, "shuffle": False,
        "passes": [{"shards": shards} for shards in passes],
        "eval_shard": args.eval, "eval_max_samples": args.eval_max_samples,
        "tables": [
            {"name": "wide", "dim": 1, "capacity": args.capacity, "init_scale": 0.0,
             "optimizer": {"kind": "ftrl", "ftrl_alpha": 0.05, "ftrl_initial_accumulator": 1.0}},
            {"name": "deep", "dim": args.dim, "capacity": args.capacity, "init_scale": 0.01,
             "optimizer": {"kind": "adam", "learning_rate": args.sparse_lr}},
        ],
        "model": {"hidden": hidden, "dropout": args.dropout, "seed": args.model_seed,
                  "learning_rate": args.lr, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
    }


def make_cache(args):
    """The trainer's two tables (docs/trainer.md defaults)."""
    wide = embcache.TableOptions(
        "wide", dim=1, capacity=args.capacity, init_scale=0.0, seed=args.seed,
        optimizer={"kind": "ftrl", "ftrl_alpha": 0.05, "ftrl_initial_accumulator": 1.0})
    deep = embcache.TableOptions(
        "deep", dim=args.dim, capacity=args.capacity, init_scale=0.01, seed=args.seed,
        optimizer={"kind": "adam", "learning_rate": args.sparse_lr})
    # Unset: the library's default, rows moved by index for these host caches.
    return embcache.TrainingCache([wide, deep],
                                  move_staged_rows=False if args.copy_staged_rows else None)


class Dropout(torch.nn.Module):
    """Inverted dropout with torch.nn.Dropout's law (each unit kept with probability 1 - p and
    scaled by 1 / (1 - p), identity in eval mode), its masks drawn from NumPy's PCG64 (32 random
    bits per unit against a threshold). Debian's torch (no MKL) draws torch.nn.Dropout's masks one
    element at a time through a Bernoulli distribution: 12 ms per 1024 x 256 batch on the
    development VM, a third of a training step, against 1 ms here."""

    def __init__(self, p, seed):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout: expected a probability in [0, 1], got {p}")
        self.p = p
        self.rng = np.random.default_rng(seed)
        self.threshold = min(round(p * 2.0**32), 2**32 - 1)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        if self.p == 1.0:
            return x * 0.0
        bits = np.frombuffer(self.rng.bytes(4 * x.numel()), dtype=np.uint32).reshape(x.shape)
        mask = (bits >= self.threshold).astype(np.float32)
        mask *= np.float32(1.0 / (1.0 - self.p))
        return x * torch.from_numpy(mask)


class DenseTower(torch.nn.Module):
    """The MLP over [26 x dim deep embeddings | 13 dense features] and the wide bias."""

    def __init__(self, dim, hidden, dropout, seed=0):
        super().__init__()
        self.dim, self.hidden, self.dropout = dim, list(hidden), dropout
        layers, fan_in = [], SLOTS * dim + DENSE
        for i, width in enumerate(hidden):
            linear = torch.nn.Linear(fan_in, width)
            torch.nn.init.xavier_uniform_(linear.weight)
            torch.nn.init.zeros_(linear.bias)
            layers += [linear, torch.nn.ReLU(), Dropout(dropout, [seed, i])]
            fan_in = width
        out = torch.nn.Linear(fan_in, 1)
        torch.nn.init.xavier_uniform_(out.weight)
        torch.nn.init.zeros_(out.bias)
        self.mlp = torch.nn.Sequential(*layers, out)
        self.wide_bias = torch.nn.Parameter(torch.zeros(()))

    def linears(self):
        """The MLP's layers in order (the trainer's dense.bin order)."""
        return [m for m in self.mlp if isinstance(m, torch.nn.Linear)]

    def forward(self, wide, deep, dense):
        x = torch.cat([deep.flatten(1), dense], dim=1)
        return self.mlp(x).squeeze(1) + wide + self.wide_bias


def auc(labels, scores):
    """Exact AUC (ties count one half), NaN for a single class."""
    order = np.argsort(scores, kind="mergesort")
    s, y = scores[order], labels[order]
    _, first, counts = np.unique(s, return_index=True, return_counts=True)
    ranks = np.repeat(first + (counts + 1) / 2.0, counts)  # average 1-based rank per tie group
    pos = y > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def pooled_for_eval(cache, table, keys, dim):
    """Rows of `keys` (B, 26) read from the cache or its store; keys never seen pool as zeros."""
    unique, inverse = np.unique(keys, return_inverse=True)
    rows, found = cache.read(table, unique)
    emb = np.where(found[:, None], rows[:, :dim], 0.0).astype(np.float32)
    return torch.from_numpy(emb[inverse].reshape(keys.shape[0], SLOTS, dim))


def evaluate(cache, tower, shard, args):
    tower.eval()
    labels, scores = [], []
    with torch.no_grad():
        for b in embcache.ShardReader([shard], batch_size=args.batch_size):
            wide = pooled_for_eval(cache, "wide", b["keys"], 1).sum((1, 2))
            deep = pooled_for_eval(cache, "deep", b["keys"], args.dim)
            scores.append(tower(wide, deep, torch.from_numpy(b["dense"])).numpy())
            labels.append(b["labels"])
            if args.eval_max_samples and sum(map(len, labels)) >= args.eval_max_samples:
                break
    tower.train()
    y, s = np.concatenate(labels), np.concatenate(scores).astype(np.float64)
    if args.eval_max_samples:
        y, s = y[:args.eval_max_samples], s[:args.eval_max_samples]
    p = 1.0 / (1.0 + np.exp(-s))
    eps = 1e-7
    logloss = float(-np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps)))
    return auc(y, s), logloss


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", nargs="*", default=[], help="dataset folders, one pass each")
    ap.add_argument("--shards", type=int, default=0,
                    help="train on N shards of each folder (0: all from --first-shard)")
    ap.add_argument("--first-shard", type=int, default=0, help="index of the first shard")
    ap.add_argument("--eval", default="", help="held-out shard")
    ap.add_argument("--eval-max-samples", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--hidden", default="1024,1024")
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.001, help="dense Adam")
    ap.add_argument("--sparse-lr", type=float, default=0.001, help="deep table's Adam")
    ap.add_argument("--capacity", type=int, default=1 << 20, help="cache rows per table")
    ap.add_argument("--copy-staged-rows", action="store_true",
                    help="copy staged rows into the caches at each shard's start instead of "
                         "moving them by index (docs/tuning.md); the same model")
    ap.add_argument("--seed", type=int, default=0, help="seed of the tables' initial rows")
    ap.add_argument("--model-seed", type=int, default=0, help="seed of the MLP and dropout")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--load", default="", help="a save's sparse folder to start the tables from")
    ap.add_argument("--resume", default="",
                    help="a save (this sample's or embcache-train's) to continue from")
    ap.add_argument("--export", default="", help="folder of the incremental exports")
    ap.add_argument("--save", default="",
                    help="save folder in embcache-train's format "
                    "(sparse/, dense.bin, trainer.json)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.model_seed)

    cache = make_cache(args)
    if args.load:
        cache.load(args.load)
    bags = EmbeddingBagCollection(cache)
    hidden = [int(h) for h in args.hidden.split(",") if h]
    tower = DenseTower(args.dim, hidden, args.dropout, args.model_seed)
    opt = torch.optim.Adam(tower.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    config = trainer_config(args, hidden, [])
    state = {"step": 0, "passes_done": 0, "samples": 0, "history": []}
    if args.resume:
        state = trainer_save.load(args.resume, cache, tower, opt, config)
        for bag in bags.bags.values():  # sparse Adam's bias correction runs on from the step
            bag.step = state["step"]
        print(f"resumed {args.resume}: step {state['step']}, {state['passes_done']} passes, "
              f"{state['samples']} samples, dense Adam step {state['adam_step']}", flush=True)

    samples = 0
    for folder in args.train:
        p = state["passes_done"] + 1
        t0, losses, trained = time.perf_counter(), [], 0
        count = len(embcache.dataset_passes(folder)) - args.first_shard
        if count <= 0 or args.shards < 0:
            raise ValueError(f"--first-shard {args.first_shard} --shards {args.shards}: "
                             f"{folder} has {count + args.first_shard} shards")
        take = list(range(args.first_shard, args.first_shard + (args.shards or count)))
        config["passes"].append({"shards": [embcache.dataset_passes(folder)[i][0] for i in take]})
        before = {t: dict(cache.counters["total"].get(t, {})) for t in ("wide", "deep")}
        for _, reader in keyset_passes(cache, folder, batch_size=args.batch_size, shards=take):
            for b in reader:
                keys = torch.from_numpy(b["keys"])
                emb = bags({"wide": keys, "deep": keys})
                logit = tower(emb["wide"].sum((1, 2)), emb["deep"], torch.from_numpy(b["dense"]))
                loss = torch.nn.functional.binary_cross_entropy_with_logits(
                    logit, torch.from_numpy(b["labels"]))
                opt.zero_grad()
                loss.backward()  # also the sparse optimizers, in the cache's rows
                opt.step()
                losses.append(loss.item())
                samples += b["size"]
                trained += b["size"]
        seconds = time.perf_counter() - t0
        line = (f"pass {p}: {folder}: train loss {np.mean(losses):.4f}, "
                f"{trained / seconds:.0f} samples/s")
        a, ll = float("nan"), float("nan")
        if args.eval:
            a, ll = evaluate(cache, tower, args.eval, args)
            line += f", eval AUC {a:.4f}, log loss {ll:.4f}"
        export_path, exported = "", 0
        if args.export:
            export_path = cache.export_incremental_to(args.export)
            with open(os.path.join(export_path, "manifest.json")) as f:
                exported = sum(t["count"] for t in json.load(f)["tables"])
            line += f", export {os.path.basename(export_path)}"
        c = cache.counters["last"]["deep"]
        line += f", last swap: {c['rows_staged']} staged, {c['rows_pushed']} written back"
        if "rows_moved" in c:  # not --copy-staged-rows
            line += f", {c['rows_moved']} moved in"
        print(line, flush=True)
        total = cache.counters["total"]
        moved = {k: sum(total[t].get(k, 0) - before[t].get(k, 0) for t in before)
                 for k in ("rows_pulled", "rows_staged", "rows_pushed", "hits", "misses")}
        lookups = moved["hits"] + moved["misses"]
        state["history"].append({
            "pass": p, "samples": trained, "steps": len(losses),
            "train_loss": float(np.mean(losses)) if losses else float("nan"),
            "eval_auc": a, "eval_logloss": ll, "swap_seconds": float("nan"),
            "rows_in": moved["rows_pulled"] + moved["rows_staged"],
            "rows_out": moved["rows_pushed"],
            "hit_rate": moved["hits"] / lookups if lookups else float("nan"),
            "samples_per_s": trained / seconds, "seconds": seconds,
            "rows_exported": exported, "export_path": export_path})
        state["step"] += len(losses)
        state["samples"] += trained
        state["passes_done"] = p
    if args.eval and not args.train:  # a resumed model scored as it was saved
        a, ll = evaluate(cache, tower, args.eval, args)
        print(f"eval AUC {a:.6f}, log loss {ll:.6f}", flush=True)
    if args.save:
        trainer_save.save(args.save, cache, tower, opt, dict(state, config=config))
        print(f"saved {args.save} ({samples} samples trained, step {state['step']})")


if __name__ == "__main__":
    main()
