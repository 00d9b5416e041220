#!/usr/bin/env python3
"""One day of benchmarks/continuous/run_days.sh: checks that serving holds exactly the trained
table and appends the day's figures to the run's records.

The check: per table, the serving folder (the day-0 save's sparse folder with every delta since
applied by embcache-apply) holds the same keys and the same embeddings, byte for byte, as the
save the trainer wrote at the end of the day; with --redis-port, the Redis store under --prefix
holds the same tables, the same keys (HKEYS against the save's key file) and the day's delta as
its position. Any difference is printed (how many keys on each side, a few of them) and the
script exits 1.

Appends one JSON object to --jsonl and one line to --csv (header written when the file is new);
--tsv gets the same line tab-separated for gnuplot. Standard library only.
"""
import argparse
import array
import csv
import filecmp
import json
import os
import subprocess
import sys

FIELDS = [
    "variant", "day", "rows", "rows_wide", "rows_deep", "store_bytes", "store_disk_bytes",
    "delta", "delta_rows", "delta_tombstones", "serving_rows", "redis_keys", "eval_auc",
    "eval_logloss", "train_loss", "train_seconds", "serving_matches_save",
]


def fail(message):
    print(f"check_day: SERVING CHECK FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(f"cannot read {path}: {e}")


def read_keys(path):
    keys = array.array("q")
    with open(path, "rb") as f:
        data = f.read()
    if len(data) % 8:
        fail(f"{path}: {len(data)} bytes, not a whole number of int64 keys")
    keys.frombytes(data)
    if sys.byteorder != "little":
        keys.byteswap()
    return keys


def tables_of(manifest):
    return {t["name"]: t for t in manifest["tables"]}


def describe_difference(what, save_keys, other_keys):
    only_save = sorted(save_keys - other_keys)
    only_other = sorted(other_keys - save_keys)
    return (f"{what}: {len(only_other)} keys served that the save lacks (e.g. {only_other[:5]}), "
            f"{len(only_save)} keys of the save not served (e.g. {only_save[:5]})")


def folder_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def redis(port, *args):
    out = subprocess.run(["redis-cli", "-p", str(port), "--raw", *args], check=True,
                         capture_output=True, text=True)
    return out.stdout


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", required=True)
    p.add_argument("--day", type=int, required=True)
    p.add_argument("--save", required=True, help="the trainer's save folder")
    p.add_argument("--serving", required=True, help="the folder embcache-apply updates")
    p.add_argument("--metrics", required=True, help="the trainer's metrics.jsonl")
    p.add_argument("--store-dir", default="", help="a RocksDB folder to measure (optional)")
    p.add_argument("--redis-port", type=int, default=0)
    p.add_argument("--prefix", default="embcache")
    p.add_argument("--jsonl", required=True)
    p.add_argument("--csv", required=True)
    p.add_argument("--tsv", required=True)
    a = p.parse_args()

    with open(a.metrics, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    if not lines:
        fail(f"{a.metrics} holds no pass")
    m = json.loads(lines[-1])
    delta_path = m.get("export_path") or ""
    if not delta_path:
        fail(f"day {a.day}: the trainer exported no delta ({a.metrics})")
    delta = read_json(os.path.join(delta_path, "manifest.json"))
    delta_number = int(os.path.basename(delta_path).split("-")[-1])

    save = tables_of(read_json(os.path.join(a.save, "sparse", "manifest.json")))
    serving_manifest = read_json(os.path.join(a.serving, "manifest.json"))
    serving = tables_of(serving_manifest)
    if sorted(save) != sorted(serving):
        fail(f"day {a.day} ({a.variant}): tables of the save {sorted(save)} and of serving "
             f"{sorted(serving)} differ")
    if serving_manifest.get("applied_delta") != delta_number:
        fail(f"day {a.day} ({a.variant}): serving stands at delta "
             f"{serving_manifest.get('applied_delta')}, the day exported delta {delta_number}")

    store_bytes = 0
    for name, t in save.items():
        store_bytes += sum(f["bytes"] for f in t["files"].values())
        if serving[name]["count"] != t["count"]:
            fail(f"day {a.day} ({a.variant}): table {name}: the save holds {t['count']} rows, "
                 f"serving {serving[name]['count']}")
        for file in ("key", "emb_vector"):
            s = os.path.join(a.save, "sparse", name, file)
            v = os.path.join(a.serving, name, file)
            if not filecmp.cmp(s, v, shallow=False):
                if file == "key":
                    fail(describe_difference(f"day {a.day} ({a.variant}): table {name}",
                                             set(read_keys(s)), set(read_keys(v))))
                fail(f"day {a.day} ({a.variant}): table {name}: the same keys, but serving's "
                     f"embeddings differ from the save's ({v} against {s})")

    redis_keys = ""
    if a.redis_port:
        applied = redis(a.redis_port, "GET", f"{a.prefix}:applied").strip()
        if applied != str(delta_number):
            fail(f"day {a.day} ({a.variant}): Redis '{a.prefix}' stands at delta {applied!r}, "
                 f"the day exported delta {delta_number}")
        redis_keys = 0
        for name in save:
            served = redis(a.redis_port, "HKEYS", f"{a.prefix}:table:{name}").split()
            redis_keys += len(served)
            save_keys = set(read_keys(os.path.join(a.save, "sparse", name, "key")))
            if len(served) != len(save_keys) or set(map(int, served)) != save_keys:
                fail(describe_difference(f"day {a.day} ({a.variant}): Redis table {name}",
                                         save_keys, set(map(int, served))))

    def num(x):
        return "" if x is None else x

    def cell(x, delimiter):
        if x is True:
            return "true"
        # gnuplot reads 'nan' as a missing point (the trainer's metrics.tsv does the same).
        return "nan" if x == "" and delimiter == "\t" else x

    record = {
        "variant": a.variant,
        "day": a.day,
        "rows": sum(t["count"] for t in save.values()),
        "rows_wide": save.get("wide", {}).get("count", 0),
        "rows_deep": save.get("deep", {}).get("count", 0),
        "store_bytes": store_bytes,
        "store_disk_bytes": folder_bytes(a.store_dir) if a.store_dir else "",
        "delta": delta_number,
        "delta_rows": sum(t["count"] for t in delta["tables"]),
        "delta_tombstones": sum(t["erased"] for t in delta["tables"]),
        "serving_rows": sum(t["count"] for t in serving.values()),
        "redis_keys": redis_keys,
        "eval_auc": num(m.get("eval_auc")),
        "eval_logloss": num(m.get("eval_logloss")),
        "train_loss": num(m.get("train_loss")),
        "train_seconds": num(m.get("seconds")),
        "serving_matches_save": True,
    }
    with open(a.jsonl, "a", encoding="utf-8") as f:
        f.write(json.dumps({k: (None if v == "" else v) for k, v in record.items()}) + "\n")
    for path, delimiter in ((a.csv, ","), (a.tsv, "\t")):
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        with open(path, "a", encoding="utf-8", newline="") as f:
            w = csv.writer(f, delimiter=delimiter, lineterminator="\n")
            if new:
                # gnuplot skips the header of the TSV as a comment.
                w.writerow(FIELDS if delimiter == "," else ["#" + FIELDS[0]] + FIELDS[1:])
            w.writerow([cell(record[k], delimiter) for k in FIELDS])
    print(f"day {a.day:3d} {a.variant}: rows {record['rows']}, store {store_bytes} B, delta "
          f"{delta_number}: {record['delta_rows']} rows, {record['delta_tombstones']} tombstones, "
          f"serving {record['serving_rows']} rows"
          + (f", Redis {redis_keys} keys" if a.redis_port else "")
          + f", next-day AUC {record['eval_auc']}: serving matches the save")


if __name__ == "__main__":
    main()
