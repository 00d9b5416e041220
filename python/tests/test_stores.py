"""HostStore and RocksDBStore: the C++ parameter stores from NumPy."""

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
