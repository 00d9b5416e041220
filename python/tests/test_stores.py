"""HostStore, RocksDBStore and LogStore: the C++ parameter stores from NumPy."""

import os

import numpy as np
import pytest

import embcache
from conftest import runs_without_the_gil


def rows_for(keys, width):
    return (keys[:, None] * 10 + np.arange(width)[None, :]).astype(np.float32)


def check_store_basics(s, width):
    keys = np.array([3, -7, 2**40], dtype=np.int64)
    s.push(keys, rows_for(keys, width))
    assert len(s) == 3 and s.row_width == width
    v = s.max_version
    rows, found, versions = s.pull(np.array([-7, 5, 3], dtype=np.int64))
    assert found.tolist() == [True, False, True]
    np.testing.assert_array_equal(rows[0], rows_for(np.array([-7]), width)[0])
    assert versions[0] == v and versions[2] == v
    assert s.contains(np.array([3, 4], dtype=np.int64)).tolist() == [True, False]
    s.push(np.array([3], dtype=np.int64), np.ones((1, width), np.float32),
           versions=np.array([v + 5], dtype=np.uint64))
    seen = {}
    s.for_each(lambda k, r, ver: seen.update(zip(k.tolist(), ver.tolist())), batch_size=2)
    assert seen == {3: v + 5, -7: v, 2**40: v}
    changed = []
    s.for_each(lambda k, r, ver: changed.extend(k.tolist()), changed_since=v)
    assert changed == [3]
    assert s.erase(np.array([3, 99], dtype=np.int64)) == 1
    assert len(s) == 2


def test_host_store_push_pull_erase_and_scan():
    check_store_basics(embcache.HostStore(table_name="t", row_width=3), 3)


def test_host_store_checkpoint_round_trip_and_corruption(tmp_path):
    s = embcache.HostStore(table_name="t", row_width=2)
    keys = np.arange(100, dtype=np.int64)
    s.push(keys, rows_for(keys, 2))
    s.checkpoint(str(tmp_path / "ck"))
    back = embcache.HostStore.open(str(tmp_path / "ck"), table_name="t", row_width=2)
    rows, found, _ = back.pull(keys)
    assert found.all()
    np.testing.assert_array_equal(rows, rows_for(keys, 2))
    with pytest.raises(embcache.InvalidArgumentError):
        embcache.HostStore.open(str(tmp_path / "ck"), table_name="t", row_width=3)
    with pytest.raises(embcache.NotFoundError):
        embcache.HostStore.open(str(tmp_path / "missing"), table_name="t", row_width=2)
    rows_file = tmp_path / "ck" / "rows.bin"
    data = bytearray(rows_file.read_bytes())
    data[5] ^= 0xFF
    rows_file.write_bytes(bytes(data))
    with pytest.raises(embcache.CorruptionError) as e:
        embcache.HostStore.open(str(tmp_path / "ck"), table_name="t", row_width=2)
    assert "rows.bin" in str(e.value)


def test_store_errors_and_callback_exceptions():
    with pytest.raises(embcache.InvalidArgumentError):
        embcache.HostStore(row_width=0)
    s = embcache.HostStore(row_width=2)
    s.push(np.arange(10, dtype=np.int64), np.zeros((10, 2), np.float32))
    with pytest.raises(ZeroDivisionError):
        s.for_each(lambda k, r, v: 1 / 0)
    with pytest.raises(embcache.InvalidArgumentError, match="batch_size must be > 0"):
        s.for_each(lambda k, r, v: None, batch_size=0)
    with pytest.raises(ValueError, match="versions: expected 10 elements"):
        s.push(np.arange(10, dtype=np.int64), np.zeros((10, 2), np.float32),
               versions=np.zeros(3, np.uint64))


def test_store_calls_release_the_gil():
    s = embcache.HostStore(row_width=16)
    keys = np.arange(1 << 19, dtype=np.int64)
    rows = np.zeros((keys.size, 16), np.float32)
    assert runs_without_the_gil(lambda: s.push(keys, rows))


@pytest.mark.skipif(not embcache.HAVE_ROCKSDB, reason="built without RocksDB")
def test_rocksdb_store_basics_schema_and_reuse(tmp_path):
    path = str(tmp_path / "db")
    s = embcache.RocksDBStore(path, "deep", row_width=12, dim=4, optimizer="adam")
    check_store_basics(s, 12)
    s.flush()
    del s
    with pytest.raises(embcache.InvalidArgumentError) as e:
        embcache.RocksDBStore(path, "deep", row_width=12, dim=4, optimizer="adam")
    assert "deep" in str(e.value)
    with pytest.raises(embcache.InvalidArgumentError) as e:
        embcache.RocksDBStore(path, "deep", row_width=8, dim=4, optimizer="adagrad",
                              existing_rows="reuse")
    assert "deep" in str(e.value)
    again = embcache.RocksDBStore(path, "deep", row_width=12, dim=4, optimizer="adam",
                                  existing_rows="reuse")
    assert len(again) == 2
    with pytest.raises(ValueError, match="existing_rows: expected one of"):
        embcache.RocksDBStore(path, "x", row_width=1, existing_rows="keep")
    with pytest.raises(embcache.NotFoundError):
        embcache.RocksDBStore(os.path.join(path, "none"), "t", row_width=1,
                              create_if_missing=False)


@pytest.mark.skipif(not embcache.HAVE_ROCKSDB, reason="built without RocksDB")
def test_rocksdb_store_read_paths_read_the_same_rows(tmp_path):
    keys = np.arange(0, 40000, 2, dtype=np.int64)
    rows = np.random.default_rng(3).random((keys.size, 6), dtype=np.float32)
    want = np.arange(0, 40000, dtype=np.int64)  # every other key absent
    seen = {}
    for path in ("multi_get", "scan", "automatic"):
        s = embcache.RocksDBStore(str(tmp_path / path), "t", row_width=6, read_path=path)
        s.push(keys, rows)
        s.flush()
        out, found, _ = s.pull(want)
        assert np.array_equal(found, want % 2 == 0)
        assert np.array_equal(out[found], rows)
        c = s.read_counts
        seen[path] = c
        assert c["keys_scanned"] + c["keys_looked_up"] == want.size
    assert seen["multi_get"]["keys_scanned"] == 0
    assert seen["scan"]["keys_looked_up"] == 0
    assert seen["automatic"]["keys_scanned"] == want.size  # dense: scanned
    with pytest.raises(ValueError, match="read_path: expected one of"):
        embcache.RocksDBStore(str(tmp_path / "x"), "t", row_width=1, read_path="fast")


@pytest.mark.skipif(not embcache.HAVE_ROCKSDB, reason="built without RocksDB")
def test_rocksdb_store_block_bytes_sets_the_tables_blocks(tmp_path):
    keys = np.arange(0, 20000, 2, dtype=np.int64)
    rows = np.random.default_rng(4).random((keys.size, 6), dtype=np.float32)
    want = np.arange(0, 20000, dtype=np.int64)
    for block in (1024, 65536):
        db = tmp_path / str(block)
        s = embcache.RocksDBStore(str(db), "t", row_width=6, block_bytes=block)
        s.push(keys, rows)
        s.flush()
        out, found, _ = s.pull(want)
        assert np.array_equal(found, want % 2 == 0)
        assert np.array_equal(out[found], rows)
        del s
        options = max(db.glob("OPTIONS-*")).read_text()
        section = options[options.index('[TableOptions/BlockBasedTable "t"]'):]
        assert f"block_size={block}\n" in section.split("\n[")[0]
    with pytest.raises(embcache.Error, match="block_bytes is 512, expected 0"):
        embcache.RocksDBStore(str(tmp_path / "x"), "t", row_width=1, block_bytes=512)


LOG_RECORD_HEADER_BYTES = 40  # log_store.hpp: each record is a 40-byte header and its row


def log_record_bytes(width):
    return LOG_RECORD_HEADER_BYTES + (width * 4 + 7) // 8 * 8


def test_log_store_basics_schema_reuse_and_lock(tmp_path):
    path = str(tmp_path / "log")
    s = embcache.LogStore(path, "deep", row_width=12, dim=4, optimizer="adam")
    assert isinstance(s, embcache.ParamStore) and s.table_name == "deep"
    check_store_basics(s, 12)
    assert s.live_bytes == 2 * log_record_bytes(12)
    assert s.disk_bytes >= s.live_bytes and s.memory_bytes > 0
    with pytest.raises(embcache.InvalidArgumentError, match="in use"):
        embcache.LogStore(path, "deep", row_width=12)  # the folder is locked while s is open
    s.flush()
    v = s.max_version
    del s
    again = embcache.LogStore(path, "deep", row_width=12, dim=4, optimizer="adam")
    assert len(again) == 2 and again.max_version == v
    rows, found, _ = again.pull(np.array([-7, 2**40, 3], dtype=np.int64))
    assert found.tolist() == [True, True, False]
    np.testing.assert_array_equal(rows[:2], rows_for(np.array([-7, 2**40]), 12))
    del again
    with pytest.raises(embcache.InvalidArgumentError, match="already holds 2 rows"):
        embcache.LogStore(path, "deep", row_width=12, reuse_rows=False)
    with pytest.raises(embcache.InvalidArgumentError,
                       match="row_width 12 in the folder, expected 8"):
        embcache.LogStore(path, "deep", row_width=8)
    with pytest.raises(embcache.InvalidArgumentError, match="adagrad"):
        embcache.LogStore(path, "deep", row_width=12, dim=4, optimizer="adagrad")
    with pytest.raises(embcache.NotFoundError, match="wide"):
        embcache.LogStore(path, "wide", row_width=12)
    with pytest.raises(embcache.NotFoundError):
        embcache.LogStore(str(tmp_path / "none"), "t", row_width=1, create_if_missing=False)
    assert not (tmp_path / "none").exists()
    fresh = embcache.LogStore(str(tmp_path / "fresh"), "t", row_width=2, reuse_rows=False)
    assert len(fresh) == 0  # an empty folder is no old rows


@pytest.mark.parametrize("field, value", [
    ("max_space_amplification", 1.0),
    ("segment_bytes", 1024),
    ("read_threads", 0),
    ("expected_rows", 2**41),
])
def test_log_store_bad_option_is_named(tmp_path, field, value):
    with pytest.raises(embcache.InvalidArgumentError, match=f"log_store_options.{field}: "):
        embcache.LogStore(str(tmp_path / "log"), "t", row_width=4, **{field: value})
    assert not (tmp_path / "log").exists()


def test_log_store_options_default_to_the_libraries():
    doc = embcache.LogStore.__init__.__doc__
    for default in ("dim: int = 0", "optimizer: str = ''", "create_if_missing: bool = True",
                    "reuse_rows: bool = True", f"segment_bytes: int = {256 << 20}",
                    "max_space_amplification: float = 2.0", "read_threads: int = 8",
                    "direct_io: bool = False", "expected_rows: int = 0"):
        assert default in doc
    with pytest.raises(embcache.InvalidArgumentError, match="row_width: 0"):
        embcache.LogStore("unused", "t", row_width=0)


def test_log_store_checkpoint_reopens_as_a_log_store(tmp_path):
    s = embcache.LogStore(str(tmp_path / "log"), "t", row_width=5, expected_rows=1000)
    keys = np.arange(1000, dtype=np.int64) * 7 - 300
    s.push(keys, rows_for(keys, 5))
    gone = np.ascontiguousarray(keys[::3])
    assert s.erase(gone) == gone.size
    s.checkpoint(str(tmp_path / "ck"))
    kept = np.setdiff1d(keys, gone)
    back = embcache.LogStore(str(tmp_path / "ck"), "t", row_width=5, create_if_missing=False)
    assert len(back) == kept.size and back.max_version == s.max_version
    assert back.live_bytes == kept.size * log_record_bytes(5)
    seen = {}

    def visit(k, r, v):
        for key, row in zip(k.tolist(), r):
            seen[key] = row.copy()

    back.for_each(visit, batch_size=100)
    assert sorted(seen) == kept.tolist()
    np.testing.assert_array_equal(np.stack([seen[k] for k in kept.tolist()]), rows_for(kept, 5))
    rows, found, _ = back.pull(keys)
    assert np.array_equal(found, np.isin(keys, kept))
    np.testing.assert_array_equal(rows[found], rows_for(kept, 5))
    c = back.counters
    assert c["rows_pulled"] == kept.size and c["reads"] >= 1
    assert c["bytes_read"] >= kept.size * log_record_bytes(5)


def test_log_store_cleans_its_oldest_segments(tmp_path):
    width, n, segment = 64, 2000, 1 << 20
    s = embcache.LogStore(str(tmp_path / "log"), "t", row_width=width, segment_bytes=segment,
                          max_space_amplification=1.5)
    cold = np.arange(n, 2 * n, dtype=np.int64)  # written once: cleaning rewrites them
    s.push(cold, np.full((n, width), -1, np.float32))
    keys = np.arange(n, dtype=np.int64)
    for i in range(20):  # each round overwrites every hot row
        s.push(keys, np.full((n, width), i, np.float32))
    c = s.counters
    assert set(c) == {"rows_pulled", "reads", "bytes_read", "bytes_appended", "bytes_cleaned",
                      "segments_cleaned"}
    assert c["bytes_appended"] >= 21 * n * log_record_bytes(width)
    assert c["segments_cleaned"] > 0
    assert n * log_record_bytes(width) <= c["bytes_cleaned"] < c["bytes_appended"]
    assert s.live_bytes == 2 * n * log_record_bytes(width)
    assert s.disk_bytes <= 1.5 * s.live_bytes + 2 * segment
    rows, found, _ = s.pull(np.concatenate([keys, cold]))
    assert found.all() and (rows[:n] == 19).all() and (rows[n:] == -1).all()


def test_log_store_direct_io(tmp_path):
    if not embcache.direct_io_supported(str(tmp_path)):
        pytest.skip(f"{tmp_path}'s file system does not accept O_DIRECT")
    path = str(tmp_path / "log")
    s = embcache.LogStore(path, "t", row_width=3, direct_io=True, read_threads=2)
    check_store_basics(s, 3)
    s.flush()
    del s
    again = embcache.LogStore(path, "t", row_width=3, direct_io=True)
    rows, found, _ = again.pull(np.array([-7, 2**40], dtype=np.int64))
    assert found.all()
    np.testing.assert_array_equal(rows, rows_for(np.array([-7, 2**40]), 3))
    assert again.counters["bytes_read"] % 4096 == 0  # whole 4 KiB blocks
    del again
    plain = embcache.LogStore(path, "t", row_width=3)  # the same folder without O_DIRECT
    assert len(plain) == 2


def test_direct_io_supported_probes_the_nearest_existing_folder(tmp_path):
    assert embcache.direct_io_supported(str(tmp_path / "not" / "yet")) == \
        embcache.direct_io_supported(str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_log_store_u32_keys_and_calls_release_the_gil(tmp_path):
    s = embcache.LogStoreU32(str(tmp_path / "log"), "t", row_width=2)
    assert isinstance(s, embcache.ParamStoreU32) and s.key_dtype == "uint32"
    big = np.array([1, 4_000_000_000, 2**32 - 1], dtype=np.uint32)
    s.push(big, np.arange(6, dtype=np.float32).reshape(3, 2))
    rows, found, _ = s.pull(np.array([2**32 - 1, 5], np.uint32))
    assert found.tolist() == [True, False] and rows[0].tolist() == [4, 5]
    with pytest.raises(TypeError, match="keys: expected uint32 elements, got int64"):
        s.pull(np.array([1], np.int64))
    keys = np.arange(1 << 17, dtype=np.uint32)
    block = np.zeros((keys.size, 2), np.float32)
    assert runs_without_the_gil(lambda: s.push(keys, block))


def test_log_store_under_a_training_cache(tmp_path):
    store = embcache.LogStore(str(tmp_path / "log"), "deep", row_width=8, dim=4,
                              optimizer="adagrad")
    tc = embcache.TrainingCache([embcache.TableOptions(
        "deep", dim=4, capacity=64, optimizer={"kind": "adagrad"}, store=store)])
    keys = np.array([5, -1, 2**40], np.int64)
    tc.begin_pass([keys])
    rows = np.arange(24, dtype=np.float32).reshape(3, 8)
    tc.assign("deep", keys, rows)
    tc.begin_pass([np.array([9], np.int64)])  # the rows leave for the store
    tc.end_training()  # writes the resident rows back and flushes the store
    got, found, _ = store.pull(keys)
    assert found.all() and np.array_equal(got, rows)


def test_calls_from_threads_on_one_store_neither_overlap_nor_deadlock():
    import threading
    s = embcache.HostStore(row_width=4)
    keys = np.arange(50000, dtype=np.int64)
    s.push(keys, np.zeros((keys.size, 4), np.float32))
    seen = []

    def scan():  # its callback takes the GIL back while the store's lock is held
        for _ in range(3):
            s.for_each(lambda k, r, v: seen.append(len(k)), batch_size=10000)

    def writer():
        for i in range(20):
            s.push(keys[:1000], np.full((1000, 4), i, np.float32))
            assert len(s) == 50000

    threads = [threading.Thread(target=scan), threading.Thread(target=writer),
               threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    assert sum(seen) == 3 * 50000
