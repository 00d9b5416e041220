"""CudaEmbeddingCache (builds with CUDA, on a machine with a GPU): the cuda space's rows equal the
host space's bit for bit, and host tensors or another device are clear errors."""

import numpy as np
import pytest

import embcache



def cuda_torch():
    """torch, when the build has the cuda space and a CUDA device is present; else a skip."""
    if not hasattr(embcache, "CudaEmbeddingCache"):
        pytest.skip("needs a build with CUDA")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch


def test_rows_equal_the_host_space_and_bad_tensors_are_refused():
    torch = cuda_torch()
    keys = torch.arange(1000, dtype=torch.int64) * 7
    host = embcache.EmbeddingCache(slots=4096, dim=8, state_width=8, seed=3)
    want, _ = host.find_or_insert(keys.numpy())
    dev = embcache.CudaEmbeddingCache(slots=4096, dim=8, state_width=8, seed=3)
    out = torch.empty((1000, 16), dtype=torch.float32, device="cuda")
    inserted = torch.zeros(1000, dtype=torch.bool, device="cuda")
    dev.find_or_insert(keys.cuda(), out, inserted)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), want)
    assert inserted.all().item() and len(dev) == 1000
    slots = torch.empty(1000, dtype=torch.int64, device="cuda")
    dev.lookup_slots(keys.cuda(), slots)
    assert (slots >= 0).all().item()
    k, rows, versions = dev.export()
    np.testing.assert_array_equal(k, np.sort(keys.numpy()))
    with pytest.raises(ValueError, match="expected an array in CUDA device memory"):
        dev.find(keys, out)
    with pytest.raises(ValueError, match="out: the cuda space writes into a CUDA tensor"):
        dev.find(keys.cuda(), None)
