"""Lookup-only serving from Python: ModelRows over an embcache-train save, score_shard giving the
trainer's own evaluation of that save, and the Redis store (redis_push, as embcache-apply --redis
does, then RedisRows and score_shard against it) on a redis-server started on a loopback port;
the Redis test skips itself when redis-server is not installed."""

import json
import os
import shutil
import socket
import subprocess
import time

import numpy as np
import pytest

import embcache
from conftest import run_tool, runs_without_the_gil, tool


@pytest.fixture(scope="module")
def trained(tmp_path_factory, synth_dataset):
    """An embcache-train run of two passes with an export after each and an evaluation shard."""
    work = tmp_path_factory.mktemp("serving")
    cfg = {
        "mode": "keyset",
        "passes": [{"shards": [os.path.join(synth_dataset, f"shard-0000{i}.bin")]}
                   for i in (0, 1)],
        "eval_shard": os.path.join(synth_dataset, "shard-00002.bin"),
        "tables": [{"name": "wide", "capacity": 4096},
                   {"name": "deep", "dim": 4, "capacity": 4096}],
        "model": {"hidden": [8], "dropout": 0.0, "seed": 1},
        "batch_size": 100, "log_interval": 0, "blas_threads": 1,
        "save_dir": str(work / "save"), "export_dir": str(work / "exports"),
    }
    (work / "config.json").write_text(json.dumps(cfg))
    run_tool([tool("EMBCACHE_TRAIN"), "--config", str(work / "config.json"), "--no-plot"])
    history = json.loads((work / "save" / "trainer.json").read_text())["history"][-1]
    return {"save": str(work / "save"), "exports": str(work / "exports"),
            "shard": cfg["eval_shard"], "auc": history["eval_auc"],
            "logloss": history["eval_logloss"]}


def needs_scoring():
    if not hasattr(embcache, "score_shard"):
        pytest.skip("the module was built without the trainer")


def test_model_rows_hold_the_saved_rows_and_refuse_unknown_tables(trained, tmp_path):
    rows = embcache.ModelRows(trained["save"])
    assert rows.dims == {"wide": 1, "deep": 4} and rows.dim("deep") == 4
    tc = embcache.TrainingCache([
        embcache.TableOptions("wide", dim=1, capacity=4096, optimizer={"kind": "ftrl"}),
        embcache.TableOptions("deep", dim=4, capacity=4096, optimizer={"kind": "adam"}),
    ])
    tc.load(os.path.join(trained["save"], "sparse"))
    keys = tc.export_incremental()[1]["keys"]
    keys = np.concatenate([keys, np.array([-12345], np.int64)])  # a key never trained
    got, found = rows.lookup("deep", keys)
    want, _ = tc.read("deep", keys[:-1])
    assert found.tolist() == [True] * (len(keys) - 1) + [False]
    assert np.array_equal(got[:-1], want[:, :4])
    with pytest.raises(KeyError, match="table 'nope' is not in the model"):
        rows.lookup("nope", keys)
    with pytest.raises(TypeError, match="keys: expected int64 elements, got float64"):
        rows.lookup("deep", keys.astype(np.float64))
    with pytest.raises(embcache.NotFoundError):
        embcache.ModelRows(str(tmp_path / "missing"))


def test_score_shard_of_a_save_gives_the_trainers_evaluation(trained, tmp_path):
    needs_scoring()
    m = embcache.score_shard(trained["save"], trained["shard"], embcache.ModelRows(trained["save"]))
    assert m["samples"] == 400
    assert m["auc"] == pytest.approx(trained["auc"], rel=1e-12)
    assert m["logloss"] == pytest.approx(trained["logloss"], rel=1e-12)
    with pytest.raises(embcache.NotFoundError, match="trainer.json"):
        embcache.score_shard(str(tmp_path), trained["shard"], embcache.ModelRows(trained["save"]))
    rows = embcache.ModelRows(trained["save"])
    assert runs_without_the_gil(
        lambda: embcache.score_shard(trained["save"], trained["shard"], rows))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture
def redis_address(tmp_path):
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (Debian: redis-server)")
    if not embcache.HAVE_REDIS:
        pytest.skip("the module was built without hiredis")
    port = free_port()
    server = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(1000):  # at most about 10 s
            if server.poll() is not None:
                pytest.fail(f"redis-server exited with {server.returncode} (port {port} taken?)")
            if ping(port):
                break
            time.sleep(0.01)
        else:
            pytest.fail("redis-server did not answer PING")
        yield f"127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait()


def test_redis_push_then_lookup_and_score_from_the_store(trained, redis_address):
    needs_scoring()
    r = embcache.redis_push(redis_address, trained["save"], trained["exports"], prefix="py")
    assert r["base_pushed"] and r["applied_delta"] == 2 and r["rows_written"] > 0
    again = embcache.redis_push(redis_address, trained["save"], trained["exports"], prefix="py")
    assert not again["base_pushed"] and again["rows_written"] == 0
    model = embcache.redis_read_model(redis_address, prefix="py")
    assert model["applied_delta"] == 2 and model["dims"] == {"wide": 1, "deep": 4}

    store = embcache.RedisRows(redis_address, prefix="py")
    store.check_model(trained["save"])
    folder = embcache.ModelRows(trained["save"])
    saved = np.fromfile(os.path.join(trained["save"], "sparse", "deep", "key"), np.int64)
    keys = np.concatenate([saved, np.array([-12345], np.int64)])  # and a key never trained
    got, found = store.lookup("deep", keys)
    want, want_found = folder.lookup("deep", keys)
    assert found.tolist() == [True] * len(saved) + [False]
    assert np.array_equal(found, want_found) and np.array_equal(got[:-1], want[:-1])
    m = embcache.score_shard(trained["save"], trained["shard"], store)
    assert m["auc"] == pytest.approx(trained["auc"], rel=1e-12)
    assert m["logloss"] == pytest.approx(trained["logloss"], rel=1e-12)

    with pytest.raises(embcache.NotFoundError):
        embcache.RedisRows(redis_address, prefix="empty")
    with pytest.raises(embcache.InvalidArgumentError, match="PORT in 1..65535"):
        embcache.RedisRows("127.0.0.1:0")
