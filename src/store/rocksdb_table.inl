// A table of the RocksDB store: its state (metadata entry, row count, schema, key
// sorting) and opening it (schema checks, existing rows). Part of rocksdb_store.cpp, which includes
// it.
#pragma once

#include "embcache/detail/host_algorithms.hpp"
#include "rocksdb_database.inl"
#include "rocksdb_encoding.inl"
#include "format/checked_io.hpp"

namespace embcache {

template <class Key>
struct rocksdb_store<Key>::state {
  rocksdb_store_options options;
  rocksdb_database::impl* db = nullptr;
  rocksdb::ColumnFamilyHandle* cf = nullptr;
  std::size_t count = 0;
  // Whether pushes since the last exact point may have added keys that `count` misses.
  std::atomic<bool> count_stale{false};
  std::mutex count_mutex;
  std::uint64_t max_version = 0;
  // Whether the metadata entry says "dirty": rows were pushed after it was last written.
  bool meta_dirty = false;
  // Numbers the SST files of ingested pushes (ingest_folder).
  std::atomic<std::uint64_t> ingests{0};
  // The column family's SST data block size (rocksdb_database::impl::block_bytes).
  std::size_t block_bytes = 0;
  std::string who;
  table_schema schema;  // the caller's, recorded in the metadata entry

  std::string meta_key() const { return meta_prefix + options.table_name; }
  std::size_t value_bytes() const { return options.row_width * sizeof(float) + 8; }
  rocksdb::WriteOptions write_options() const {
    rocksdb::WriteOptions wo;
    wo.disableWAL = options.disable_wal;
    return wo;
  }

  status write_meta(bool dirty) {
    nlohmann::json m{{"format", meta_format},
                     {"format_version", meta_format_version},
                     {"table_name", options.table_name},
                     {"key_type", key_type_name<Key>()},
                     {"dim", schema.dim},
                     {"optimizer", schema.optimizer},
                     {"state_width", schema.state_width},
                     {"row_width", options.row_width},
                     {"count", count},
                     {"count_exact", !count_stale.load()},
                     {"max_version", max_version},
                     {"dirty", dirty}};
    EMBCACHE_RETURN_IF_ERROR(
        from_rocksdb(db->db->Put(write_options(), db->default_cf(), meta_key(), m.dump()),
                     who + ": writing the metadata entry"));
    meta_dirty = dirty;
    return {};
  }

  // Marks the metadata dirty before the first write after a clean point. Recovery after a
  // crash sees it whenever any later row reached the disk, and then recounts.
  status before_write() { return meta_dirty ? status{} : write_meta(true); }

  status recount() {
    rocksdb::ReadOptions ro;
    ro.fill_cache = false;
    std::unique_ptr<rocksdb::Iterator> it(db->db->NewIterator(ro, cf));
    std::size_t n = 0;
    std::uint64_t vmax = 0;
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      auto v = it->value();
      if (v.size() != value_bytes())
        return status::corruption(who + ": a value of " + std::to_string(v.size()) +
                                  " bytes, expected " + std::to_string(value_bytes()));
      std::uint64_t ver;
      std::memcpy(&ver, v.data() + v.size() - 8, 8);
      vmax = std::max(vmax, ver);
      ++n;
    }
    EMBCACHE_RETURN_IF_ERROR(from_rocksdb(it->status(), who + ": recount"));
    count = n;
    max_version = std::max(max_version, vmax);
    return {};
  }

  // Sorted (stable) sortable keys and their batch positions.
  void sort_keys(const Key* keys, std::size_t n, std::vector<std::uint64_t>& su,
                 std::vector<std::uint32_t>& pos) const {
    su.resize(n);
    pos.resize(n);
    detail::for_each_index(options.space, n, [&](std::size_t i) {
      su[i] = sortable(keys[i]);
      pos[i] = static_cast<std::uint32_t>(i);
    });
    detail::stable_sort_by_key(options.space, su.data(), pos.data(), n);
  }

  // Keeps the last occurrence of each key (stable sort: the later position comes later).
  static std::size_t dedupe_keep_last(std::vector<std::uint64_t>& su,
                                      std::vector<std::uint32_t>& pos) {
    const std::size_t n = su.size();
    std::size_t m = 0;
    for (std::size_t j = 0; j < n; ++j) {
      if (j + 1 < n && su[j + 1] == su[j]) continue;
      su[m] = su[j];
      pos[m] = pos[j];
      ++m;
    }
    su.resize(m);
    pos.resize(m);
    return m;
  }

  // The checks every write makes, then the batch's keys sorted, each kept at its last
  // occurrence: `su` the sortable keys, `pos` their batch positions; returns how many.
  result<std::size_t> prepare_write(const Key* keys, std::size_t n, std::vector<std::uint64_t>& su,
                                    std::vector<std::uint32_t>& pos) {
    if (n >= 0xFFFFFFFFu) return status::invalid_argument(who + ": batch too large");
    EMBCACHE_RETURN_IF_ERROR(before_write());
    sort_keys(keys, n, su, pos);
    return dedupe_keep_last(su, pos);
  }

  // Runs f(begin, end) over batches of batch_keys sorted keys in parallel.
  template <class F>
  void for_batches(std::size_t n, const F& f) const {
    for_batches(n, options.batch_keys, f);
  }

  template <class F>
  void for_batches(std::size_t n, std::size_t batch_keys, const F& f) const {
    const std::size_t b = std::max<std::size_t>(1, batch_keys);
    const std::size_t batches = (n + b - 1) / b;
    if (batches <= 1) {
      if (n) f(0, n);
      return;
    }
    detail::run_in_space(options.space, [&] {
      tbb::parallel_for(std::size_t{0}, batches,
                        [&](std::size_t i) { f(i * b, std::min(n, (i + 1) * b)); });
    });
  }

  // Like for_batches over batches of `batch` keys, for reads: with read_threads set, that many
  // threads take batches in turn (they block on the disk, not on the cores).
  template <class F>
  void for_read_batches(std::size_t n, std::size_t batch, const F& f) const {
    const std::size_t b = std::max<std::size_t>(1, batch);
    const std::size_t batches = (n + b - 1) / b;
    if (options.read_threads <= 0 || batches <= 1) return for_batches(n, b, f);
    std::atomic<std::size_t> next{0};
    auto work = [&] {
      for (std::size_t i; (i = next.fetch_add(1)) < batches;) f(i * b, std::min(n, (i + 1) * b));
    };
    const std::size_t threads =
        std::min<std::size_t>(static_cast<std::size_t>(options.read_threads), batches);
    std::vector<std::thread> pool;
    pool.reserve(threads - 1);
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
  }

  // MultiGet of sorted keys su[begin, end); g(j, status, value) for each.
  template <class G>
  void multi_get(const std::uint64_t* su, std::size_t begin, std::size_t end, const G& g) const {
    const std::size_t k = end - begin;
    std::vector<char> kb(k * sizeof(Key));
    std::vector<rocksdb::Slice> slices(k);
    std::vector<rocksdb::PinnableSlice> values(k);
    std::vector<rocksdb::Status> sts(k);
    for (std::size_t j = 0; j < k; ++j) {
      encode_key<Key>(su[begin + j], kb.data() + j * sizeof(Key));
      slices[j] = rocksdb::Slice(kb.data() + j * sizeof(Key), sizeof(Key));
    }
    rocksdb::ReadOptions ro;
    db->db->MultiGet(ro, cf, k, slices.data(), values.data(), sts.data(), true);
    for (std::size_t j = 0; j < k; ++j) g(begin + j, sts[j], values[j]);
  }

  // A probe's readahead at most: a sparse probe's seeks each read this much per sorted run
  // (none, RocksDB's own readahead, took 7 s for a probe of 256 keys of a 30M-row table).
  static constexpr std::size_t probe_readahead_bytes = std::size_t{32} << 10;

  // The scan of sorted keys su[begin, end): an iterator over their range, which moves to each
  // key by steps, or by a seek after rocksdb_scan_steps_per_lookup steps; g as multi_get's.
  template <class G>
  void scan_get(const std::uint64_t* su, std::size_t begin, std::size_t end, const G& g,
                bool probe = false) {
    constexpr std::uint64_t top =
        sizeof(Key) >= 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * sizeof(Key))) - 1;
    char bound[sizeof(Key)];
    rocksdb::Slice bound_slice(bound, sizeof(Key));
    rocksdb::ReadOptions ro;
    ro.fill_cache = false;  // the range's blocks would push the index and filters out
    // A probe may be sparse: each of its seeks reads a window ahead, so a small one.
    ro.readahead_size = probe ? std::min(options.scan_readahead_bytes, probe_readahead_bytes)
                              : options.scan_readahead_bytes;
    if (su[end - 1] != top) {
      encode_key<Key>(su[end - 1] + 1, bound);
      ro.iterate_upper_bound = &bound_slice;
    }
    std::unique_ptr<rocksdb::Iterator> it(db->db->NewIterator(ro, cf));
    const rocksdb::Slice none;
    const rocksdb::Status missing = rocksdb::Status::NotFound();
    std::uint64_t steps = 0, seeks = 0;
    // The iterator's key, as a sortable key; a key of another size is the table's corruption.
    std::uint64_t at = 0;
    bool valid = false;
    rocksdb::Status bad;
    const auto settle = [&] {
      valid = it->Valid();
      if (!valid) return;
      if (it->key().size() != sizeof(Key)) {
        bad = rocksdb::Status::Corruption("a key of " + std::to_string(it->key().size()) +
                                          " bytes, expected " + std::to_string(sizeof(Key)));
        valid = false;
        return;
      }
      at = decode_key<Key>(it->key().data());
    };
    char kb[sizeof(Key)];
    for (std::size_t j = begin; j < end; ++j) {
      const std::uint64_t want = su[j];
      if (j == begin) {
        encode_key<Key>(want, kb);
        it->Seek(rocksdb::Slice(kb, sizeof(Key)));
        settle();
      }
      for (std::uint32_t k = 0; valid && at < want; ++k) {
        if (k == rocksdb_scan_steps_per_lookup) {
          encode_key<Key>(want, kb);
          it->Seek(rocksdb::Slice(kb, sizeof(Key)));
          ++seeks;
        } else {
          it->Next();
          ++steps;
        }
        settle();
      }
      if (!bad.ok())
        g(j, bad, none);
      else if (!it->status().ok())
        g(j, it->status(), none);
      else if (valid && at == want)
        g(j, rocksdb::Status::OK(), it->value());
      else
        g(j, missing, none);
    }
    note_scan(end - begin, steps, seeks, probe);
  }

  // What pull() and contains() read (read_counts()), and the scans' cost per key in thousandths
  // of a step (each seek counted as rocksdb_scan_steps_per_lookup steps): an average that
  // weighs the latest batch by a quarter, or a probe's alone; unknown until the first scan.
  static constexpr std::uint32_t scan_cost_unknown = 0xFFFFFFFFu;
  std::atomic<std::uint32_t> scan_cost{scan_cost_unknown};
  std::atomic<std::uint32_t> calls_since_probe{0};
  std::atomic<std::uint64_t> keys_looked_up{0}, keys_scanned{0}, scan_steps{0}, scan_seeks{0};

  void note_scan(std::size_t keys, std::uint64_t steps, std::uint64_t seeks, bool probe) {
    keys_scanned += keys;
    scan_steps += steps;
    scan_seeks += seeks;
    const double per_key =
        (double(steps) + double(seeks) * rocksdb_scan_steps_per_lookup) / double(keys);
    const auto now = static_cast<std::uint32_t>(std::min(per_key * 1000.0, 4.0e9));
    std::uint32_t old = scan_cost.load();
    std::uint32_t next;
    do {
      next = old == scan_cost_unknown || probe
                 ? now
                 : static_cast<std::uint32_t>((std::uint64_t{old} * 3 + now) / 4);
    } while (!scan_cost.compare_exchange_weak(old, next));
  }

  // Whether scans have cost less than point lookups.
  bool scan_pays() const { return scan_cost.load() < rocksdb_scan_steps_per_lookup * 1000u; }

  // Reads the sorted keys su[0, n) as read_path says; g(j, status, value) for each j, on any
  // thread. With read_path automatic, the first call, and once in rocksdb_scan_probe_interval
  // calls one that would look its keys up, scans its first rocksdb_scan_probe_keys keys alone (a
  // probe, with a small readahead) and reads the rest by what that cost: a table that became
  // dense, or sparse, is noticed.
  template <class G>
  void read_sorted(const std::uint64_t* su, std::size_t n, const G& g) {
    std::size_t done = 0;
    if (options.read_path == rocksdb_read_path::automatic &&
        (scan_cost.load() == scan_cost_unknown ||
         (!scan_pays() && calls_since_probe.fetch_add(1) + 1 >= rocksdb_scan_probe_interval))) {
      calls_since_probe = 0;
      done = std::min<std::size_t>(n, rocksdb_scan_probe_keys);
      scan_get(su, 0, done, g, true);
    }
    const bool scan = options.read_path == rocksdb_read_path::scan ||
                      (options.read_path == rocksdb_read_path::automatic && scan_pays());
    if (scan) {
      for_read_batches(n - done, options.scan_batch_keys, [&](std::size_t b, std::size_t e) {
        scan_get(su, done + b, done + e, g);
      });
    } else {
      for_read_batches(n - done, options.batch_keys, [&](std::size_t b, std::size_t e) {
        multi_get(su, done + b, done + e, g);
      });
      keys_looked_up += n - done;
    }
  }
};

template <class Key>
rocksdb_store<Key>::rocksdb_store(std::shared_ptr<rocksdb_database> db, std::unique_ptr<state> st)
    : db_(std::move(db)), state_(std::move(st)) {}

template <class Key>
rocksdb_store<Key>::~rocksdb_store() {
  if (!state_) return;
  (void)flush();  // errors surface through an explicit flush() before destruction
  std::lock_guard<std::mutex> lock(state_->db->mutex);
  state_->db->open_tables.erase(state_->options.table_name);
}

template <class Key>
result<std::unique_ptr<rocksdb_store<Key>>> rocksdb_store<Key>::open(
    const rocksdb_store_options& options) {
  auto db = rocksdb_database::open(options);
  if (!db.ok()) return db.get_status();
  return open(std::move(db).value(), options);
}

template <class Key>
result<std::unique_ptr<rocksdb_store<Key>>> rocksdb_store<Key>::open(
    std::shared_ptr<rocksdb_database> db, const rocksdb_store_options& options) {
  if (!db) throw error(status_code::invalid_argument, "rocksdb_store::open: null database");
  auto& d = db->get_impl();
  const std::string who =
      "rocksdb_store::open of table '" + options.table_name + "' in '" + d.path + "'";
  if (options.table_name.empty() || options.table_name == rocksdb::kDefaultColumnFamilyName)
    return status::invalid_argument(who + ": the table name must be set and not be 'default'");
  if (options.row_width == 0) return status::invalid_argument(who + ": row_width must be > 0");
  EMBCACHE_RETURN_IF_ERROR(check_tuning(options, who));
  if (options.dim > options.row_width)
    return status::invalid_argument(who + ": dim " + std::to_string(options.dim) +
                                    " exceeds row_width " + std::to_string(options.row_width));
  auto st = std::make_unique<state>();
  st->options = options;
  st->db = &d;
  st->who = "rocksdb_store of table '" + options.table_name + "' in '" + d.path + "'";
  st->schema.set_key_type(key_type_name<Key>());
  st->schema.dim = options.dim ? options.dim : options.row_width;
  st->schema.state_width = options.row_width - st->schema.dim;
  st->schema.row_width = options.row_width;
  st->schema.optimizer = options.optimizer.empty() ? "none" : options.optimizer;
  st->schema.format_version = meta_format_version;
  std::lock_guard<std::mutex> lock(d.mutex);
  if (d.open_tables.count(options.table_name))
    return status::invalid_argument(who + ": the table is already open in this process");
  auto it = d.cfs.find(options.table_name);
  if (it == d.cfs.end()) {
    if (!options.create_if_missing) {
      std::string have;
      for (auto& [n, h] : d.cfs) have += (have.empty() ? "" : ", ") + n;
      return status::not_found(who + ": no such table (the database holds: " +
                               (have.empty() ? std::string("none") : have) + ")");
    }
    rocksdb::ColumnFamilyHandle* h = nullptr;
    st->block_bytes = derived_block_bytes(options, options.row_width);
    EMBCACHE_RETURN_IF_ERROR(
        from_rocksdb(d.db->CreateColumnFamily(d.cf_options(st->block_bytes), options.table_name, &h),
                     who + ": creating the column family"));
    d.cfs.emplace(options.table_name, h);
    d.block_bytes[options.table_name] = st->block_bytes;
    st->cf = h;
    EMBCACHE_RETURN_IF_ERROR(st->write_meta(false));
  } else {
    st->cf = it->second;
    std::string text;
    rocksdb::Status s = d.db->Get(rocksdb::ReadOptions(), d.default_cf(), st->meta_key(), &text);
    if (s.IsNotFound())
      return status::corruption(who + ": the column family has no metadata entry '" +
                                st->meta_key() + "'");
    EMBCACHE_RETURN_IF_ERROR(from_rocksdb(s, who + ": reading the metadata entry"));
    auto m = nlohmann::json::parse(text, nullptr, false);
    auto bad = [&](const char* what) {
      return status::corruption(who + ": metadata entry '" + st->meta_key() + "' " + what);
    };
    if (m.is_discarded() || !m.is_object()) return bad("is not valid JSON");
    for (const char* f : {"key_type", "format"})
      if (!m.contains(f) || !m[f].is_string()) return bad((std::string("lacks ") + f).c_str());
    for (const char* f : {"format_version", "row_width", "count", "max_version"})
      if (!m.contains(f) || !m[f].is_number_unsigned())
        return bad((std::string("lacks ") + f).c_str());
    if (m["format"] != meta_format) return bad("has an unknown format");
    table_schema have;
    have.set_key_type(m["key_type"].get<std::string>());
    have.row_width = m["row_width"].get<std::size_t>();
    have.format_version = m["format_version"].get<std::uint64_t>();
    if (have.format_version > std::uint64_t{meta_format_version})
      return status::unsupported(who + ": metadata entry '" + st->meta_key() +
                                 "' has format_version " + std::to_string(have.format_version) +
                                 ", this build reads up to " + std::to_string(meta_format_version));
    const bool has_schema = have.format_version >= 2;
    if (has_schema) {
      for (const char* f : {"dim", "state_width"})
        if (!m.contains(f) || !m[f].is_number_unsigned())
          return bad((std::string("lacks ") + f).c_str());
      if (!m.contains("optimizer") || !m["optimizer"].is_string()) return bad("lacks optimizer");
      have.dim = m["dim"].get<std::size_t>();
      have.state_width = m["state_width"].get<std::size_t>();
      have.optimizer = m["optimizer"].get<std::string>();
      if (!have.same_layout(st->schema)) {
        const table_schema& want = st->schema;
        std::string diff = "same row width, another layout";
        if (have.keys != want.keys)
          diff = "it holds " + have.key_name + " keys, expected " + want.key_name;
        else if (have.row_width != want.row_width)
          diff = "it holds rows of " + std::to_string(have.row_width) + " floats, expected " +
                 std::to_string(want.row_width);
        return status::invalid_argument(who + ": " + diff + "; the table was created with schema " +
                                        have.text() + ", the caller expects " + want.text());
      }
    } else if (have.keys != st->schema.keys || have.row_width != options.row_width) {
      return status::invalid_argument(who + ": the table holds " + have.key_name +
                                      " keys and rows of " + std::to_string(have.row_width) +
                                      " floats, the caller expects " + st->schema.text());
    }
    rocksdb::ReadOptions probe;
    probe.fill_cache = false;
    std::unique_ptr<rocksdb::Iterator> first(d.db->NewIterator(probe, st->cf));
    first->SeekToFirst();
    EMBCACHE_RETURN_IF_ERROR(from_rocksdb(first->status(), who + ": reading the first row"));
    const bool empty = !first->Valid();
    std::string first_key;
    if (!empty && first->key().size() == sizeof(Key))
      first_key = key_text(from_sortable<Key>(decode_key<Key>(first->key().data())));
    first.reset();
    if (!empty && !has_schema)
      return status::unsupported(
          who +
          ": the table holds rows written by a build that recorded no schema (metadata "
          "format_version 1: " +
          have.key_name + " keys, rows of " + std::to_string(have.row_width) +
          " floats); they cannot be checked against the caller's schema " + st->schema.text() +
          "; copy them into a new table");
    if (!empty && options.existing_rows == existing_rows_policy::refuse)
      return status::invalid_argument(
          who + ": the table already holds rows (the first is key " + first_key +
          "), from an earlier run; set existing_rows = reuse to use them (the trainer: "
          "resume_from, or tables[i].reuse_store), or open another path");
    st->block_bytes = d.block_bytes.at(options.table_name);
    if (options.block_bytes != 0 && options.block_bytes != st->block_bytes)
      return status::invalid_argument(
          who + ": the table's SST data blocks are " + std::to_string(st->block_bytes) +
          " bytes, set when it was created; block_bytes " + std::to_string(options.block_bytes) +
          " cannot change them (0 keeps them)");
    st->count = m["count"].get<std::size_t>();
    st->max_version = m["max_version"].get<std::uint64_t>();
    st->count_stale = !m.value("count_exact", true);
    if (m.value("dirty", false)) {
      // The last session ended without a flush: what reached the disk is a prefix of its
      // writes, so the stored count may be stale.
      EMBCACHE_RETURN_IF_ERROR(st->recount());
      st->count_stale = false;
      EMBCACHE_RETURN_IF_ERROR(st->write_meta(false));
    } else if (!has_schema) {
      EMBCACHE_RETURN_IF_ERROR(st->write_meta(false));  // an empty table takes the caller's schema
    }
  }
  d.open_tables.insert(options.table_name);
  return std::unique_ptr<rocksdb_store<Key>>(new rocksdb_store<Key>(std::move(db), std::move(st)));
}

}  // namespace embcache
