"""TrainingCache: keyset passes with prefetch, on-demand lookups, export, save and load."""

import threading

import numpy as np
import pytest

import embcache
from conftest import runs_without_the_gil


def tables(capacity=256, store=None):
    return [
        embcache.TableOptions("wide", dim=1, capacity=capacity),
        embcache.TableOptions("deep", dim=4, capacity=capacity,
                              optimizer={"kind": "adagrad", "learning_rate": 0.1}, store=store),
    ]


def keys(lo, hi):
    return np.arange(lo, hi, dtype=np.int64)


def test_table_options_and_names():
    tc = embcache.TrainingCache(tables())
    assert tc.num_tables == 2 and tc.table_names == ["wide", "deep"]
    assert tc.table_index("deep") == 1
    assert tc.row_width("deep") == 8 and tc.row_width(0) == 1
    t = tc.table("deep")
    assert t.optimizer["kind"] == "adagrad" and t.state_width == 4
    assert t.optimizer["learning_rate"] == pytest.approx(0.1)
    with pytest.raises(embcache.NotFoundError):
        tc.table_index("nope")
    with pytest.raises(KeyError):
        tc.row_width("nope")
    with pytest.raises(IndexError):
        tc.row_width(2)
    with pytest.raises(ValueError, match="optimizer: unknown field 'lr'"):
        embcache.TableOptions("x", dim=1, capacity=1, optimizer={"lr": 1})
    with pytest.raises(embcache.InvalidArgumentError):
        embcache.TrainingCache([embcache.TableOptions("a", dim=1, capacity=8)] * 2)


def test_keyset_passes_with_prefetch_export_and_counters():
    tc = embcache.TrainingCache(tables())
    tc.begin_pass([keys(0, 200), keys(0, 200)])
    tc.prefetch([keys(100, 300), keys(100, 300)])
    assert tc.prefetch_pending
    slots = tc.lookup_slots("deep", keys(0, 10))
    assert np.all(slots >= 0)
    assert tc.lookup_slots("deep", keys(250, 251))[0] == -1
    rows = tc.row_pool("deep")  # by row: the row a slot holds is row_indices() (rows move)
    rows[tc.row_indices("deep", slots), :4] += 1.0
    tc.mark_updated("deep", slots)
    tc.begin_pass([keys(100, 300), keys(100, 300)])
    c = tc.counters
    assert c["passes"] == 2 and c["tables"] == ["wide", "deep"]
    assert c["total"]["deep"]["rows_initialized"] == 300
    assert c["last"]["deep"]["hits"] + c["last"]["deep"]["misses"] == 200
    assert set(c["last"]["deep"]) >= {"rows_staged", "rows_pushed", "seconds_swap_in"}
    deltas = tc.export_incremental(with_state=True)
    deep = next(d for d in deltas if d["table"] == "deep")
    assert deep["dim"] == 4 and deep["state_width"] == 4
    assert deep["vectors"].shape == (deep["keys"].size, 4)
    assert deep["states"].shape == (deep["keys"].size, 4)
    # Rows updated in place are in the export, with their new values.
    assert set(keys(0, 10).tolist()) <= set(deep["keys"].tolist())
    got, found = tc.read("deep", keys(0, 10))
    assert found.all()
    idx = np.searchsorted(deep["keys"], keys(0, 10))
    np.testing.assert_array_equal(deep["vectors"][idx], got[:, :4])
    assert len(tc.export_incremental()[1]["keys"]) == 0


def test_keyset_mode_errors_name_what_is_wrong():
    tc = embcache.TrainingCache(tables())
    with pytest.raises(embcache.CapacityExceededError) as e:
        tc.begin_pass([keys(0, 10), keys(0, 1000)])
    assert "deep" in str(e.value)
    with pytest.raises(embcache.InvalidArgumentError):
        tc.begin_pass([keys(0, 10)])
    with pytest.raises(TypeError, match=r"keysets\[1\]: expected int64 elements, got float64"):
        tc.begin_pass([keys(0, 10), np.zeros(3)])
    with pytest.raises(embcache.Error):
        tc.lookup("deep", keys(0, 3))  # on-demand only
    with pytest.raises(embcache.NotFoundError) as e:
        tc.begin_pass_files(["/nonexistent/a.keys", "/nonexistent/b.keys"])
    assert "/nonexistent/a.keys" in str(e.value)
    tc.begin_pass([keys(0, 10), keys(0, 10)])
    with pytest.raises(embcache.NotFoundError):
        tc.assign("deep", keys(50, 51), np.zeros((1, 8), np.float32))


def test_on_demand_lookup_and_rows_view():
    tc = embcache.TrainingCache(tables(capacity=128), mode="on_demand")
    assert tc.mode == "on_demand"
    slots = tc.lookup("deep", keys(0, 100))
    view = tc.row_pool("deep")  # on demand no rows move: the row of slot s is row s
    got, found = tc.read("deep", keys(0, 100))
    np.testing.assert_array_equal(view[slots], got)
    for lo in (1000, 2000, 3000):  # more rows than the table's 256 slots: evictions to the store
        assert np.all(tc.lookup(1, keys(lo, lo + 100)) >= 0)
    again, found = tc.read("deep", keys(0, 100))
    assert found.all()
    np.testing.assert_array_equal(again, got)
    assert tc.counters["total"]["deep"]["rows_evicted"] > 0
    with pytest.raises(embcache.CapacityExceededError):
        tc.lookup("deep", keys(0, 1000))


def test_save_load_round_trip_and_erase(tmp_path):
    tc = embcache.TrainingCache(tables())
    tc.begin_pass([keys(0, 200), keys(0, 200)])
    tc.assign("deep", keys(0, 2), np.full((2, 8), 0.5, np.float32))
    tc.erase("deep", keys(2, 3))
    tc.set_slot_ids("deep", keys(0, 200), np.full(200, 7, np.uint64))
    assert tc.slot_id("deep", 5) == 7
    progress = []
    tc.save(str(tmp_path / "save"), on_progress=lambda done, total: progress.append((done, total)))
    assert progress[0][0] == 0 and progress[-1][0] == progress[-1][1]
    back = embcache.TrainingCache(tables())
    back.load(str(tmp_path / "save"))
    assert back.run_id == tc.run_id
    for t in ("wide", "deep"):
        a, fa = tc.read(t, keys(0, 200))
        b, fb = back.read(t, keys(0, 200))
        np.testing.assert_array_equal(fa, fb)
        np.testing.assert_array_equal(a[fa], b[fb])
    assert back.read("deep", keys(2, 3))[1].tolist() == [False]
    with pytest.raises(embcache.NotFoundError) as e:
        back.load(str(tmp_path / "missing"))
    assert "missing' does not exist" in str(e.value)
    emb = tmp_path / "save" / "deep" / "emb_vector"
    data = bytearray(emb.read_bytes())
    data[0] ^= 0x01
    emb.write_bytes(bytes(data))
    with pytest.raises(embcache.CorruptionError) as e:
        back.load(str(tmp_path / "save"))
    assert "emb_vector" in str(e.value)


def test_admission_refuses_keys_until_their_second_sighting(tmp_path):
    admission = {"min_count": 2, "sketch_width": 4096, "seed": 3}
    t = embcache.TableOptions("deep", dim=4, capacity=64, admission=admission)
    assert t.admission["min_count"] == 2 and t.admission["sketch_width"] == 4096
    assert t.expiry == {"ttl_passes": 0, "ttl_steps": 0, "min_l2_norm": 0.0}
    assert t.admission["default_row"] == "zeros"
    tc = embcache.TrainingCache([t], mode="on_demand")
    assert tc.lookup("deep", keys(0, 10)).tolist() == [-1] * 10  # first sighting: refused
    c = tc.counters["last"]["deep"]
    assert c["keys_refused"] == 10 and c["keys_admitted"] == 0
    assert np.all(tc.lookup("deep", keys(0, 5)) >= 0)  # second sighting: admitted, rows made
    assert tc.counters["last"]["deep"]["keys_admitted"] == 5
    tc.save(str(tmp_path / "save"))
    assert (tmp_path / "save" / "deep" / "admission").exists()
    with pytest.raises(ValueError, match="admission: unknown field 'min'"):
        embcache.TableOptions("x", dim=1, capacity=1, admission={"min": 2})
    with pytest.raises(TypeError, match="admission.min_count: expected an int >= 0"):
        embcache.TableOptions("x", dim=1, capacity=1, admission={"min_count": -1})
    with pytest.raises(embcache.InvalidArgumentError, match="probability"):
        embcache.TrainingCache([embcache.TableOptions("x", dim=1, capacity=1,
                                                      admission={"probability": 2.0})])


def test_expiry_removes_untouched_rows_as_tombstones_of_the_next_export():
    t = embcache.TableOptions("deep", dim=4, capacity=64, expiry={"ttl_passes": 1})
    assert t.expiry["ttl_passes"] == 1
    tc = embcache.TrainingCache([t], mode="on_demand")
    tc.expire()  # boundary 1
    tc.lookup("deep", keys(0, 10))
    tc.export_incremental()
    tc.expire()  # boundary 2: rows 0-9 were touched in pass 1
    tc.lookup("deep", keys(0, 5))
    slots = tc.lookup_slots("deep", keys(0, 5))
    tc.mark_updated("deep", slots)  # rows 0-4 touched in pass 2, 5-9 not
    tc.expire()  # boundary 3: rows 5-9 untouched for one pass
    assert tc.counters["last"]["deep"]["rows_expired"] == 5
    erased = tc.export_incremental()[0]["erased"]
    assert sorted(erased.tolist()) == list(range(5, 10))
    assert tc.read("deep", keys(5, 10))[1].tolist() == [False] * 5
    with pytest.raises(ValueError, match="expiry: unknown field 'ttl'"):
        embcache.TableOptions("x", dim=1, capacity=1, expiry={"ttl": 1})
    with pytest.raises(TypeError, match="expiry: expected a dict or None"):
        embcache.TableOptions("x", dim=1, capacity=1, expiry=3)


def test_refused_keys_read_their_slots_default_row_when_asked():
    slot_rows = {"min_count": 2, "default_row": "slot"}
    t = embcache.TableOptions("deep", dim=4, capacity=64, admission=slot_rows)
    z = embcache.TableOptions("wide", dim=4, capacity=64, admission={"min_count": 2})
    assert t.admission["default_row"] == "slot"
    tc = embcache.TrainingCache([t, z], mode="on_demand")
    r3 = tc.default_row("deep", 3)
    assert r3.dtype == np.float32 and r3.shape == (4,) and np.any(r3 != 0)
    assert np.array_equal(r3, tc.default_row("deep", 3))
    assert not np.array_equal(r3, tc.default_row("deep", 4))
    assert np.all(tc.default_row("wide", 3) == 0)
    with pytest.raises(ValueError, match="admission.default_row: expected 'zeros' or 'slot'"):
        embcache.TableOptions("x", dim=1, capacity=1, admission={"default_row": "mean"})


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_pools_refused_keys_as_their_slots_default_row(mode):
    sgd = {"kind": "sgd", "learning_rate": 0.5}
    tc = embcache.TrainingCache([
        embcache.TableOptions("deep", dim=4, capacity=64, optimizer=sgd,
                              admission={"min_count": 2, "default_row": "slot"}),
        embcache.TableOptions("wide", dim=4, capacity=64, optimizer=sgd,
                              admission={"min_count": 2}),  # refused keys read zeros
    ], mode="on_demand")
    # 2 samples x 2 slots, sample-major (bag b is slot b % 2); keys 0-2 are seen a second time
    # (admitted), 10-12 a first time (refused: no row).
    ks = np.array([0, 10, 1, 11, 2, 0, 12], np.int64)
    offsets = np.array([0, 2, 3, 6, 7], np.int64)
    for t in ("deep", "wide"):
        tc.lookup(t, keys(0, 3))
        bag = embcache.EmbeddingBag(tc, t, mode)
        out = bag.forward(ks, offsets, num_slots=2)
        rows, found = tc.read(t, keys(0, 3))
        assert found.all() and not tc.read(t, keys(10, 13))[1].any()
        # lookup_combine by hand: float32 sums in batch order, the slot's default row for a
        # refused key, then the division by the bag's size (refused keys count) for mean.
        want = np.zeros((4, 4), np.float32)
        for b in range(4):
            bag_keys = ks[offsets[b]:offsets[b + 1]]
            for k in bag_keys:
                want[b] += rows[k, :4] if k < 10 else tc.default_row(t, b % 2)
            if mode == "mean":
                want[b] /= np.float32(len(bag_keys))
        assert np.array_equal(out, want)
        assert np.any(tc.default_row("deep", 0) != 0) and np.all(tc.default_row("wide", 1) == 0)
        # The step updates the admitted rows only; refused keys get no gradient and no row.
        assert bag.backward(np.ones((4, 4), np.float32)) == 3
        after, _ = tc.read(t, keys(0, 3))
        assert not np.array_equal(after, rows)
        assert not tc.read(t, keys(10, 13))[1].any()
    with pytest.raises(ValueError, match="num_slots: 3 does not divide the 4 bags"):
        bag.forward(ks, offsets, num_slots=3)
    with pytest.raises(ValueError, match="num_slots: expected >= 1, got 0"):
        bag.forward(ks, offsets, num_slots=0)


def test_staged_rows_moved_by_index_train_as_copied_rows():
    """move_staged_rows (the default for these host caches): rows move in and out at a keyset
    boundary by index; EmbeddingBag and row_pool(t)[row_indices(t, slots)] find them, and training
    gives the copied run's rows bit for bit."""
    rng = np.random.default_rng(5)
    passes = [np.unique(rng.integers(0, 600, 300)).astype(np.int64) for _ in range(6)]
    every = keys(0, 600)

    def run(moved):
        tc = embcache.TrainingCache(tables(capacity=320), move_staged_rows=moved)
        bags = [embcache.EmbeddingBag(tc, t, "sum") for t in ("wide", "deep")]
        pooled = []
        for p, ks in enumerate(passes):
            tc.begin_pass([ks, ks])
            if p + 1 < len(passes):
                tc.prefetch([passes[p + 1], passes[p + 1]])
            for bag in bags:
                batch = ks[(np.arange(len(ks)) * 7) % len(ks)]  # repeated keys, batch order
                out = bag.forward(batch)
                pooled.append(out.copy())
                grad = np.linspace(-1, 1, out.size, dtype=np.float32).reshape(out.shape)
                bag.backward(grad * np.float32(p + 1))
            slots = tc.lookup_slots("deep", ks)
            rows, found = tc.read("deep", ks)
            assert found.all()
            assert np.array_equal(tc.row_pool("deep")[tc.row_indices("deep", slots)], rows)
        tc.end_training()
        return [tc.read(t, every) for t in ("wide", "deep")], tc.counters["total"]["deep"], pooled

    copied, copied_counters, copied_pooled = run(False)
    moved, moved_counters, moved_pooled = run(None)  # the default
    assert all(np.array_equal(a, b) for a, b in zip(copied_pooled, moved_pooled))
    assert "rows_moved" not in copied_counters and moved_counters["rows_moved"] > 0
    assert moved_counters["rows_pushed"] == copied_counters["rows_pushed"]
    for (a, found_a), (b, found_b) in zip(copied, moved):
        assert np.array_equal(found_a, found_b) and found_a.any()
        assert np.array_equal(a[found_a], b[found_b])
    # The row pool is row_pool(t): rows(t), which code indexed by slot, is gone, so such code fails.
    assert not hasattr(embcache.TrainingCache, "rows")
    assert not hasattr(embcache.TrainingCacheU32, "rows")
    plain = embcache.TrainingCache(tables(), move_staged_rows=False)
    plain.begin_pass([keys(0, 10), keys(0, 10)])
    slots = plain.lookup_slots("deep", keys(0, 10))
    assert np.array_equal(plain.row_indices("deep", slots), slots)
    with pytest.raises(ValueError, match="slots\\[0\\]: -2 is not a slot of table 1"):
        plain.row_indices("deep", np.array([-2], np.int64))


def test_rows_untouched_for_ttl_steps_expire_at_the_next_boundary():
    t = embcache.TableOptions("deep", dim=4, capacity=64, expiry={"ttl_steps": 2})
    assert t.expiry["ttl_steps"] == 2
    tc = embcache.TrainingCache([t], mode="on_demand")
    tc.expire()
    for step in range(3):
        tc.begin_step()
        ks = keys(0, 10) if step == 0 else keys(0, 5)  # rows 5-9 only in the first step
        tc.mark_updated("deep", tc.lookup("deep", ks))
    tc.expire()  # rows 5-9 untouched for the last two steps
    assert tc.counters["last"]["deep"]["rows_expired"] == 5
    erased = tc.export_incremental()[0]["erased"]
    assert sorted(erased.tolist()) == list(range(5, 10))


def test_incremental_export_folder(tmp_path):
    tc = embcache.TrainingCache(tables())
    tc.begin_pass([keys(0, 50), keys(0, 50)])
    path = tc.export_incremental_to(str(tmp_path / "deltas"))
    assert path.endswith("delta-000001")
    with pytest.raises(embcache.InvalidArgumentError):
        tc.export_incremental_to(str(tmp_path / "deltas"), number=1)


def test_long_calls_release_the_gil_and_threads_are_serialized():
    n = 300000
    tc = embcache.TrainingCache(tables(capacity=n))
    ks = keys(0, n)
    assert runs_without_the_gil(lambda: tc.begin_pass([ks, ks]), repeats=10)
    results = []

    def reader():
        for _ in range(5):
            results.append(tc.read("deep", ks[:50000])[1].all())

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 15


def test_rocksdb_store_behind_a_table(tmp_path):
    if not embcache.HAVE_ROCKSDB:
        pytest.skip("built without RocksDB")
    store = embcache.RocksDBStore(str(tmp_path / "db"), "deep", row_width=8, dim=4,
                                  optimizer="adagrad")
    tc = embcache.TrainingCache(tables(capacity=64, store=store))
    tc.begin_pass([keys(0, 64), keys(0, 64)])
    tc.begin_pass([keys(64, 128), keys(64, 128)])
    tc.end_training()
    assert len(store) >= 64
