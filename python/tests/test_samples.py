"""samples/python/wide_deep.py runs end to end on a small dataset: trains, evaluates, exports and
saves in embcache-train's format, tables that load back, with rows equal to what apply_deltas
builds from the exports."""

import json
import os
import subprocess
import sys

import numpy as np

import embcache

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "samples", "python", "wide_deep.py")


def test_wide_deep_sample_trains_exports_and_saves(tmp_path, synth_dataset):
    shards = embcache.dataset_passes(synth_dataset)
    out = subprocess.run(
        [sys.executable, SAMPLE, "--train", synth_dataset, synth_dataset, "--shards", "2",
         "--eval", shards[2][0], "--hidden", "16", "--batch-size", "100", "--capacity", "8192",
         "--export", str(tmp_path / "exports"), "--save", str(tmp_path / "save"),
         "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert out.returncode == 0, out.stdout
    lines = [l for l in out.stdout.splitlines() if l.startswith("pass ")]
    assert len(lines) == 2 and all("eval AUC 0." in l for l in lines), out.stdout
    assert sorted(os.listdir(tmp_path / "exports")) == ["delta-000001", "delta-000002"]
    tc = embcache.TrainingCache([
        embcache.TableOptions("wide", dim=1, capacity=8192, optimizer={"kind": "ftrl"}),
        embcache.TableOptions("deep", dim=16, capacity=8192, optimizer={"kind": "adam"}),
    ])
    tc.load(str(tmp_path / "save" / "sparse"))
    keys = embcache.read_keyset(shards[0][1])
    rows, found = tc.read("deep", keys)
    assert found.all() and np.isfinite(rows).all()
    assert (tmp_path / "save" / "dense.bin").stat().st_size > 0
    assert json.loads((tmp_path / "save" / "trainer.json").read_text())["passes_done"] == 2
