"""samples/python/wide_deep.py runs end to end on a small dataset: trains, evaluates, exports and
saves in embcache-train's format, tables that load back, with rows equal to what apply_deltas
builds from the exports."""

import json
import os
import re
import subprocess
import sys

import numpy as np

import embcache

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "samples", "python", "wide_deep.py")


def run_sample(tmp_path, synth_dataset, name, *extra):
    shards = embcache.dataset_passes(synth_dataset)
    return subprocess.run(
        [sys.executable, SAMPLE, "--train", synth_dataset, synth_dataset, "--shards", "2",
         "--eval", shards[2][0], "--hidden", "16", "--batch-size", "100", "--capacity", "8192",
         "--export", str(tmp_path / name / "exports"), "--save", str(tmp_path / name / "save"),
         "--threads", "1", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_wide_deep_sample_trains_exports_and_saves(tmp_path, synth_dataset):
    shards = embcache.dataset_passes(synth_dataset)
    out = run_sample(tmp_path, synth_dataset, "copied")
    assert out.returncode == 0, out.stdout
    tmp_path = tmp_path / "copied"
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


def test_wide_deep_sample_moves_staged_rows_to_the_same_model(tmp_path, synth_dataset):
    """The rows move into the caches by index (the default) or are copied (--copy-staged-rows);
    the same losses and model."""
    runs = [run_sample(tmp_path, synth_dataset, name, *extra)
            for name, extra in (("copied", ("--copy-staged-rows",)), ("moved", ()))]
    for out in runs:
        assert out.returncode == 0, out.stdout
    passes = [[l for l in out.stdout.splitlines() if l.startswith("pass ")] for out in runs]
    assert len(passes[0]) == 2
    assert "moved in" not in passes[0][0] and "900 staged, 0 written back, 900 moved in" in passes[1][0]
    timings = re.compile(r"[0-9]+ samples/s|, [0-9]+ moved in")
    assert [timings.sub("", l) for l in passes[0]] == [timings.sub("", l) for l in passes[1]]
    for table in ("wide", "deep"):
        folder = ["copied", "moved"]
        files = sorted(os.listdir(tmp_path / "copied" / "save" / "sparse" / table))
        assert files == sorted(os.listdir(tmp_path / "moved" / "save" / "sparse" / table))
        for f in files:
            if f == "version":
                continue
            a, b = [(tmp_path / n / "save" / "sparse" / table / f).read_bytes() for n in folder]
            assert a == b, f"{table}/{f}"
    assert ((tmp_path / "copied" / "save" / "dense.bin").read_bytes() ==
            (tmp_path / "moved" / "save" / "dense.bin").read_bytes())
