"""embcache.torch: the embedding-bag collection over a TrainingCache, with autograd."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import embcache  # noqa: E402
from embcache.torch import EmbeddingBagCollection, keyset_passes  # noqa: E402


def make_cache(kind="sgd", lr=0.5, mode="keyset", capacity=512):
    opt = {"kind": kind, "learning_rate": lr}
    return embcache.TrainingCache([
        embcache.TableOptions("wide", dim=1, capacity=capacity, optimizer=opt),
        embcache.TableOptions("deep", dim=3, capacity=capacity, optimizer=opt),
    ], mode=mode)


KEYS = torch.tensor([10, 11, 12, 10, 13, 14], dtype=torch.int64)
OFFSETS = torch.tensor([0, 2, 2, 6], dtype=torch.int64)  # bags [10, 11], [], [12, 10, 13, 14]


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_forward_pools_the_cache_rows(mode):
    tc = make_cache()
    ks = np.arange(100, dtype=np.int64)
    tc.begin_pass([ks, ks])
    ebc = EmbeddingBagCollection(tc, mode=mode)
    out = ebc({"deep": (KEYS, OFFSETS)})["deep"]
    assert out.shape == (3, 3) and out.dtype == torch.float32
    rows = {k: tc.read("deep", np.array([k]))[0][0, :3] for k in range(10, 15)}
    bags = [[10, 11], [], [12, 10, 13, 14]]
    for b, keys in enumerate(bags):
        want = np.sum([rows[k] for k in keys], axis=0) if keys else np.zeros(3, np.float32)
        if mode == "mean" and keys:
            want = want / len(keys)
        np.testing.assert_allclose(out[b].detach().numpy(), want, rtol=1e-6, atol=1e-7)
    one_hot = ebc({"wide": torch.tensor([[10, 11], [12, 13]])})["wide"]
    assert one_hot.shape == (2, 2, 1)
    assert one_hot[1, 0, 0].item() == pytest.approx(float(tc.read("wide", np.array([12]))[0][0, 0]))


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_backward_applies_the_sparse_optimizer_in_the_rows(mode):
    tc = make_cache(lr=0.5)
    ks = np.arange(100, dtype=np.int64)
    tc.begin_pass([ks, ks])
    before = {k: tc.read("deep", np.array([k]))[0][0].copy() for k in range(10, 15)}
    tc.export_incremental()  # the next export holds the rows changed from here
    ebc = EmbeddingBagCollection(tc, mode=mode)
    out = ebc({"deep": (KEYS, OFFSETS)})["deep"]
    weights = torch.tensor([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0], [-1.0, 0.5, 0.25]])
    (out * weights).sum().backward()
    bags = [[10, 11], [], [12, 10, 13, 14]]
    grad = {k: np.zeros(3) for k in range(10, 15)}
    for b, keys in enumerate(bags):
        for k in keys:
            grad[k] += weights[b].numpy() / (len(keys) if mode == "mean" else 1)
    for k in range(10, 15):
        after = tc.read("deep", np.array([k]))[0][0]
        np.testing.assert_allclose(after, before[k] - 0.5 * grad[k], rtol=1e-6, atol=1e-6)
    deltas = {d["table"]: d for d in tc.export_incremental()}
    assert sorted(deltas["deep"]["keys"].tolist()) == [10, 11, 12, 13, 14]
    assert ebc.bags["deep"].step == 1


def test_evaluation_without_grad_changes_nothing_and_keys_must_be_in_the_keyset():
    tc = make_cache()
    ks = np.arange(50, dtype=np.int64)
    tc.begin_pass([ks, ks])
    ebc = EmbeddingBagCollection(tc)
    tc.export_incremental()
    with torch.no_grad():
        ebc({"deep": torch.tensor([[1, 2, 3]])})
    assert tc.export_incremental()[1]["keys"].size == 0
    with pytest.raises(embcache.NotFoundError) as e:
        ebc({"deep": torch.tensor([[1, 2, 99]])})
    assert "key 99 of the batch is not in the pass's keyset" in str(e.value)
    with pytest.raises(TypeError, match="keys: expected int64"):
        ebc({"deep": torch.tensor([[1.0, 2.0]])})
    with pytest.raises(KeyError, match="no table 'dep'"):
        ebc({"dep": torch.tensor([[1]])})
    with pytest.raises(embcache.InvalidArgumentError, match="offsets"):
        ebc({"deep": (torch.tensor([1, 2]), torch.tensor([0, 3]))})


def test_refused_keys_of_a_keyset_pass_pool_as_their_slots_default_row():
    tc = embcache.TrainingCache([embcache.TableOptions(
        "deep", dim=3, capacity=64, optimizer={"kind": "sgd", "learning_rate": 0.5},
        admission={"min_count": 2, "default_row": "slot"})])
    ks = np.arange(10, 16, dtype=np.int64)
    tc.begin_pass([ks])  # first sighting: every key refused, no row
    ebc = EmbeddingBagCollection(tc)
    out = ebc({"deep": torch.from_numpy(ks).reshape(2, 3)})["deep"]  # column s is slot s
    slot_rows = np.stack([tc.default_row("deep", s) for s in range(3)])
    assert np.array_equal(out.detach().numpy(), np.stack([slot_rows, slot_rows]))
    out.sum().backward()  # no row: no gradient, no row made
    assert not tc.read("deep", ks)[1].any()
    csr = ebc({"deep": (torch.from_numpy(ks), torch.arange(7), 3)})["deep"]
    assert np.array_equal(csr.detach().numpy(), np.concatenate([slot_rows, slot_rows]))
    pair = ebc({"deep": (torch.from_numpy(ks), torch.arange(7))})["deep"]
    assert np.array_equal(pair.detach().numpy(), np.stack([slot_rows[0]] * 6))
    with pytest.raises(ValueError, match="expected \\(keys, offsets\\) or"):
        ebc({"deep": (torch.from_numpy(ks), torch.arange(7), 3, 4)})
    tc.begin_pass([ks])  # second sighting: admitted, rows made
    rows, found = tc.read("deep", ks)
    assert found.all()
    with torch.no_grad():
        out = ebc({"deep": torch.from_numpy(ks).reshape(2, 3)})["deep"]
    assert np.array_equal(out.numpy().reshape(6, 3), rows[:, :3])


def test_non_finite_gradients_are_refused():
    tc = make_cache()
    ks = np.arange(10, dtype=np.int64)
    tc.begin_pass([ks, ks])
    ebc = EmbeddingBagCollection(tc)
    out = ebc({"deep": torch.tensor([[1, 2]])})["deep"]
    with pytest.raises(ValueError, match="grad: non-finite value"):
        (out * float("nan")).sum().backward()


def test_on_demand_mode_fetches_misses():
    tc = make_cache(mode="on_demand", capacity=128)
    ebc = EmbeddingBagCollection(tc)
    for lo in range(0, 1000, 100):
        keys = torch.arange(lo, lo + 100, dtype=torch.int64).reshape(50, 2)
        out = ebc({"deep": keys})["deep"]
        out.sum().backward()
    assert tc.counters["total"]["deep"]["rows_evicted"] > 0


def test_a_training_loop_over_keyset_passes(synth_dataset):
    torch.manual_seed(0)
    tc = make_cache(kind="adagrad", lr=0.05, capacity=4096)
    ebc = EmbeddingBagCollection(tc, tables=["deep"])
    dense = torch.nn.Linear(26 * 3 + 13, 1)
    opt = torch.optim.SGD(dense.parameters(), lr=0.05)
    losses = []
    for shard, reader in keyset_passes(tc, synth_dataset, batch_size=200):
        for batch in reader:
            keys = torch.from_numpy(batch["keys"])
            emb = ebc({"deep": keys})["deep"].reshape(keys.shape[0], -1)
            x = torch.cat([emb, torch.from_numpy(batch["dense"])], dim=1)
            logits = dense(x).squeeze(1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, torch.from_numpy(batch["labels"]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert len(losses) == 6 and all(np.isfinite(losses))
    c = tc.counters
    assert c["passes"] == 3
    assert c["total"]["deep"]["rows_staged"] > 0  # the next shard was prefetched
    with pytest.raises(ValueError, match="keysets: expected 2 entries"):
        next(keyset_passes(tc, synth_dataset, keysets=["slot"]))
    with pytest.raises(IndexError, match="shards: 3 is not a shard"):
        next(keyset_passes(tc, synth_dataset, shards=[0, 3]))
    assert [i for i, _ in keyset_passes(tc, synth_dataset, shards=[2, 0])] == [0, 1]


def test_torch_tensors_cross_through_dlpack():
    c = embcache.EmbeddingCache(slots=1024, dim=4, state_width=2, seed=7)
    keys = torch.tensor([4, 5, 6], dtype=torch.int64)
    rows, _ = c.find_or_insert(keys)
    out = torch.zeros((3, 6), dtype=torch.float32)
    same, found = c.find(keys, out=out)
    assert same is out and found.all()
    np.testing.assert_array_equal(out.numpy(), rows)
    # A slice with an offset into its storage is read at the right place.
    rows2, _ = c.find(torch.tensor([0, 4, 5, 6])[1:])
    np.testing.assert_array_equal(rows2, rows)


def test_bad_tensors_are_clear_errors():
    c = embcache.EmbeddingCache(slots=1024, dim=4, state_width=2, seed=7)
    with pytest.raises(TypeError, match="keys: expected int64 elements, got float32"):
        c.find(torch.zeros(3))
    with pytest.raises(ValueError, match="expected a C-contiguous tensor"):
        c.find(torch.arange(12).reshape(3, 4).t().reshape(-1)[::2])


def test_the_collection_over_a_u32_cache_takes_uint32_arrays():
    keys = np.array([7, 4_000_000_000], dtype=np.uint32)
    tc = embcache.TrainingCacheU32([embcache.TableOptionsU32(
        "t", dim=2, capacity=16, init="constant", init_scale=1.0,
        optimizer={"kind": "sgd", "learning_rate": 0.5})])
    tc.begin_pass([keys])
    ebc = EmbeddingBagCollection(tc)
    out = ebc({"t": keys.reshape(1, 2)})["t"]
    assert out.shape == (1, 2, 2) and (out == 1.0).all()
    out.sum().backward()
    rows, _ = tc.read("t", keys)
    assert rows.tolist() == [[0.5, 0.5], [0.5, 0.5]]
    with pytest.raises(TypeError, match="keys: expected uint32 elements, got int64"):
        ebc({"t": torch.zeros((1, 2), dtype=torch.int64)})
