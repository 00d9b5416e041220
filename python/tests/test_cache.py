"""EmbeddingCache: the C++ embedding_cache<int64, host_space> from NumPy and torch."""

import numpy as np
import pytest

import embcache
from conftest import runs_without_the_gil


def make_cache(**kw):
    args = dict(slots=1024, dim=4, state_width=2, seed=7)
    args.update(kw)
    return embcache.EmbeddingCache(**args)


def test_find_or_insert_then_find_returns_the_same_rows():
    c = make_cache()
    keys = np.array([5, -1, 2**62, 5], dtype=np.int64)
    rows, inserted = c.find_or_insert(keys)
    assert rows.shape == (4, 6) and rows.dtype == np.float32
    assert inserted.tolist().count(True) == 3  # the repeated key is inserted once
    np.testing.assert_array_equal(rows[0], rows[3])
    assert np.all(rows[:, 4:] == 0)  # the state starts at state_value
    found_rows, found = c.find(np.array([2**62, 9], dtype=np.int64))
    assert found.tolist() == [True, False]
    np.testing.assert_array_equal(found_rows[0], rows[2])
    assert len(c) == 3 and c.size == 3 and c.row_width == 6 and c.dim == 4


def test_initial_rows_depend_on_seed_and_key_only():
    a = make_cache()
    b = make_cache(slots=4096)
    keys = np.arange(100, dtype=np.int64)
    ra, _ = a.find_or_insert(keys)
    rb, _ = b.find_or_insert(keys[::-1].copy())
    np.testing.assert_array_equal(ra, rb[::-1])
    rc, _ = make_cache(seed=8).find_or_insert(keys)
    assert not np.array_equal(ra, rc)


def test_rows_view_shares_memory_with_the_cache():
    c = make_cache()
    keys = np.array([1, 2, 3], dtype=np.int64)
    slots = c.lookup_slots(keys, insert_missing=True)
    assert slots.dtype == np.int64 and np.all(slots >= 0)
    view = c.rows
    assert view.shape == (c.slots, 6)
    before = c.version
    view[slots[1], :4] = 42.0
    c.mark_updated(slots[1:2])
    assert c.version > before
    rows, found = c.find(keys)
    assert found.all() and np.all(rows[1, :4] == 42.0)
    keys_out, rows_out, versions = c.export(changed_since=before)
    assert keys_out.tolist() == [2] and np.all(rows_out[0, :4] == 42.0)
    assert versions[0] > before


def test_insert_or_assign_erase_and_full_export_sorted_by_key():
    c = make_cache()
    keys = np.array([30, 10, 20], dtype=np.int64)
    rows = np.arange(18, dtype=np.float32).reshape(3, 6)
    c.insert_or_assign(keys, rows, versions=np.array([3, 1, 2], dtype=np.uint64))
    k, r, v = c.export()
    assert k.tolist() == [10, 20, 30]
    np.testing.assert_array_equal(r, rows[[1, 2, 0]])
    assert v.tolist() == [1, 2, 3]
    assert c.erase(np.array([10, 99], dtype=np.int64)) == 1
    slots = c.lookup_slots(np.array([10, 20], dtype=np.int64))
    assert slots[0] == -1 and slots[1] >= 0
    np.testing.assert_array_equal(c.read_slots(slots[1:]), rows[2:3])


def test_output_arrays_are_written_in_place():
    c = make_cache()
    out = np.zeros((2, 6), dtype=np.float32)
    result, _ = c.find_or_insert(np.array([1, 2], dtype=np.int64), out=out)
    assert result is out and np.any(out != 0)


@pytest.mark.parametrize(
    "keys, error, message",
    [
        (np.array([1.0, 2.0]), TypeError, "keys: expected int64 elements, got float64"),
        (np.array([1, 2], dtype=np.int32), TypeError, "keys: expected int64 elements, got int32"),
        ([1, 2], TypeError, "keys: expected a NumPy array or a tensor"),
        (np.zeros((2, 2), dtype=np.int64), ValueError, "keys: expected a 1-d array, got shape (2, 2)"),
        (np.arange(10, dtype=np.int64)[::2], ValueError, "keys: expected a C-contiguous array"),
    ],
)


def test_bad_key_arrays_are_clear_errors(keys, error, message):
    c = make_cache()
    with pytest.raises(error) as e:
        c.find_or_insert(keys)
    assert message in str(e.value)


def test_bad_output_and_row_arrays_are_clear_errors():
    c = make_cache()
    keys = np.array([1, 2], dtype=np.int64)
    ro = np.zeros((2, 6), dtype=np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="out: the array is read-only"):
        c.find(keys, out=ro)
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 6\), got \(2, 5\)"):
        c.find(keys, out=np.zeros((2, 5), dtype=np.float32))
    with pytest.raises(ValueError, match=r"rows: expected shape \(2, 6\) or 12 flat elements"):
        c.insert_or_assign(keys, np.zeros((2, 4), dtype=np.float32))
    with pytest.raises(ValueError, match=r"slots\[0\]: 99999 is not a slot of the cache"):
        c.read_slots(np.array([99999], dtype=np.int64))


def test_a_full_table_raises_capacity_exceeded_naming_the_keys():
    c = embcache.EmbeddingCache(slots=128, dim=2)
    with pytest.raises(embcache.CapacityExceededError) as e:
        c.find_or_insert(np.arange(1000, dtype=np.int64))
    assert isinstance(e.value, embcache.Error)
    assert e.value.code == "capacity_exceeded"
    assert "did not fit" in str(e.value) or "no room" in str(e.value), str(e.value)


def test_bad_options_raise_invalid_argument():
    with pytest.raises(embcache.InvalidArgumentError) as e:
        embcache.EmbeddingCache(slots=0, dim=4)
    assert isinstance(e.value, ValueError)
    assert "slots" in str(e.value)
    with pytest.raises(ValueError, match="init: expected one of"):
        embcache.EmbeddingCache(slots=128, dim=4, init="zeros")


def test_bulk_calls_release_the_gil():
    c = embcache.EmbeddingCache(slots=1 << 19, dim=8)
    keys = np.arange(1 << 18, dtype=np.int64)
    assert runs_without_the_gil(lambda: c.find_or_insert(keys))


def test_the_gil_check_sees_a_call_that_keeps_the_gil():
    # A pure Python loop never releases the GIL (the switch interval is raised): the check fails.
    assert not runs_without_the_gil(lambda: sum(range(100000)), repeats=5)


def test_concurrent_inserts_from_threads_agree():
    import threading
    c = embcache.EmbeddingCache(slots=1 << 16, dim=4)
    keys = np.arange(20000, dtype=np.int64)
    results = [None] * 4

    def work(i):
        results[i] = c.find_or_insert(keys)[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(c) == 20000
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
