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
the rows changed in the pass (--export) and, at the end, saves the tables (--save: DIR/sparse, the
format embcache-train's saves hold, plus DIR/dense.pt for the torch part).
"""

import argparse
import os
import time

import numpy as np
import torch

import embcache
from embcache.torch import EmbeddingBagCollection, keyset_passes

SLOTS = embcache.CRITEO_SLOT_COUNT
DENSE = embcache.CRITEO_DENSE_COUNT


def make_cache(args):
    """The trainer's two tables (docs/trainer.md defaults)."""
    wide = embcache.TableOptions(
        "wide", dim=1, capacity=args.capacity, init_scale=0.0, seed=args.seed,
        optimizer={"kind": "ftrl", "ftrl_alpha": 0.05, "ftrl_initial_accumulator": 1.0})
    deep = embcache.TableOptions(
        "deep", dim=args.dim, capacity=args.capacity, init_scale=0.01, seed=args.seed,
        optimizer={"kind": "adam", "learning_rate": args.sparse_lr})
    return embcache.TrainingCache([wide, deep])


class DenseTower(torch.nn.Module):
    """The MLP over [26 x dim deep embeddings | 13 dense features] and the wide bias."""

    def __init__(self, dim, hidden, dropout):
        super().__init__()
        layers, fan_in = [], SLOTS * dim + DENSE
        for width in hidden:
            linear = torch.nn.Linear(fan_in, width)
            torch.nn.init.xavier_uniform_(linear.weight)
            torch.nn.init.zeros_(linear.bias)
            layers += [linear, torch.nn.ReLU(), torch.nn.Dropout(dropout)]
            fan_in = width
        out = torch.nn.Linear(fan_in, 1)
        torch.nn.init.xavier_uniform_(out.weight)
        torch.nn.init.zeros_(out.bias)
        self.mlp = torch.nn.Sequential(*layers, out)
        self.wide_bias = torch.nn.Parameter(torch.zeros(()))

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", nargs="+", required=True, help="dataset folders, one pass each")
    ap.add_argument("--shards", type=int, default=0,
                    help="train on the first N shards of each folder (0: all)")
    ap.add_argument("--eval", default="", help="held-out shard")
    ap.add_argument("--eval-max-samples", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--hidden", default="1024,1024")
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.001, help="dense Adam")
    ap.add_argument("--sparse-lr", type=float, default=0.001, help="deep table's Adam")
    ap.add_argument("--capacity", type=int, default=1 << 20, help="cache rows per table")
    ap.add_argument("--seed", type=int, default=0, help="seed of the tables' initial rows")
    ap.add_argument("--model-seed", type=int, default=0, help="seed of the MLP and dropout")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--load", default="", help="a save's sparse folder to start the tables from")
    ap.add_argument("--export", default="", help="folder of the incremental exports")
    ap.add_argument("--save", default="", help="save folder (sparse/ and dense.pt)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.model_seed)

    cache = make_cache(args)
    if args.load:
        cache.load(args.load)
    bags = EmbeddingBagCollection(cache)
    hidden = [int(h) for h in args.hidden.split(",") if h]
    tower = DenseTower(args.dim, hidden, args.dropout)
    opt = torch.optim.Adam(tower.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8)

    samples = 0
    for p, folder in enumerate(args.train, 1):
        t0, losses = time.perf_counter(), []
        take = list(range(args.shards)) if args.shards else None
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
        seconds = time.perf_counter() - t0
        line = (f"pass {p}: {folder}: train loss {np.mean(losses):.4f}, "
                f"{len(losses) * args.batch_size / seconds:.0f} samples/s")
        if args.eval:
            a, ll = evaluate(cache, tower, args.eval, args)
            line += f", eval AUC {a:.4f}, log loss {ll:.4f}"
        if args.export:
            line += f", export {os.path.basename(cache.export_incremental_to(args.export))}"
        c = cache.counters["last"]["deep"]
        line += f", last swap: {c['rows_staged']} staged, {c['rows_pushed']} written back"
        print(line, flush=True)
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        cache.save(os.path.join(args.save, "sparse"))
        torch.save(tower.state_dict(), os.path.join(args.save, "dense.pt"))
        print(f"saved {args.save} ({samples} samples trained)")


if __name__ == "__main__":
    main()
