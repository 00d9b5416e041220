"""uint32 keys: EmbeddingCacheU32, the U32 stores and TrainingCacheU32 are the C++ classes over
std::uint32_t; they take uint32 arrays only (the int64 classes int64 only), a TypeError naming the
argument otherwise, and save, load and keyset files carry the key type."""

import numpy as np
import pytest

import embcache

BIG = np.array([1, 7, 4_000_000_000, 2**32 - 1], dtype=np.uint32)  # above int32's range too


def test_u32_cache_inserts_finds_and_exports_keys_above_two_to_the_31():
    c = embcache.EmbeddingCacheU32(slots=256, dim=4, init="constant", init_scale=0.5)
    assert c.key_dtype == "uint32" and embcache.EmbeddingCache.key_dtype == "int64"
    rows, inserted = c.find_or_insert(BIG)
    assert inserted.all() and (rows == 0.5).all()
    c.insert_or_assign(BIG[2:3], np.full((1, 4), 3.0, np.float32))
    rows, found = c.find(BIG)
    assert found.all() and (rows[2] == 3.0).all() and (rows[3] == 0.5).all()
    keys, rows, versions = c.export()
    assert keys.dtype == np.uint32 and keys.tolist() == sorted(BIG.tolist())
    slots = c.lookup_slots(np.array([7, 8], np.uint32))
    assert slots[0] >= 0 and slots[1] == -1
    assert c.erase(BIG[:1]) == 1 and len(c) == 3


def test_each_key_type_refuses_the_other_with_a_type_error():
    u = embcache.EmbeddingCacheU32(slots=128, dim=2)
    with pytest.raises(TypeError, match="keys: expected uint32 elements, got int64"):
        u.find(np.array([1, 2], np.int64))
    with pytest.raises(TypeError, match="keys: expected uint32 elements, got int32"):
        u.find_or_insert(np.array([1, 2], np.int32))
    c = embcache.EmbeddingCache(slots=128, dim=2)
    with pytest.raises(TypeError, match="keys: expected int64 elements, got uint32"):
        c.find(BIG)
    with pytest.raises(TypeError, match=r"store: expected a ParamStoreU32 \(uint32 keys\), got "
                                        r"embcache._embcache.HostStore"):
        embcache.TableOptionsU32("t", 2, 16, store=embcache.HostStore(row_width=2))
    tc = embcache.TrainingCacheU32([embcache.TableOptionsU32("t", 2, 16)])
    with pytest.raises(TypeError, match=r"keysets\[0\]: expected uint32 elements, got int64"):
        tc.begin_pass([np.array([1], np.int64)])


def test_u32_host_store_pushes_pulls_and_checkpoints(tmp_path):
    s = embcache.HostStoreU32(table_name="t", row_width=3)
    assert isinstance(s, embcache.ParamStoreU32) and s.key_dtype == "uint32"
    s.push(BIG, np.arange(12, dtype=np.float32).reshape(4, 3))
    rows, found, _ = s.pull(np.array([4_000_000_000, 5], np.uint32))
    assert found.tolist() == [True, False] and rows[0].tolist() == [6, 7, 8]
    s.checkpoint(str(tmp_path / "ckpt"))
    again = embcache.HostStoreU32.open(str(tmp_path / "ckpt"), "t", 3)
    assert len(again) == 4 and again.contains(BIG).all()
    with pytest.raises(TypeError, match="keys: expected uint32 elements, got int64"):
        again.pull(np.array([1], np.int64))


def test_u32_training_cache_passes_saves_and_loads_and_its_save_is_refused_as_int64(tmp_path):
    def cache():
        return embcache.TrainingCacheU32([embcache.TableOptionsU32(
            "deep", dim=4, capacity=64, optimizer={"kind": "adagrad"},
            store=embcache.HostStoreU32(table_name="deep", row_width=8))])

    tc = cache()
    assert tc.key_dtype == "uint32"
    tc.begin_pass([BIG])
    slots = tc.lookup_slots("deep", BIG)
    assert (slots >= 0).all()
    rows = np.arange(32, dtype=np.float32).reshape(4, 8)
    tc.assign("deep", BIG, rows)
    tc.begin_pass([np.array([9], np.uint32)])  # the rows leave for the store
    delta = tc.export_incremental()[0]  # the four assigned rows and key 9's new row
    assert delta["keys"].dtype == np.uint32
    assert sorted(delta["keys"].tolist()) == sorted(BIG.tolist() + [9])
    tc.save(str(tmp_path / "save"))

    back = cache()
    back.load(str(tmp_path / "save"))
    got, found = back.read("deep", BIG)
    assert found.all() and np.array_equal(got, rows)
    as_int64 = embcache.TrainingCache([embcache.TableOptions(
        "deep", dim=4, capacity=64, optimizer={"kind": "adagrad"})])
    with pytest.raises(embcache.InvalidArgumentError, match="holds uint32 keys, expected int64"):
        as_int64.load(str(tmp_path / "save"))


def test_keysets_of_uint32_keys_round_trip_and_carry_their_key_type(tmp_path):
    path = str(tmp_path / "u32.keyset")
    embcache.write_keyset(path, BIG[::-1].copy(), key_dtype="uint32")
    got = embcache.read_keyset(path, key_dtype="uint32")
    assert got.dtype == np.uint32 and got.tolist() == sorted(BIG.tolist())
    with pytest.raises(embcache.InvalidArgumentError,
                       match="holds uint32 keys, but int64 keys were requested"):
        embcache.read_keyset(path)  # an int64 read of a uint32 file
    with pytest.raises(TypeError, match="keys: expected uint32 elements, got int64"):
        embcache.write_keyset(path, np.array([1], np.int64), key_dtype="uint32")
    with pytest.raises(ValueError, match="key_dtype: expected one of 'int64', 'uint32', got 'u8'"):
        embcache.read_keyset(path, key_dtype="u8")


def test_u32_embedding_bag_pools_and_steps_in_the_rows():
    tc = embcache.TrainingCacheU32([embcache.TableOptionsU32(
        "t", dim=2, capacity=16, init="constant", init_scale=1.0,
        optimizer={"kind": "sgd", "learning_rate": 0.5})])
    tc.begin_pass([BIG])
    with pytest.raises(TypeError, match=r"cache: expected a TrainingCache \(int64 keys\), got "
                                        r"embcache._embcache.TrainingCacheU32"):
        embcache.EmbeddingBag(tc, "t")
    bag = embcache.EmbeddingBagU32(tc, "t")
    pooled = bag.forward(BIG[:2], np.array([0, 2], np.int64))
    assert pooled.tolist() == [[2.0, 2.0]]
    assert bag.backward(np.ones((1, 2), np.float32)) == 2
    rows, _ = tc.read("t", BIG[:2])
    assert rows.tolist() == [[0.5, 0.5], [0.5, 0.5]]


def test_u32_embedding_bag_pools_refused_keys_as_their_slots_default_row():
    tc = embcache.TrainingCacheU32([embcache.TableOptionsU32(
        "t", dim=2, capacity=16, optimizer={"kind": "sgd", "learning_rate": 0.5},
        admission={"min_count": 2, "default_row": "slot"})], mode="on_demand")
    bag = embcache.EmbeddingBagU32(tc, "t")
    out = bag.forward(BIG, num_slots=2)  # first sighting: every key refused
    d0, d1 = tc.default_row("t", 0), tc.default_row("t", 1)
    assert np.array_equal(out, np.stack([d0, d1, d0, d1])) and not np.array_equal(d0, d1)
    assert bag.backward(np.ones((4, 2), np.float32)) == 0
    assert not tc.read("t", BIG)[1].any()
