"""The save folder of embcache-train (docs/trainer.md, "Save and resume"), written and read from
PyTorch, so that the Wide&Deep sample and embcache-train resume each other's saves.

A save is a folder holding
  sparse/       TrainingCache.save: the tables (the C++ training cache's own save);
  dense.bin     the dense part as wide_deep_model::save writes it (docs/model.md, "Saved state"):
                magic EMBWDL01, wide bias and its Adam m and v (3 float32), the size of the MLP
                blob (u64), the MLP blob, xxHash64 of all that. The MLP blob: magic EMBDNN01,
                version 1 (u32), hidden layer count H (u32), input_dim (u64), the H widths (u64),
                Adam step (u64), parameter count P (u64), the P parameters, Adam m, Adam v
                (float32), xxHash64. Parameters run layer by layer, W_l (fan_in x fan_out,
                row-major: torch's Linear.weight transposed) then b_l. Little-endian;
  trainer.json  format "embcache-trainer" version 1, the global step, passes done, samples, the
                metrics history, the configuration and `sparse` (the run identity, applied delta
                and table versions of sparse/manifest.json): what embcache-train's resume checks.

Torch's Adam keeps the same state as the trainer's dense Adam (first and second moments, the step
count for the bias correction; the update is the same formula), so the moments and the step move
between the two unchanged. Every refusal names the file and what differs.
"""

import json
import math
import os
import shutil
import struct

import numpy as np
import torch

import embcache

WIDE_DEEP_MAGIC = b"EMBWDL01"
MLP_MAGIC = b"EMBDNN01"
MLP_VERSION = 1


def _shape(input_dim, hidden):
    return "-".join(str(int(w)) for w in [input_dim, *hidden, 1])


def _adam_state(opt, p):
    """(step, m, v) of parameter p in torch's Adam; zeros before the first step."""
    st = opt.state.get(p, {})
    if "exp_avg" not in st:
        z = torch.zeros_like(p)
        return 0, z, z
    return int(st["step"]), st["exp_avg"], st["exp_avg_sq"]


def _flat(tensors):
    return np.concatenate([t.detach().cpu().numpy().astype(np.float32).ravel() for t in tensors])


def dense_blob(tower, opt):
    """The dense.bin bytes of `tower` (DenseTower) and its torch Adam `opt`."""
    linears = tower.linears()
    input_dim, hidden = linears[0].in_features, [l.out_features for l in linears[:-1]]
    params, ms, vs, steps = [], [], [], set()
    for lin in linears:
        for p, as_trainer in ((lin.weight, lambda t: t.t()), (lin.bias, lambda t: t)):
            step, m, v = _adam_state(opt, p)
            steps.add(step)
            params.append(as_trainer(p))
            ms.append(as_trainer(m))
            vs.append(as_trainer(v))
    step, bm, bv = _adam_state(opt, tower.wide_bias)
    steps.add(step)
    if len(steps) != 1:
        raise ValueError(f"dense Adam: the parameters have taken different step counts {steps}; "
                         "the trainer keeps one")
    p_flat, m_flat, v_flat = _flat(params), _flat(ms), _flat(vs)
    mlp = bytearray(MLP_MAGIC)
    mlp += struct.pack("<IIQ", MLP_VERSION, len(hidden), input_dim)
    mlp += struct.pack(f"<{len(hidden)}Q", *hidden)
    mlp += struct.pack("<QQ", step, p_flat.size)
    for a in (p_flat, m_flat, v_flat):
        mlp += a.astype("<f4").tobytes()
    mlp += struct.pack("<Q", embcache.xxh64(bytes(mlp)))
    bias = [float(tower.wide_bias), float(bm), float(bv)]
    out = bytearray(WIDE_DEEP_MAGIC) + struct.pack("<3fQ", *bias, len(mlp)) + mlp
    out += struct.pack("<Q", embcache.xxh64(bytes(out)))
    return bytes(out)


def load_dense_blob(data, tower, opt, path="dense.bin"):
    """Sets `tower`'s weights and `opt`'s Adam state from dense.bin bytes; checks everything first
    (ValueError naming `path` and what differs), so that nothing changes on a refusal. Returns the
    dense Adam step."""
    return _apply_dense(tower, opt, *_parse_dense(data, tower, path))


def _parse_dense(data, tower, path):
    """Checks dense.bin bytes against `tower`'s shape -> (Adam step, (bias, m, v), (3, P) arrays of
    the parameters, Adam m and v in the trainer's order)."""
    def bad(what):
        return ValueError(f"{path}: {what}")

    if len(data) < 36 or data[:8] != WIDE_DEEP_MAGIC:
        raise bad(f"missing magic EMBWDL01 ({len(data)} bytes): not an embcache-train dense.bin")
    if embcache.xxh64(data[:-8]) != struct.unpack_from("<Q", data, len(data) - 8)[0]:
        raise bad(f"checksum mismatch over {len(data)} bytes (truncated or corrupted)")
    bias, bm, bv, mlp_size = struct.unpack_from("<3fQ", data, 8)
    if mlp_size != len(data) - 36:
        raise bad(f"dense network of {mlp_size} bytes, {len(data) - 36} present")
    mlp = data[28:28 + mlp_size]
    if len(mlp) < 32 or mlp[:8] != MLP_MAGIC:
        raise bad("dense network: missing magic EMBDNN01")
    if embcache.xxh64(mlp[:-8]) != struct.unpack_from("<Q", mlp, len(mlp) - 8)[0]:
        raise bad(f"dense network: checksum mismatch over {len(mlp)} bytes")
    version, count, input_dim = struct.unpack_from("<IIQ", mlp, 8)
    if version != MLP_VERSION:
        raise bad(f"dense network: version {version}, expected {MLP_VERSION}")
    at = 24
    if at + 8 * count + 16 > len(mlp) - 8:
        raise bad(f"dense network: {count} layer widths do not fit in {len(mlp)} bytes")
    hidden = list(struct.unpack_from(f"<{count}Q", mlp, at))
    at += 8 * count
    linears = tower.linears()
    want_input, want_hidden = linears[0].in_features, [l.out_features for l in linears[:-1]]
    if input_dim != want_input or hidden != want_hidden:
        raise bad(f"dense network of shape {_shape(input_dim, hidden)}, this model is "
                  f"{_shape(want_input, want_hidden)} (input = 26 slots x dim + 13 dense, then "
                  "--hidden; the save's trainer.json config says what it was trained with)")
    step, n = struct.unpack_from("<QQ", mlp, at)
    at += 16
    want_n = sum(l.weight.numel() + l.bias.numel() for l in linears)
    if n != want_n or at + 12 * n != len(mlp) - 8:
        raise bad(f"dense network: {n} parameters in {len(mlp)} bytes, expected {want_n}")
    flat = np.frombuffer(mlp, dtype="<f4", count=3 * n, offset=at).astype(np.float32)
    arrays = flat.reshape(3, n)
    if not np.isfinite(arrays).all() or not all(map(math.isfinite, (bias, bm, bv))):
        raise bad("non-finite dense weights or Adam state")
    return step, (bias, bm, bv), arrays


def _apply_dense(tower, opt, step, bias_state, arrays):
    bias, bm, bv = bias_state
    with torch.no_grad():
        off = 0
        pieces = []  # (parameter, values, m, v) in torch's layout
        for lin in tower.linears():
            fan_out, fan_in = lin.weight.shape
            k = fan_in * fan_out
            w = [torch.from_numpy(a[off:off + k].reshape(fan_in, fan_out).T.copy()) for a in arrays]
            off += k
            b = [torch.from_numpy(a[off:off + fan_out].copy()) for a in arrays]
            off += fan_out
            pieces += [(lin.weight, *w), (lin.bias, *b)]
        pieces.append((tower.wide_bias, torch.tensor(bias), torch.tensor(bm), torch.tensor(bv)))
        for p, value, m, v in pieces:
            p.copy_(value.reshape(p.shape))
            if step > 0:
                opt.state[p] = {"step": torch.tensor(float(step)), "exp_avg": m.reshape(p.shape),
                                "exp_avg_sq": v.reshape(p.shape)}
            else:
                opt.state.pop(p, None)
    return step


def sparse_point(sparse_dir):
    """What trainer.json records of sparse/manifest.json (run_id, applied_delta, versions)."""
    with open(os.path.join(sparse_dir, "manifest.json")) as f:
        m = json.load(f)
    return {"run_id": m.get("run_id", ""), "applied_delta": m.get("applied_delta", 0),
            "versions": {t["name"]: t["version"] for t in m["tables"]}}


def _null_nan(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _trainer_counters(c):
    """TrainingCache.counters in the shape of the trainer's trainer.json 'counters'."""
    return {"passes": c["passes"],
            "tables": {t: {"last": c["last"][t], "total": c["total"][t]} for t in c["last"]}}


def save(dir, cache, tower, opt, state):
    """Writes the save folder `dir` (staged as dir.tmp, then put in place of a previous save).

    `state`: step, passes_done, samples, history (one dict per pass with the trainer's metrics
    fields), config (the trainer configuration the model was trained with).
    """
    dir = dir.rstrip("/")
    staged, old = dir + ".tmp", dir + ".old"
    shutil.rmtree(staged, ignore_errors=True)
    os.makedirs(staged)
    cache.save(os.path.join(staged, "sparse"))
    with open(os.path.join(staged, "dense.bin"), "wb") as f:
        f.write(dense_blob(tower, opt))
        f.flush()
        os.fsync(f.fileno())
    history = [{k: _null_nan(v) for k, v in h.items()} for h in state["history"]]
    trainer = {"format": "embcache-trainer", "format_version": 1, "mode": "keyset",
               "step": state["step"], "passes_done": state["passes_done"],
               "samples": state["samples"], "seed": state["config"]["seed"], "crossed": False,
               "world": 1, "num_blocks": None, "history": history,
               "counters": _trainer_counters(cache.counters), "config": state["config"],
               "sparse": sparse_point(os.path.join(staged, "sparse")),
               "producer": "samples/python/wide_deep.py"}
    with open(os.path.join(staged, "trainer.json"), "w") as f:
        f.write(json.dumps(trainer, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(dir):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(dir, old)
    os.rename(staged, dir)
    shutil.rmtree(old, ignore_errors=True)


def load(dir, cache, tower, opt, config):
    """Resumes from the save folder `dir` (an embcache-train save or one of save()): the tables
    into `cache`, the dense part into `tower` and `opt`. Refuses, naming the file and what
    differs, a save of another format, one trained with crossed keys (this model has none), one
    whose sparse/ was rewritten since (deltas applied), tables of other dims or optimizers and a
    dense network of another shape. Returns trainer.json's state (step, passes_done, samples,
    history)."""
    state_path = os.path.join(dir, "trainer.json")
    with open(state_path) as f:
        state = json.load(f)
    if state.get("format") != "embcache-trainer" or state.get("format_version") != 1:
        raise ValueError(f"{state_path}: not an embcache-trainer save of version 1")
    if state.get("world", 1) != 1:
        raise ValueError(f"{state_path}: a sharded save of {state['world']} ranks (sparse/ holds "
                         "a part per rank); this sample resumes a single-process save")
    if state.get("crossed"):
        raise ValueError(f"{state_path}: saved with crossed true (the wide table takes crossed "
                         "keys); this sample trains without crossing")
    saved = state.get("config", {})
    for t in saved.get("tables", []):
        mine = next((m for m in config["tables"] if m["name"] == t["name"]), None)
        if mine is None:
            raise ValueError(f"{state_path}: table '{t['name']}' is not one of this model's")
        for field in ("dim",):
            if t.get(field, mine[field]) != mine[field]:
                raise ValueError(f"{state_path}: table '{t['name']}' has {field} {t[field]}, "
                                 f"this model's has {mine[field]}")
        kind = t.get("optimizer", {}).get("kind", mine["optimizer"]["kind"])
        if kind != mine["optimizer"]["kind"]:
            raise ValueError(f"{state_path}: table '{t['name']}' is trained by {kind}, this "
                             f"model's by {mine['optimizer']['kind']}")
    sparse = os.path.join(dir, "sparse")
    if "sparse" in state and os.path.exists(os.path.join(sparse, "manifest.json")):
        now = sparse_point(sparse)
        if now != state["sparse"]:
            raise ValueError(f"'{sparse}' is not the sparse part 'dense.bin' was saved with: "
                             f"{state_path} records {state['sparse']}, the manifest says {now}")
    with open(os.path.join(dir, "dense.bin"), "rb") as f:
        blob = f.read()
    # The dense blob is checked whole before the tables load; neither changes on a refusal.
    dense = _parse_dense(blob, tower, os.path.join(dir, "dense.bin"))
    cache.load(sparse)
    adam_step = _apply_dense(tower, opt, *dense)
    return {"step": int(state["step"]), "passes_done": int(state["passes_done"]),
            "samples": int(state["samples"]), "history": list(state.get("history", [])),
            "adam_step": adam_step}
