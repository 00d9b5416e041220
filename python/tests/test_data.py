"""The data readers (keysets, shards, dataset manifests) and apply_deltas."""

import numpy as np
import pytest

import embcache
from conftest import run_tool, tool


def test_keyset_round_trip_and_errors(tmp_path):
    path = str(tmp_path / "a.keys")
    embcache.write_keyset(path, np.array([5, -3, 5, 2**50], dtype=np.int64))
    np.testing.assert_array_equal(embcache.read_keyset(path), [-3, 5, 2**50])
    raw = str(tmp_path / "b.raw")
    embcache.write_keyset(raw, np.array([9, 1], dtype=np.int64), format="hugectr_raw")
    assert (tmp_path / "b.raw").stat().st_size == 16
    np.testing.assert_array_equal(embcache.read_keyset(raw, format="hugectr_raw"), [1, 9])
    with pytest.raises(embcache.NotFoundError) as e:
        embcache.read_keyset(str(tmp_path / "none.keys"))
    assert "none.keys" in str(e.value)
    data = bytearray((tmp_path / "a.keys").read_bytes())
    (tmp_path / "short.keys").write_bytes(bytes(data[:-4]))
    with pytest.raises(embcache.CorruptionError) as e:
        embcache.read_keyset(str(tmp_path / "short.keys"))
    assert "short.keys" in str(e.value)
    with pytest.raises(ValueError, match="keyset_format: expected one of"):
        embcache.read_keyset(path, format="csv")


def test_manifest_and_shard_reader(synth_dataset):
    m = embcache.read_dataset_manifest(synth_dataset)
    assert m["rows"] == 1200 and len(m["shards"]) == 3
    assert all(s["rows"] == 400 for s in m["shards"])
    passes = embcache.dataset_passes(synth_dataset)
    assert passes[0][0].endswith("shard-00000.bin") and passes[0][1].endswith("shard-00000.keys")
    header = embcache.read_shard_header(passes[0][0])
    assert header["rows"] == 400 and header["num_crossed"] == 0
    reader = embcache.ShardReader([p[0] for p in passes[:2]], batch_size=256)
    assert reader.total_rows == 800 and reader.num_shards == 2
    batches = list(reader)
    assert [b["size"] for b in batches] == [256, 144, 256, 144]
    assert [b["shard_index"] for b in batches] == [0, 0, 1, 1]
    b = batches[0]
    assert b["keys"].shape == (256, 26) and b["keys"].dtype == np.int64
    assert b["dense"].shape == (256, 13) and b["labels"].shape == (256,)
    # Every key of a shard is in its keyset.
    keyset = embcache.read_keyset(passes[0][1])
    shard_keys = np.unique(np.concatenate([x["keys"].ravel() for x in batches[:2]]))
    np.testing.assert_array_equal(shard_keys, keyset)


def test_shard_reader_errors(tmp_path, synth_dataset):
    with pytest.raises(embcache.NotFoundError):
        embcache.ShardReader([str(tmp_path / "none.bin")])
    with pytest.raises(ValueError, match="batch_size: expected >= 1"):
        embcache.ShardReader([], batch_size=0)
    shard = embcache.dataset_passes(synth_dataset)[0][0]
    data = open(shard, "rb").read()
    (tmp_path / "cut.bin").write_bytes(data[:-10])
    with pytest.raises(embcache.CorruptionError) as e:
        embcache.read_shard_header(str(tmp_path / "cut.bin"))
    assert "cut.bin" in str(e.value)
    with pytest.raises(embcache.NotFoundError):
        embcache.read_dataset_manifest(str(tmp_path))


def make_cache():
    return embcache.TrainingCache([
        embcache.TableOptions("wide", dim=1, capacity=512),
        embcache.TableOptions("deep", dim=4, capacity=512, optimizer={"kind": "adam"}),
    ])


def test_apply_deltas_matches_a_later_save(tmp_path):
    tc = make_cache()
    ks = np.arange(300, dtype=np.int64)
    tc.begin_pass([ks, ks])
    tc.save(str(tmp_path / "base"))
    tc.export_incremental()  # the deltas start from the base
    for step in range(2):
        part = ks[step * 100:(step + 1) * 100]
        slots = tc.lookup_slots("deep", part)
        tc.row_pool("deep")[tc.row_indices("deep", slots), :4] += 0.25
        tc.mark_updated("deep", slots)
        tc.erase("wide", part[:3])
        tc.export_incremental_to(str(tmp_path / "deltas"), with_state=True)
    tc.save(str(tmp_path / "final"))
    base_manifest = (tmp_path / "base" / "manifest.json").read_bytes()
    served = embcache.apply_deltas(str(tmp_path / "base"), str(tmp_path / "deltas"),
                                   output=str(tmp_path / "served"))
    assert served["model_dir"] == str(tmp_path / "served") and served["deltas"] == [1, 2]
    assert (tmp_path / "base" / "manifest.json").read_bytes() == base_manifest  # only read
    for t in ("wide", "deep"):
        assert (tmp_path / "served" / t / "emb_vector").read_bytes() == \
            (tmp_path / "final" / t / "emb_vector").read_bytes(), t
    report = embcache.apply_deltas(str(tmp_path / "base"), str(tmp_path / "deltas"))
    assert report["applied_delta"] == 2 and report["deltas"] == [1, 2]
    assert report["rows_erased"] == 6 and report["changed"]
    for t in ("wide", "deep"):
        for f in ("key", "emb_vector"):
            assert (tmp_path / "base" / t / f).read_bytes() == \
                (tmp_path / "final" / t / f).read_bytes(), f"{t}/{f}"
    again = embcache.apply_deltas(str(tmp_path / "base"), str(tmp_path / "deltas"))
    assert not again["changed"]
    with pytest.raises(embcache.NotFoundError):
        embcache.apply_deltas(str(tmp_path / "base"), str(tmp_path / "nodeltas"))


def test_apply_deltas_agrees_with_the_embcache_apply_tool(tmp_path):
    apply_tool = tool("EMBCACHE_APPLY")
    tc = make_cache()
    ks = np.arange(200, dtype=np.int64)
    tc.begin_pass([ks, ks])
    tc.save(str(tmp_path / "a"))
    tc.save(str(tmp_path / "b"))
    tc.export_incremental()
    tc.assign("deep", ks[:10], np.ones((10, 12), np.float32))
    tc.export_incremental_to(str(tmp_path / "deltas"))
    embcache.apply_deltas(str(tmp_path / "a"), str(tmp_path / "deltas"))
    run_tool([apply_tool, str(tmp_path / "b"), str(tmp_path / "deltas")])
    for t in ("wide", "deep"):
        for f in ("key", "emb_vector"):
            assert (tmp_path / "a" / t / f).read_bytes() == (tmp_path / "b" / t / f).read_bytes()


def test_owner_of_is_the_sharded_runs_key_partition():
    def fmix64(k):  # murmur3's finalizer, in Python
        m = (1 << 64) - 1
        k ^= k >> 33
        k = (k * 0xFF51AFD7ED558CCD) & m
        k ^= k >> 33
        k = (k * 0xC4CEB9FE1A85EC53) & m
        return k ^ (k >> 33)

    keys = np.array([0, 1, 7, -1, 2**40 + 3, -(2**62)], np.int64)
    want = [fmix64((int(k) & ((1 << 64) - 1)) ^ 0x6F776E6572) % 3 for k in keys]
    got = embcache.owner_of(keys, 3)
    assert got.dtype == np.int32 and got.tolist() == want
    small = np.array([0, 1, 7, 4_000_000_000], np.uint32)
    assert embcache.owner_of(small, 3, key_dtype="uint32").tolist() == embcache.owner_of(
        small.astype(np.int64), 3).tolist()
    assert embcache.owner_of(keys, 1).tolist() == [0] * len(keys)
    with pytest.raises(ValueError, match="world: expected >= 1 ranks, got 0"):
        embcache.owner_of(keys, 0)
    with pytest.raises(TypeError, match="keys: expected int64 elements, got uint32"):
        embcache.owner_of(small, 3)
