// Save and load of the training cache, through the model-folder module (model_folder.hpp): the
// cache contributes its stores, version clocks and known slot ids to a save, and on load checks
// the folder against its tables and replaces every store's rows once everything is validated.
#pragma once

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <new>

#include "common/durable_file.hpp"
#include "format/checked_io.hpp"
#include "format/model_folder.hpp"
#include "training/training_cache_core.hpp"

namespace embcache::detail {

template <class Key, class Space>
status training_cache_core<Key, Space>::save(const std::string& dir,
                                             const save_progress& on_progress) {
  std::vector<stored_table<Key>> stored;
  // The worker is joined and the write-behind done (end_training): the stores hold still.
  std::vector<std::unique_lock<std::mutex>> locks;
  std::vector<std::vector<std::uint32_t>> admission(tables.size());
  for (auto& tb : tables) {
    locks.emplace_back(*tb.sync.store_mutex);
    trim_step_versions(tb.expiry, tb.opt.expiry.ttl_steps);  // the values the rule still reads
    admission[tb.index] = tb.admission.to_words();  // empty (no file) when admission is off
    stored.push_back({tb.opt.name, tb.opt.dim, tb.opt.optimizer.kind, tb.sync.store.get(),
                      tb.cache->version(), &tb.slot_ids, tb.opt.slot_of, &admission[tb.index],
                      tb.opt.expiry.enabled() ? &tb.expiry : nullptr});
  }
  return write_model_folder(dir, stored, on_progress, run_id);
}

// Reads every table of `dir` (a save, or a plain HugeCTR folder when allowed) and checks it
// against `tables` before anything changes.
template <class Key, class Space>
status read_model_for(const std::vector<table_state<Key, Space>>& tables, const std::string& dir,
                      const load_options& options, std::vector<table_rows>* data,
                      std::string* run_id, std::vector<std::vector<std::uint32_t>>* admission) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return status::not_found("load: folder '" + dir + "' does not exist");
  }
  const std::string manifest_path = dir + "/manifest.json";
  data->assign(tables.size(), table_rows{});
  admission->assign(tables.size(), {});
  if (fs::exists(manifest_path, ec)) {
    auto m = read_folder_manifest(dir, folder_kind::model);
    if (!m.ok()) return m.get_status().with_context("load");
    *run_id = m.value().run_id;
    std::vector<table_schema> schemas;
    for (const auto& tb : tables) {
      schemas.push_back({tb.opt.name, tb.opt.dim, tb.state_width, tb.opt.optimizer.kind});
    }
    std::vector<std::size_t> order;
    EMBCACHE_RETURN_IF_ERROR(match_schema(m.value(), key_type_of<Key>(), schemas, &order)
                                 .with_context("load"));
    for (std::size_t t = 0; t < tables.size(); ++t) {
      const manifest_table& mt = m.value().tables[order[t]];
      EMBCACHE_RETURN_IF_ERROR(read_listed_table(m.value(), mt, &(*data)[t]).with_context("load"));
      // Feature admission's counts, when this table counts and the save has them.
      const admission_sketch& sketch = tables[t].admission;
      if (sketch.enabled() && mt.files.contains("admission")) {
        auto& words = (*admission)[t];
        EMBCACHE_RETURN_IF_ERROR(
            read_listed_words(m.value(), mt, "admission", sketch.word_count(), &words)
                .with_context("load"));
        EMBCACHE_RETURN_IF_ERROR(sketch
                                     .check_words(words.data(), words.size(),
                                                  m.value().dir + "/" + mt.name + "/admission")
                                     .with_context("load"));
      }
    }
  } else if (!options.allow_hugectr_folder) {
    return status::not_found(
        "load: '" + manifest_path +
        "' is missing; a folder written by save() always has it (without it the optimizer state "
        "and the checksums would be dropped). To load a plain HugeCTR folder, pass "
        "load_options::allow_hugectr_folder");
  } else {
    // A plain HugeCTR sparse model folder per table.
    for (std::size_t t = 0; t < tables.size(); ++t) {
      const auto& tb = tables[t];
      std::string folder = dir + "/" + tb.opt.name;
      if (!fs::exists(folder + "/key") && tables.size() == 1 && fs::exists(dir + "/key")) {
        folder = dir;
      }
      EMBCACHE_RETURN_IF_ERROR(
          read_hugectr_table(folder, tb.opt.dim, tb.opt.optimizer.kind, &(*data)[t])
              .with_context("load: table '" + tb.opt.name + "'"));
    }
  }
  row_rules rules;
  rules.allow_duplicate_keys = options.allow_duplicate_keys;
  rules.allow_non_finite = options.allow_non_finite;
  rules.key_type = key_type_of<Key>();
  rules.duplicate_hint = " (load_options::allow_duplicate_keys keeps the last occurrence)";
  rules.non_finite_hint = " (load_options::allow_non_finite accepts them)";
  for (std::size_t t = 0; t < tables.size(); ++t) {
    EMBCACHE_RETURN_IF_ERROR(check_table_rows((*data)[t], tables[t].opt.dim, rules)
                                 .with_context("load: table '" + tables[t].opt.name + "'"));
  }
  return {};
}

template <class Key, class Space>
status training_cache_core<Key, Space>::load(const std::string& dir_in,
                                             const load_options& options) {
  // A save interrupted between its two renames left the complete folder as `dir.old`.
  const std::string dir = published_folder(strip_slashes(dir_in), "manifest.json");
  std::vector<table_rows> data;
  std::string loaded_run;
  std::vector<std::vector<std::uint32_t>> admission;
  EMBCACHE_RETURN_IF_ERROR(read_model_for(tables, dir, options, &data, &loaded_run, &admission));
  if (!loaded_run.empty()) run_id = loaded_run;  // a resumed run keeps its identity
  // Validated: replace the rows (write-behind rows of the old model would land on the new one).
  drop_staging();
  discard_write_behind();
  for (std::size_t t = 0; t < tables.size(); ++t) {
    auto& tb = tables[t];
    const table_rows& L = data[t];
    ++tb.book.residency;
    // A CUDA failure throws in the space code; here it is load's status.
    EMBCACHE_RETURN_IF_ERROR(
        guarded([&]() -> status {
          tb.cache->clear();
          return {};
        }).with_context("load: clearing the cache of table '" + tb.opt.name + "'"));
    std::vector<Key> old;
    {
      std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
      EMBCACHE_RETURN_IF_ERROR(tb.sync.store->for_each(
          65536, [&](const Key* k, const float*, const std::uint64_t*, std::size_t n) {
            old.insert(old.end(), k, k + n);
            return status{};
          }));
      EMBCACHE_RETURN_IF_ERROR(tb.sync.store->erase(old.data(), old.size()));
    }
    const std::size_t n = L.keys.size(), w = tb.row_width, dim = tb.opt.dim;
    // Pushed in chunks of write_back_bytes: the rows with their state are built a chunk at a time.
    const std::size_t chunk = std::min(write_back_chunk_rows(tb), std::max<std::size_t>(n, 1));
    std::vector<Key> keys;
    std::vector<float> rows;
    try {
      keys.reserve(chunk);
      rows.resize(chunk * w);
    } catch (const std::bad_alloc&) {
      // chunk <= n rows of dim floats are in memory already (L.vectors): chunk * w cannot overflow.
      return host_allocation_failed(
          "load: " + std::to_string(chunk) + " rows of table '" + tb.opt.name + "'",
          chunk * (sizeof(Key) + w * sizeof(float)));
    }
    std::uint64_t maxv = L.version;
    // Admission counts on from the save's counts, or from zero (every loaded row is admitted).
    tb.admission.clear();
    if (!admission[t].empty()) {
      EMBCACHE_RETURN_IF_ERROR(
          tb.admission.from_words(admission[t].data(), admission[t].size(), dir));
    }
    tb.slot_ids.clear();
    for (std::size_t b = 0; b < n; b += chunk) {
      const std::size_t m = std::min(chunk, n - b);
      keys.assign(L.keys.begin() + static_cast<std::ptrdiff_t>(b),
                  L.keys.begin() + static_cast<std::ptrdiff_t>(b + m));
      for (std::size_t j = 0; j < m; ++j) {
        const std::size_t i = b + j;
        float* row = rows.data() + j * w;
        std::memcpy(row, L.vectors.data() + i * dim, dim * sizeof(float));
        if (L.parts.empty()) {
          if (tb.state_width) initialize_state(tb.opt.optimizer, dim, row + dim);
        } else {
          std::memcpy(row + dim, L.states.data() + i * L.state_width,
                      L.state_width * sizeof(float));
        }
        maxv = std::max(maxv, L.versions[i]);
        if (L.has_slot_ids) tb.slot_ids[keys[j]] = L.slot_ids[i];
      }
      EMBCACHE_RETURN_IF_ERROR(push(tb, keys.data(), m, rows.data(), L.versions.data() + b));
    }
    {
      std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
      EMBCACHE_RETURN_IF_ERROR(tb.sync.store->flush());
    }
    tb.cache->advance_version(maxv);
    // The expiry clock of the save (its boundaries are the run's), else counting starts anew.
    tb.expiry = L.has_expiry ? L.expiry : expiry_clock{};
    tb.exports.last_version = tb.cache->version();
    tb.exports.clear_written();
    tb.exports.erased.clear();
  }
  return {};
}

// The clock and the export point of rows that reached the stores without the cache.
template <class Key, class Space>
status training_cache_core<Key, Space>::adopt_stores() {
  wait_worker();  // its early installs change which rows are resident
  for (const auto& tb : tables) {
    if (tb.cache->size() != 0) {
      return status::invalid_argument("adopt_stores: table '" + tb.opt.name + "' holds " +
                                      std::to_string(tb.cache->size()) +
                                      " resident rows (erase them before the stores change)");
    }
  }
  drop_staging();  // staged rows may predate the stores' new rows
  EMBCACHE_RETURN_IF_ERROR(finish_write_behind());
  for (auto& tb : tables) {
    std::lock_guard<std::mutex> install_lock(*tb.sync.install_mutex);
    std::uint64_t stored = 0;
    {
      std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
      stored = tb.sync.store->max_version();
    }
    tb.cache->advance_version(stored);
    tb.exports.last_version = tb.cache->version();
    tb.exports.clear_written();
    tb.exports.erased.clear();
  }
  return {};
}

// Rows pushed into the stores from outside the cache (host-hybrid): logged as written, so that
// the next export takes them from the store, and the version clock moved up to them.
template <class Key, class Space>
status training_cache_core<Key, Space>::adopt_store_writes() {
  for (const auto& tb : tables) {
    if (tb.cache->size() != 0) {
      return status::invalid_argument("adopt_store_writes: table '" + tb.opt.name + "' holds " +
                                      std::to_string(tb.cache->size()) +
                                      " resident rows (its rows must be in its store only)");
    }
  }
  EMBCACHE_RETURN_IF_ERROR(finish_write_behind());
  const std::size_t batch = std::max<std::size_t>(options.prefetch_batch, 1);
  for (auto& tb : tables) {
    std::lock_guard<std::mutex> install_lock(*tb.sync.install_mutex);
    auto& ex = tb.exports;
    std::uint64_t stored = 0;
    {
      std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
      // Rows logged by an earlier call and not pushed since are in the log already.
      const std::uint64_t since = std::max(ex.last_version, ex.logged_version);
      EMBCACHE_RETURN_IF_ERROR(tb.sync.store->for_each_changed_since(
          since, batch, [&](const Key* k, const float*, const std::uint64_t*, std::size_t n) {
            ex.note_written(k, k + n);
            return status{};
          }));
      stored = tb.sync.store->max_version();
    }
    tb.cache->advance_version(stored);
    ex.logged_version = std::max(ex.logged_version, stored);
    ex.compact_if_grown();
  }
  return {};
}

}  // namespace embcache::detail
