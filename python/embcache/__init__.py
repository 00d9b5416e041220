"""embcache from Python: the embedding cache, parameter stores, the training cache, the data
readers, apply_deltas and lookup-only serving (Redis, score_shard), bound from the C++ library
(docs/python.md).

Arrays cross without copies: NumPy arrays through the buffer protocol, torch tensors through
DLPack. Keys are int64 (uint32 for the classes whose name ends in U32), rows float32 (dim
embedding floats, then the optimizer's state). Failures raise subclasses of :class:`Error` whose
message is the C++ status message; a wrong dtype is a TypeError, a wrong shape, layout or memory a
ValueError. Long calls release the GIL.

:mod:`embcache.torch` holds the PyTorch embedding-bag collection (imports torch).
"""

from . import _embcache
from ._embcache import (  # noqa: F401
    BUILT_WITH_CUDA,
    CRITEO_DENSE_COUNT,
    CRITEO_SLOT_COUNT,
    HAVE_REDIS,
    HAVE_ROCKSDB,
    CapacityExceededError,
    CorruptionError,
    EmbeddingBag,
    EmbeddingBagU32,
    EmbeddingCache,
    EmbeddingCacheU32,
    Error,
    HostStore,
    HostStoreU32,
    InternalError,
    InvalidArgumentError,
    IoError,
    LogStore,
    LogStoreU32,
    ModelRows,
    NotFoundError,
    OutOfDeviceMemoryError,
    OutOfHostMemoryError,
    OutOfSpaceError,
    ParamStore,
    ParamStoreU32,
    RowLookup,
    ShardReader,
    TableOptions,
    TableOptionsU32,
    TrainingCache,
    TrainingCacheU32,
    UnsupportedError,
    __version__,
    apply_deltas,
    direct_io_supported,
    owner_of,
    read_dataset_manifest,
    read_keyset,
    read_shard_header,
    write_keyset,
    xxh64,
)

if HAVE_ROCKSDB:
    from ._embcache import RocksDBStore, RocksDBStoreU32  # noqa: F401
if HAVE_REDIS:  # a build with hiredis
    from ._embcache import RedisRows, redis_push, redis_read_model  # noqa: F401
if hasattr(_embcache, "score_shard"):  # a build with the trainer (OpenBLAS)
    from ._embcache import score_shard  # noqa: F401
if hasattr(_embcache, "CudaEmbeddingCache"):  # a build with the cuda space
    from ._embcache import CudaEmbeddingCache  # noqa: F401


def state_width(optimizer: str, dim: int) -> int:
    """Floats of optimizer state per row: sgd 0, adagrad dim, adam 2*dim, ftrl 2*dim."""
    widths = {"sgd": 0, "adagrad": 1, "adam": 2, "ftrl": 2}
    if optimizer not in widths:
        raise ValueError(
            f"optimizer: expected one of 'sgd', 'adagrad', 'adam', 'ftrl', got {optimizer!r}")
    return widths[optimizer] * dim


def dataset_passes(dataset_dir: str):
    """The passes of a dataset folder (embcache-prep, embcache-synth): per shard, in order, a
    tuple (shard path, keyset path, crossed keyset path or None), from its manifest.json."""
    manifest = read_dataset_manifest(dataset_dir)
    return [(s["shard"], s["keyset"], s["crossed_keyset"]) for s in manifest["shards"]]
