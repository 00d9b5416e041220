"""PyTorch front end: an embedding-bag collection whose rows live in a :class:`TrainingCache`.

The rows (embedding and sparse-optimizer state) stay in the cache's memory: the forward pools
them (sum or mean) into a tensor that shares the result's memory, and the backward applies each
table's sparse optimizer to the rows of the batch in place (C++ aggregate_gradients,
apply_optimizer, mark_updated), as the C++ trainer does. The dense part of a model trains with any
torch optimizer; the embeddings need none.

Passes: :func:`keyset_passes` walks a dataset folder shard by shard, bringing the cache in line
with each shard's keyset (``begin_pass_files``) and staging the next shard's rows in the cache's
background thread (``prefetch_files``) while the Python loop trains on the current one.
"""

from typing import Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from . import EmbeddingBag, EmbeddingBagU32, ShardReader, TrainingCache, dataset_passes

__all__ = ["EmbeddingBagCollection", "keyset_passes"]


class _PoolFunction(torch.autograd.Function):
    """Pools one table's bags; its backward is the in-row optimizer step of that table."""

    @staticmethod
    def forward(ctx, anchor, bag, keys, offsets, num_slots):  # noqa: D401
        ctx.bag = bag
        pooled = bag.forward(keys, offsets, num_slots=num_slots)
        return torch.from_numpy(pooled)

    @staticmethod
    def backward(ctx, grad):
        ctx.bag.backward(grad.detach().contiguous())
        return None, None, None, None, None


def _as_keys(keys) -> Union[np.ndarray, torch.Tensor]:
    if isinstance(keys, torch.Tensor):
        if keys.dtype != torch.int64:
            raise TypeError(f"keys: expected int64 elements, got {keys.dtype}")
        return keys.detach()
    return keys


class EmbeddingBagCollection(torch.nn.Module):
    """Embedding bags over the tables of a :class:`TrainingCache`.

    ``forward(features)`` takes a mapping from table name to either a 2-d int64 tensor (batch,
    slots) with one key per slot, pooled to (batch, slots, dim), or a pair (keys, offsets) in CSR
    form (``offsets``: num_bags + 1 entries), pooled to (num_bags, dim), or a triple (keys,
    offsets, num_slots) whose bags are sample-major over num_slots feature slots (bag b is slot
    b % num_slots). It returns a dict of pooled float32 tensors. When the loss's backward reaches
    them, each table's sparse optimizer (the cache's table options) updates the rows of that batch
    in place; a forward without a backward (evaluation) changes nothing.

    In keyset mode every key of a batch must be in the current pass's keyset (NotFoundError
    naming the key otherwise; with the table's admission on, such a key is one the pass refused);
    in on-demand mode misses are fetched per batch. A key that the table's admission refused has
    no row: it pools as zeros, or with admission's ``default_row`` 'slot' as its feature slot's
    default row (``TrainingCache.default_row``; the slot of a 2-d batch's column s is s, of a
    CSR pair's bags 0), and gets no gradient.

    Over a :class:`TrainingCacheU32` the keys are uint32 NumPy arrays (torch 1.13 has no uint32
    tensors); the pooled results are tensors all the same.
    """

    def __init__(self, cache: TrainingCache, tables: Optional[Sequence[str]] = None,
                 mode: str = "sum"):
        super().__init__()
        self.cache = cache
        names = list(tables) if tables is not None else list(cache.table_names)
        bag = EmbeddingBagU32 if cache.key_dtype == "uint32" else EmbeddingBag
        self.bags: Dict[str, EmbeddingBag] = {n: bag(cache, n, mode) for n in names}
        self.mode = mode
        # Gives autograd a leaf to reach the pooling's backward through; never updated.
        self._anchor = torch.zeros(0, requires_grad=True)

    def dim(self, table: str) -> int:
        """Embedding floats per row of `table`."""
        return self.bags[table].dim

    def forward(self, features: Mapping[str, object]) -> Dict[str, torch.Tensor]:
        out = {}
        for name, value in features.items():
            if name not in self.bags:
                raise KeyError(f"features: no table {name!r} in the collection "
                               f"({', '.join(self.bags)})")
            bag = self.bags[name]
            if isinstance(value, tuple):
                if len(value) not in (2, 3):
                    raise ValueError(f"features[{name!r}]: expected (keys, offsets) or (keys, "
                                     f"offsets, num_slots), got a tuple of {len(value)}")
                keys, offsets = value[0], value[1]
                num_slots = int(value[2]) if len(value) == 3 else 1
                out[name] = self._pool(bag, _as_keys(keys), _as_keys(offsets), num_slots)
            else:
                keys = _as_keys(value)
                if keys.ndim != 2:
                    raise ValueError(f"features[{name!r}]: expected a 2-d (batch, slots) array "
                                     f"of keys or a (keys, offsets) pair, got {keys.ndim}-d")
                batch, slots = keys.shape
                flat = keys.reshape(-1)
                pooled = self._pool(bag, flat, None, max(slots, 1))
                out[name] = pooled.view(batch, slots, bag.dim)
        return out

    def _pool(self, bag, keys, offsets, num_slots):
        if torch.is_grad_enabled():
            return _PoolFunction.apply(self._anchor, bag, keys, offsets, num_slots)
        return torch.from_numpy(bag.forward(keys, offsets, num_slots=num_slots))


def keyset_passes(cache: TrainingCache, dataset_dir: str, batch_size: int = 1024,
                  keysets: Optional[Sequence[str]] = None, shuffle: bool = False,
                  seed: int = 0, drop_last: bool = False,
                  shards: Optional[Sequence[int]] = None) -> Iterator[Tuple[int, ShardReader]]:
    """Yields (shard index, ShardReader of that shard) for each shard of `dataset_dir`, after
    ``begin_pass_files`` made its keyset resident in every table and with the next shard's rows
    being staged in the background (``prefetch_files``) while the caller trains.

    `keysets` says which keyset feeds each table, per table in cache order: 'slot' (the shard's
    slot keys, the default for every table) or 'crossed' (its crossed keys). `shards`: the
    indices of the shards to take, in that order (default: all of them).
    """
    every = dataset_passes(dataset_dir)
    if shards is None:
        shards = every
    else:
        for i in shards:
            if not 0 <= i < len(every):
                raise IndexError(f"shards: {i} is not a shard of {dataset_dir!r} "
                                 f"({len(every)} shards)")
        shards = [every[i] for i in shards]
    kinds = list(keysets) if keysets is not None else ["slot"] * cache.num_tables
    if len(kinds) != cache.num_tables:
        raise ValueError(f"keysets: expected {cache.num_tables} entries (one per table), "
                         f"got {len(kinds)}")

    def paths(i):
        shard, slot_keys, crossed_keys = shards[i]
        out = []
        for t, kind in enumerate(kinds):
            if kind == "slot":
                out.append(slot_keys)
            elif kind == "crossed":
                if crossed_keys is None:
                    raise ValueError(f"keysets[{t}]: the dataset has no crossed keysets")
                out.append(crossed_keys)
            else:
                raise ValueError(f"keysets[{t}]: expected 'slot' or 'crossed', got {kind!r}")
        return out

    for i, (shard, _, _) in enumerate(shards):
        cache.begin_pass_files(paths(i))
        if i + 1 < len(shards):
            cache.prefetch_files(paths(i + 1))
        yield i, ShardReader([shard], batch_size=batch_size, shuffle=shuffle, seed=seed,
                             drop_last=drop_last)
