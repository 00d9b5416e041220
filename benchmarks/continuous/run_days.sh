#!/usr/bin/env bash
# Continuous training over drifting days, the long-horizon run of docs/training_cache.md: N days
# of synthetic data whose keys drift (embcache-synth --day D --drift F), trained one pass a day by
# embcache-train, each day resuming from the previous day's save and exporting a delta, which
# embcache-apply applies to a serving folder (and pushes into Redis). Once without and once with
# admission and expiry (tables[i].admission, tables[i].expiry). After every day it checks that
# serving holds exactly the trained table (check_day.py: the same keys and embeddings as the
# save; in Redis the same keys) and stops with an error otherwise. Not in CI: minutes to hours.
#
#   benchmarks/continuous/run_days.sh [options]
#     --days N              days trained (default 30); one more is generated, the last day's eval
#     --rows N              rows per day (default 200000)
#     --rows-per-shard N    (default 50000)
#     --eval-rows N         samples of the next day's first shard evaluated (default 20000; 0: all)
#     --cardinality-scale F, --drift F, --seed N   embcache-synth's (defaults 0.05, 0.05, 1)
#     --policies off|on|both  the runs: off = no policy ("baseline"), on = admission and expiry on
#                           both tables ("policies"); default both
#     --min-count M         tables[i].admission.min_count of the policies run (default 2)
#     --ttl-passes T        tables[i].expiry.ttl_passes of the policies run (default 7: a week)
#     --store host|rocksdb  the tables' store (default host; rocksdb also reports its disk bytes)
#     --dim N, --hidden W,W,..., --batch N   the deep table's dim, the MLP, the batch size
#                           (defaults 8, 64,32, 512; dropout 0, one BLAS thread)
#     --redis | --no-redis  push into a redis-server started for the run (default: when
#                           redis-server and redis-cli are on the PATH)
#     --work DIR            where everything goes (default build/continuous_days); the data is
#                           kept and reused by a later run with the same data options
#     --bin DIR             the build (default build/cpu)
# Output, in DIR: days.csv and days.jsonl (one record per variant and day: table rows, store
# bytes, the day's delta rows and tombstones, serving rows, Redis keys, next-day eval AUC, ...),
# summary.md (rows on day 9, the tenth, and on the last day; AUC), plot.gp and, with gnuplot, rows.png,
# auc.png and deltas.png; per variant its configs, logs, save, exports and serving folder.
set -euo pipefail

days=30
rows=200000
rows_per_shard=50000
eval_rows=20000
scale=0.05
drift=0.05
seed=1
policies=both
min_count=2
ttl_passes=7
store=host
dim=8
hidden=64,32
batch=512
redis=auto
work=build/continuous_days
bin=build/cpu
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
}
need_value() { [ $# -ge 2 ] || { echo "run_days.sh: $1 needs a value" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --days | --rows | --rows-per-shard | --eval-rows | --cardinality-scale | --drift | --seed | \
      --policies | --min-count | --ttl-passes | --store | --dim | --hidden | --batch | --work | \
      --bin)
      need_value "$@" ;;&
    --days) days=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --rows-per-shard) rows_per_shard=$2; shift 2 ;;
    --eval-rows) eval_rows=$2; shift 2 ;;
    --cardinality-scale) scale=$2; shift 2 ;;
    --drift) drift=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --policies) policies=$2; shift 2 ;;
    --min-count) min_count=$2; shift 2 ;;
    --ttl-passes) ttl_passes=$2; shift 2 ;;
    --store) store=$2; shift 2 ;;
    --dim) dim=$2; shift 2 ;;
    --hidden) hidden=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --redis) redis=on; shift ;;
    --no-redis) redis=off; shift ;;
    --work) work=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h | --help) usage ;;
    *) echo "run_days.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
  esac
done

is_count() { [[ $1 =~ ^[0-9]+$ ]] && [ "${#1}" -le 12 ] && [ "$1" -ge "${2:-0}" ]; }
bad() { echo "run_days.sh: $1" >&2; exit 2; }
is_count "$days" 1 || bad "--days: '$days' is not an integer of at least 1"
is_count "$rows" 1 || bad "--rows: '$rows' is not an integer of at least 1"
is_count "$rows_per_shard" 1 || bad "--rows-per-shard: '$rows_per_shard' is not an integer of at least 1"
is_count "$eval_rows" || bad "--eval-rows: '$eval_rows' is not an integer of at least 0"
is_count "$min_count" 1 || bad "--min-count: '$min_count' is not an integer of at least 1"
is_count "$ttl_passes" 1 || bad "--ttl-passes: '$ttl_passes' is not an integer of at least 1"
is_count "$dim" 1 || bad "--dim: '$dim' is not an integer of at least 1"
is_count "$batch" 1 || bad "--batch: '$batch' is not an integer of at least 1"
[[ $hidden =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || bad "--hidden: '$hidden' is not a list of widths like 64,32"
case "$policies" in off) variants=(baseline) ;; on) variants=(policies) ;;
  both) variants=(baseline policies) ;; *) bad "--policies: '$policies' is not off, on or both" ;; esac
case "$store" in host | rocksdb) ;; *) bad "--store: '$store' is not host or rocksdb" ;; esac
# --seed, --drift and --cardinality-scale are checked by embcache-synth (exit 2, naming them).

synth=$bin/src/tools/embcache-synth
train=$bin/src/trainer/embcache-train
apply=$bin/src/tools/embcache-apply
for exe in "$synth" "$train" "$apply"; do
  [ -x "$exe" ] || { echo "run_days.sh: $exe is missing (cmake --build --preset cpu --target" \
    "embcache-synth embcache-train embcache-apply, or --bin DIR)" >&2; exit 2; }
done
command -v python3 >/dev/null || { echo "run_days.sh: python3 is needed" >&2; exit 2; }
if [ "$redis" = auto ]; then
  if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then redis=on; else redis=off; fi
fi
mkdir -p "$work"
work=$(cd "$work" && pwd)
data=$work/data

# ---- the days' data, kept for a later run with the same options ----
data_options="rows=$rows rows_per_shard=$rows_per_shard scale=$scale drift=$drift seed=$seed"
if [ "$(cat "$data/options.txt" 2>/dev/null)" != "$data_options" ]; then
  rm -rf "$data"
fi
mkdir -p "$data"
for ((d = 0; d <= days; d++)); do
  day=$(printf 'day_%03d' "$d")
  [ -f "$data/$day/manifest.json" ] && continue
  echo "synth: $day ($rows rows, drift $drift)"
  "$synth" -f shards -o "$data/$day" --day "$d" --drift "$drift" --seed "$seed" \
    --cardinality-scale "$scale" -r "$rows" -n "$rows_per_shard" --force --no-progress >/dev/null
done
echo "$data_options" >"$data/options.txt"

# ---- Redis (optional) ----
redis_port=0
redis_pid=
stop_redis() { if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi; }
trap stop_redis EXIT
if [ "$redis" = on ]; then
  mkdir -p "$work/redis"
  for _ in 1 2 3 4 5; do
    redis_port=$((20000 + (RANDOM % 20000)))
    redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
      --dir "$work/redis" >"$work/redis/server.log" 2>&1 &
    redis_pid=$!
    for _ in $(seq 50); do
      redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
      sleep 0.1
    done
    if redis-cli -p "$redis_port" ping >/dev/null 2>&1; then break; fi
    stop_redis
    redis_pid=
    redis_port=0
  done
  [ "$redis_port" != 0 ] || { echo "run_days.sh: could not start redis-server (see $work/redis/server.log)" >&2; exit 1; }
  echo "redis-server on 127.0.0.1:$redis_port (pid $redis_pid)"
fi

# ---- one day's configuration ----
make_config() {  # variant day out_file
  RD_WORK=$work RD_DATA=$data RD_STORE=$store RD_DIM=$dim RD_HIDDEN=$hidden RD_BATCH=$batch \
    RD_EVAL_ROWS=$eval_rows RD_MIN_COUNT=$min_count RD_TTL_PASSES=$ttl_passes \
    python3 - "$@" <<'EOF'
import json, os, sys
e = os.environ
variant, day, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
vd = os.path.join(e["RD_WORK"], variant)
tables = [{"name": "wide", "capacity": "auto"},
          {"name": "deep", "dim": int(e["RD_DIM"]), "capacity": "auto"}]
for t in tables:
    if e["RD_STORE"] == "rocksdb":
        t["store"] = "rocksdb"
        t["store_path"] = vd + "/db"
    if variant == "policies":
        # The names agreed for embcache-train's configuration (docs/trainer.md).
        t["admission"] = {"min_count": int(e["RD_MIN_COUNT"])}
        t["expiry"] = {"ttl_passes": int(e["RD_TTL_PASSES"])}
config = {
    "mode": "keyset",
    "data_dir": e["RD_DATA"],
    "passes": ["day_%03d" % day],
    "eval_shard": "day_%03d/shard-00000.bin" % (day + 1),
    "eval_max_samples": int(e["RD_EVAL_ROWS"]),
    "tables": tables,
    "model": {"hidden": [int(w) for w in e["RD_HIDDEN"].split(",")], "dropout": 0},
    "batch_size": int(e["RD_BATCH"]),
    "blas_threads": 1,
    "log_interval": 0,
    "output_dir": vd + "/out",
    "export_dir": vd + "/exports",
    "save_dir": vd + "/save",
}
if day > 0:
    config["resume_from"] = vd + "/save"
with open(out, "w") as f:
    json.dump(config, f, indent=1)
    f.write("\n")
EOF
}

fail_day() {  # message log [exit status]
  echo "run_days.sh: $1" >&2
  if [ -f "$2" ]; then
    echo "--- the end of $2:" >&2
    tail -n 20 "$2" >&2
  fi
  exit "${3:-1}"
}

# ---- the runs ----
# Every variant's configuration is checked before anything runs: a build without the policies
# fails here, not after the baseline's days.
for v in "${variants[@]}"; do
  vd=$work/$v
  rm -rf "$vd"
  mkdir -p "$vd/config" "$vd/logs"
  make_config "$v" 0 "$vd/config/day_000.json"
  if ! "$train" --config "$vd/config/day_000.json" --print-config >"$vd/logs/config_check.log" 2>&1; then
    if [ "$v" = policies ] && grep -q "admission\|expiry" "$vd/logs/config_check.log"; then
      fail_day "this embcache-train refuses tables[i].admission / tables[i].expiry (a build \
without them?): build one that has them, or run with --policies off" "$vd/logs/config_check.log" 2
    fi
    fail_day "$v: embcache-train refused $vd/config/day_000.json" "$vd/logs/config_check.log" 2
  fi
done
rm -f "$work/days.csv" "$work/days.jsonl"
for v in "${variants[@]}"; do
  vd=$work/$v
  [ "$redis_port" != 0 ] && redis-cli -p "$redis_port" --scan --pattern "$v:*" |
    xargs -r redis-cli -p "$redis_port" del >/dev/null
  start=$SECONDS
  for ((d = 0; d < days; d++)); do
    day=$(printf 'day_%03d' "$d")
    cfg=$vd/config/$day.json
    log=$vd/logs/$day.log
    make_config "$v" "$d" "$cfg"
    "$train" --config "$cfg" --no-plot >"$log" 2>&1 || fail_day "$v $day: embcache-train failed" "$log"
    if [ "$d" = 0 ]; then
      # Serving starts from the first day's model, as a new service would.
      cp -r "$vd/save/sparse" "$vd/serving"
    fi
    "$apply" "$vd/serving" "$vd/exports" >>"$log" 2>&1 || fail_day "$v $day: embcache-apply failed" "$log"
    check=(--variant "$v" --day "$d" --save "$vd/save" --serving "$vd/serving"
      --metrics "$vd/out/metrics.jsonl" --jsonl "$work/days.jsonl" --csv "$work/days.csv"
      --tsv "$vd/days.tsv")
    [ "$store" = rocksdb ] && check+=(--store-dir "$vd/db")
    if [ "$redis_port" != 0 ]; then
      "$apply" "$vd/serving" "$vd/exports" --redis "127.0.0.1:$redis_port" --prefix "$v" \
        >>"$log" 2>&1 || fail_day "$v $day: embcache-apply --redis failed" "$log"
      check+=(--redis-port "$redis_port" --prefix "$v")
    fi
    python3 "$here/check_day.py" "${check[@]}" || fail_day "$v $day: serving does not hold the trained table" "$log"
  done
  echo "$v: $days days in $((SECONDS - start)) s"
done

# ---- summary and plots ----
python3 - "$work" "$days" "${variants[@]}" <<'EOF' | tee "$work/summary.md"
import csv, sys
work, days, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = list(csv.DictReader(open(work + "/days.csv")))
tenth = min(9, days - 1)
print(f"| run | rows, day {tenth} | rows, day {days - 1} (the last) | ratio "
      "| store bytes, last day | tombstones, all days | next-day AUC, mean of the last 10 days "
      "| next-day AUC, last day |")
print("|---|---|---|---|---|---|---|---|")
for v in variants:
    r = [x for x in rows if x["variant"] == v]
    aucs = [float(x["eval_auc"]) for x in r[-10:] if x["eval_auc"] not in ("", "nan")]
    mean = sum(aucs) / len(aucs) if aucs else float("nan")
    a, b = int(r[tenth]["rows"]), int(r[-1]["rows"])
    tomb = sum(int(x["delta_tombstones"]) for x in r)
    print(f"| {v} | {a} | {b} | {b / a:.3f} | {r[-1]['store_bytes']} | {tomb} | {mean:.5f} "
          f"| {float(r[-1]['eval_auc']):.5f} |")
EOF

colors=('#08519c' '#d95f0e')
curves() {  # the plot command: per variant, "column:title[:dash]" for each argument
  local line="plot" sep=" " i spec column title dash
  for i in "${!variants[@]}"; do
    for spec in "$@"; do
      IFS=: read -r column title dash <<<"$spec"
      line+="$sep d.'/${variants[$i]}/days.tsv' using 2:$column with linespoints"
      local style="pt 7"
      [ -z "$dash" ] || style="dt 2 pt 4"
      line+=" lc rgb '${colors[$i]}' $style title '${variants[$i]}${title:+,}$title'"
      sep=", \\"$'\n'"    "
    done
  done
  echo "$line"
}
{
  echo "# Curves of run_days.sh: gnuplot -c plot.gp FOLDER (the folder of days.csv)."
  echo "d = (ARGC >= 1) ? ARG1 : '.'"
  echo "set terminal png size 900,550 noenhanced"
  echo "set datafile missing 'nan'"
  echo "set xlabel 'day'"
  echo "set grid"
  echo "# The legend sits below the plot, off the curves."
  echo "set key outside center bottom horizontal"
  echo "set xrange [-0.5:$((days - 1)).5]"
  echo "set xtics $(((days + 9) / 10))"
  echo "set format x '%.0f'"
  echo "set format y '%.0f'"
  echo "set output d.'/rows.png'"
  echo "set ylabel 'table rows (wide + deep)'"
  curves "3: table rows"
  echo "set output d.'/deltas.png'"
  echo "set ylabel 'rows per delta'"
  curves "9: rows" "10: tombstones:dash"
  echo "set output d.'/auc.png'"
  echo "set ylabel 'eval AUC on the next day'"
  echo "set format y '%.3f'"
  curves "13:"
  echo "unset output"
} >"$work/plot.gp"
if command -v gnuplot >/dev/null; then
  gnuplot -c "$work/plot.gp" "$work"
  echo "plots: $work/rows.png, $work/auc.png, $work/deltas.png"
else
  echo "gnuplot not found: wrote $work/plot.gp, no PNG"
fi
echo "records: $work/days.csv, $work/days.jsonl; summary: $work/summary.md"
