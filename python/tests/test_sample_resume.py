"""The PyTorch Wide&Deep sample (samples/python/wide_deep.py) and embcache-train resume each other's
saves: a pass of the sample saved, resumed by embcache-train for one more pass, and the other way
round; the loaded rows and dense weights are the saved ones, and a save of another shape is
refused naming what differs."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import embcache
from conftest import run_tool, tool

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "samples", "python"))
import trainer_save  # noqa: E402
import wide_deep  # noqa: E402

# One model for both programs: deep dim 4, MLP 117-8-1 (26 x 4 + 13 inputs), batch 100, seeds 0/1.
SAMPLE_ARGS = ["--hidden", "8", "--dim", "4", "--batch-size", "100", "--capacity", "4096",
               "--seed", "0", "--model-seed", "1", "--threads", "1"]
STATE_FILES = {"wide": ["Ftrl.n", "Ftrl.z"], "deep": ["Adam.m", "Adam.v"]}


def trainer_run(tmp_path, name, dataset, shard, save_dir, resume="", hidden=(8,), eval_shard="",
                dropout=0.5):
    cfg = {
        "mode": "keyset",
        "passes": [{"shards": [os.path.join(dataset, shard)]}],
        "tables": [{"name": "wide", "capacity": 4096},
                   {"name": "deep", "dim": 4, "capacity": 4096}],
        "model": {"hidden": list(hidden), "seed": 1, "dropout": dropout},
        "batch_size": 100, "seed": 0, "log_interval": 0, "eval_shard": eval_shard,
        "save_dir": str(save_dir), "resume_from": str(resume),
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return [tool("EMBCACHE_TRAIN"), "--config", str(path), "--no-plot"]


def state(save):
    return json.loads((save / "trainer.json").read_text())


def rows(save, table):
    """key -> the row's bytes (embedding, then the optimizer's state) of a save's table."""
    folder = save / "sparse" / table
    keys = np.fromfile(folder / "key", dtype=np.int64)
    parts = [np.fromfile(folder / f, dtype=np.float32).reshape(keys.size, -1)
             for f in ["emb_vector"] + STATE_FILES[table]]
    return dict(zip(keys.tolist(), np.concatenate(parts, axis=1)))


def adam_step(save):
    """The dense Adam step count in dense.bin (after the MLP blob's 24-byte header and widths)."""
    blob = (save / "dense.bin").read_bytes()
    hidden_count = struct.unpack_from("<I", blob, 28 + 12)[0]
    return struct.unpack_from("<Q", blob, 28 + 24 + 8 * hidden_count)[0]


def test_a_sample_save_resumes_in_embcache_train(tmp_path, synth_dataset):
    py_save, c_save = tmp_path / "py_save", tmp_path / "c_save"
    wide_deep.main(["--train", synth_dataset, "--shards", "1", "--save", str(py_save)]
                   + SAMPLE_ARGS)
    assert sorted(os.listdir(py_save)) == ["dense.bin", "sparse", "trainer.json"]
    assert state(py_save)["step"] == 4 and adam_step(py_save) == 4
    # Its trainer.json records the model as a configuration embcache-train reads (as
    # embcache-serve does to score with the save).
    cfg = tmp_path / "py_config.json"
    cfg.write_text(json.dumps(state(py_save)["config"]))
    printed = json.loads(run_tool([tool("EMBCACHE_TRAIN"), "--config", str(cfg), "--print-config"]))
    assert printed["model"]["hidden"] == [8] and printed["model"]["seed"] == 1
    assert [(t["name"], t["dim"], t["optimizer"]["kind"]) for t in printed["tables"]] == \
        [("wide", 1, "ftrl"), ("deep", 4, "adam")]

    out = run_tool(trainer_run(tmp_path, "resume", synth_dataset, "shard-00001.bin", c_save,
                               resume=py_save))
    assert "pass 2 done: 400 samples" in out, out
    s = state(c_save)
    assert (s["step"], s["passes_done"], s["samples"]) == (8, 2, 800)
    assert [h["pass"] for h in s["history"]] == [1, 2]
    assert s["history"][0] == state(py_save)["history"][0]
    assert adam_step(c_save) == 8  # the sample's dense Adam state went on, not a fresh one

    # Rows the second shard never touched are the sample's, to the bit; the others trained on.
    touched = set(embcache.read_keyset(os.path.join(synth_dataset, "shard-00001.keys")).tolist())
    for table in ("wide", "deep"):
        before, after = rows(py_save, table), rows(c_save, table)
        assert set(before) <= set(after)
        kept = [k for k in before if k not in touched]
        assert len(kept) > 100
        for k in kept:
            np.testing.assert_array_equal(after[k], before[k], err_msg=f"{table} key {k}")
        assert any(not np.array_equal(after[k], before[k]) for k in before if k in touched)

    # A configuration of another dense shape is refused, naming the file and both shapes.
    refused = subprocess.run(trainer_run(tmp_path, "wider", synth_dataset, "shard-00001.bin",
                                         tmp_path / "c_wider", resume=py_save, hidden=(16,)),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert refused.returncode != 0
    assert "dense.bin" in refused.stdout and "shape 117-8-1, expected 117-16-1" in refused.stdout


def test_an_embcache_train_save_resumes_in_the_sample(tmp_path, synth_dataset, capsys):
    c_save = tmp_path / "c_save"
    held_out = os.path.join(synth_dataset, "shard-00002.bin")
    run_tool(trainer_run(tmp_path, "first", synth_dataset, "shard-00000.bin", c_save,
                         eval_shard=held_out))

    # Loaded and saved again before any training: the trainer's files, byte for byte; and the
    # loaded model scores the held-out shard as the trainer did (so the weights sit where the
    # trainer's forward reads them, not only round-trip).
    again = tmp_path / "again"
    wide_deep.main(["--resume", str(c_save), "--eval", held_out, "--save", str(again)]
                   + SAMPLE_ARGS)
    line = [l for l in capsys.readouterr().out.splitlines() if l.startswith("eval AUC")][0]
    auc, logloss = float(line.split()[2].rstrip(",")), float(line.split()[5])
    recorded = state(c_save)["history"][0]
    assert abs(auc - recorded["eval_auc"]) < 1e-3, (line, recorded)
    assert abs(logloss - recorded["eval_logloss"]) < 1e-4, (line, recorded)
    assert (again / "dense.bin").read_bytes() == (c_save / "dense.bin").read_bytes()
    for table in ("wide", "deep"):
        for f in ["key", "emb_vector", "slot_id"] + STATE_FILES[table]:
            assert (again / "sparse" / table / f).read_bytes() == \
                (c_save / "sparse" / table / f).read_bytes(), f"{table}/{f}"

    # One more pass on the next shard continues the run. Without dropout (whose masks come from
    # torch's generator in the sample, from a hash in the trainer) the sample's pass and the
    # trainer's own pass from the same save give the same model up to float rounding: the sparse
    # optimizers run on from the saved step, the dense Adam from its saved moments.
    py_save, c_next = tmp_path / "py_save", tmp_path / "c_next"
    wide_deep.main(["--resume", str(c_save), "--train", synth_dataset, "--first-shard", "1",
                    "--shards", "1", "--dropout", "0", "--save", str(py_save)] + SAMPLE_ARGS)
    s = state(py_save)
    assert (s["step"], s["passes_done"], s["samples"]) == (8, 2, 800)
    assert [h["pass"] for h in s["history"]] == [1, 2] and adam_step(py_save) == 8
    assert s["config"]["passes"][0]["shards"] == [os.path.join(synth_dataset, "shard-00001.bin")]
    run_tool(trainer_run(tmp_path, "next", synth_dataset, "shard-00001.bin", c_next,
                         resume=c_save, dropout=0.0))
    for table in ("wide", "deep"):
        py_rows, c_rows = rows(py_save, table), rows(c_next, table)
        assert py_rows.keys() == c_rows.keys()
        for k in c_rows:
            np.testing.assert_allclose(py_rows[k], c_rows[k], rtol=1e-4, atol=1e-7,
                                       err_msg=f"{table} key {k}")
    towers = []
    for save in (py_save, c_next):
        tower = wide_deep.DenseTower(4, [8], 0.0)
        trainer_save.load_dense_blob((save / "dense.bin").read_bytes(), tower,
                                     torch.optim.Adam(tower.parameters()))
        towers.append(torch.nn.utils.parameters_to_vector(tower.parameters()).detach())
    torch.testing.assert_close(towers[0], towers[1], rtol=1e-4, atol=1e-6)
    assert abs(s["history"][1]["train_loss"] - state(c_next)["history"][1]["train_loss"]) < 1e-5

    # A sample of another dense shape refuses the save, naming the file and both shapes.
    with pytest.raises(ValueError, match=r"dense.bin: dense network of shape 117-8-1, this "
                                         r"model is 117-16-1"):
        wide_deep.main(["--resume", str(c_save)] + SAMPLE_ARGS[:1] + ["16"] + SAMPLE_ARGS[2:])
