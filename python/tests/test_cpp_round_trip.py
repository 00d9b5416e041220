"""Saves cross between Python and the C++ trainer: a save of embcache-train loads into a Python
TrainingCache with every row intact, and the same save written again by Python resumes in
embcache-train to the very bytes a resume from the C++ save gives."""

import json
import os
import shutil

import numpy as np

import embcache
from conftest import run_tool, tool


def config(dataset, shards, save_dir, resume=""):
    passes = [{"shards": [os.path.join(dataset, s)]} for s in shards]
    return {
        "mode": "keyset",
        "passes": passes,
        "tables": [
            {"name": "wide", "capacity": 4096},
            {"name": "deep", "dim": 4, "capacity": 4096,
             "optimizer": {"kind": "adam", "learning_rate": 0.01}},
        ],
        "model": {"hidden": [8], "dropout": 0.0, "seed": 1},
        "batch_size": 100,
        "log_interval": 0,
        "save_dir": str(save_dir),
        "resume_from": str(resume),
    }


def train(tmp_path, name, cfg):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    run_tool([tool("EMBCACHE_TRAIN"), "--config", str(path), "--no-plot"])


def python_cache():
    # The trainer's tables: wide FTRL (its default), deep Adam.
    return embcache.TrainingCache([
        embcache.TableOptions("wide", dim=1, capacity=4096, optimizer={"kind": "ftrl"}),
        embcache.TableOptions("deep", dim=4, capacity=4096, optimizer={"kind": "adam"}),
    ])


def read_rows(folder, dim, state_files):
    keys = np.fromfile(folder / "key", dtype=np.int64)
    parts = [np.fromfile(folder / "emb_vector", dtype=np.float32).reshape(-1, dim)]
    parts += [np.fromfile(folder / f, dtype=np.float32).reshape(-1, dim) for f in state_files]
    return keys, np.concatenate(parts, axis=1)


def test_a_trainer_save_loads_in_python_and_a_python_save_resumes_in_the_trainer(
        tmp_path, synth_dataset):
    c_save = tmp_path / "c_save"
    train(tmp_path, "first", config(synth_dataset, ["shard-00000.bin"], c_save))

    tc = python_cache()
    tc.load(str(c_save / "sparse"))
    for table, dim, state in (("wide", 1, ["Ftrl.n", "Ftrl.z"]), ("deep", 4, ["Adam.m", "Adam.v"])):
        keys, rows = read_rows(c_save / "sparse" / table, dim, state)
        assert keys.size > 100
        got, found = tc.read(table, keys)
        assert found.all()
        np.testing.assert_array_equal(got, rows)

    # The same save written by Python: the model files are the trainer's bytes.
    py_sparse = tmp_path / "py_sparse"
    tc.save(str(py_sparse))
    for table, files in (("wide", ["key", "emb_vector", "Ftrl.n", "Ftrl.z", "slot_id"]),
                         ("deep", ["key", "emb_vector", "Adam.m", "Adam.v", "slot_id"])):
        for f in files:
            assert (py_sparse / table / f).read_bytes() == \
                (c_save / "sparse" / table / f).read_bytes(), f"{table}/{f}"

    # The trainer resumes from the save whose sparse/ Python wrote, as from its own.
    mixed = tmp_path / "mixed_save"
    shutil.copytree(c_save, mixed)
    shutil.rmtree(mixed / "sparse")
    shutil.copytree(py_sparse, mixed / "sparse")
    train(tmp_path, "from_c", config(synth_dataset, ["shard-00001.bin"], tmp_path / "r_c", c_save))
    train(tmp_path, "from_py", config(synth_dataset, ["shard-00001.bin"], tmp_path / "r_py", mixed))
    for f in ("wide/emb_vector", "deep/emb_vector", "deep/Adam.m", "deep/key"):
        assert (tmp_path / "r_c" / "sparse" / f).read_bytes() == \
            (tmp_path / "r_py" / "sparse" / f).read_bytes(), f
    assert (tmp_path / "r_c" / "dense.bin").read_bytes() == \
        (tmp_path / "r_py" / "dense.bin").read_bytes()
