// Incremental export: the rows changed since the previous export (resident ones from the device,
// written-back ones from the store) and the keys erased since, as tables in memory or as a
// `delta-NNNNNN` folder written through the model-folder module.
#pragma once

#include <algorithm>
#include <filesystem>
#include <memory>
#include <mutex>

#include "common/durable_file.hpp"
#include "format/model_folder.hpp"
#include "training/training_cache_core.hpp"

namespace embcache::detail {

// Applies `marks` once the export they describe is delivered: its rows leave the logs.
template <class Key, class Space>
void training_cache_core<Key, Space>::commit_deltas(const std::vector<export_mark>& marks) {
  for (std::size_t t = 0; t < tables.size() && t < marks.size(); ++t) {
    auto& tb = tables[t];
    std::lock_guard<std::mutex> install_lock(*tb.sync.install_mutex);
    auto& e = tb.exports.erased;
    tb.exports.committed(marks[t].written);
    e.erase(e.begin(),
            e.begin() + static_cast<std::ptrdiff_t>(std::min(marks[t].erased, e.size())));
    tb.exports.last_version = marks[t].until_version;
  }
}

/// The rows changed since the last export, per table; changes nothing but records in `marks`
/// what commit_deltas() consumes once the export is delivered.
template <class Key, class Space>
result<std::vector<table_delta<Key>>> training_cache_core<Key, Space>::collect_deltas(
    bool with_state, std::vector<export_mark>* marks) {
  EMBCACHE_RETURN_IF_ERROR(finish_write_behind());
  std::vector<table_delta<Key>> out;
  marks->clear();
  for (auto& tb : tables) {
    std::lock_guard<std::mutex> install_lock(*tb.sync.install_mutex);
    table_delta<Key> d;
    d.table = tb.opt.name;
    d.dim = tb.opt.dim;
    d.state_width = with_state ? tb.state_width : 0;
    d.since_version = tb.exports.last_version;
    d.until_version = tb.cache->version();
    const auto f = export_filter::changed_since(d.since_version);
    // Host memory that cannot be allocated is a status of export_to_host; a CUDA failure throws
    // in the space code and becomes this call's status here.
    result<exported_rows<Key>> res = status::internal("export_to_host did not run");
    EMBCACHE_RETURN_IF_ERROR(guarded([&]() -> status {
                               res = tb.cache->export_to_host(f);
                               return res.get_status();
                             }).with_context("export of table '" + tb.opt.name + "'"));
    auto& ex = res.value();
    // Rows written back since the last export and not resident any more come from the store.
    std::vector<Key> written = tb.exports.written;
    export_mark mark;
    mark.until_version = d.until_version;
    mark.written = written.size();
    tb.exports.collected(mark.written);
    mark.erased = tb.exports.erased.size();
    std::sort(written.begin(), written.end());
    written.erase(std::unique(written.begin(), written.end()), written.end());
    std::vector<std::int64_t> slots(written.size());
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.lookup_slots(written.data(), written.size(), slots.data()));
    std::vector<Key> gone;
    for (std::size_t i = 0; i < written.size(); ++i) {
      if (slots[i] < 0) gone.push_back(written[i]);
    }
    const std::size_t w = tb.row_width;
    std::vector<float> gr(gone.size() * w);
    std::vector<std::uint64_t> gv(gone.size());
    std::unique_ptr<bool[]> gf(new bool[std::max<std::size_t>(gone.size(), 1)]);
    EMBCACHE_RETURN_IF_ERROR(pull(tb, gone.data(), gone.size(), gr.data(), gf.get(), gv.data()));
    // Merge both sorted sources.
    std::size_t i = 0, j = 0;
    auto emit = [&](Key k, const float* row, std::uint64_t v) {
      d.keys.push_back(k);
      d.vectors.insert(d.vectors.end(), row, row + d.dim);
      if (with_state) d.states.insert(d.states.end(), row + d.dim, row + w);
      d.versions.push_back(v);
    };
    while (i < ex.keys.size() || j < gone.size()) {
      if (j < gone.size() && (!gf[j] || gv[j] <= d.since_version)) {
        ++j;
        continue;
      }
      if (j == gone.size() || (i < ex.keys.size() && ex.keys[i] < gone[j])) {
        emit(ex.keys[i], ex.rows.data() + i * w, ex.versions[i]);
        ++i;
      } else {
        emit(gone[j], gr.data() + j * w, gv[j]);
        ++j;
      }
    }
    std::vector<Key> erased = tb.exports.erased;
    std::sort(erased.begin(), erased.end());
    erased.erase(std::unique(erased.begin(), erased.end()), erased.end());
    for (Key k : erased) {
      if (!std::binary_search(d.keys.begin(), d.keys.end(), k)) d.erased.push_back(k);
    }
    marks->push_back(mark);
    out.push_back(std::move(d));
  }
  return out;
}

// Writes one table of a delta into `folder` (keys as int64: HugeCTR's `key` is int64 for every
// key type) and returns the manifest entry of its files. `slot_id` goes with the rows when each of
// them has one (as a save writes it), so that a folder the deltas are applied to keeps them.
template <class Key>
status write_delta_table(const std::string& folder, const table_delta<Key>& d, bool with_state,
                         std::size_t state_width,
                         const std::unordered_map<Key, std::uint64_t>* known_slots,
                         const std::function<std::uint64_t(Key)>& slot_of, nlohmann::json* files) {
  std::vector<std::uint64_t> slot_ids(d.keys.size());
  bool with_slot_ids = !d.keys.empty() && ((known_slots && !known_slots->empty()) || slot_of);
  for (std::size_t i = 0; with_slot_ids && i < d.keys.size(); ++i)
    with_slot_ids = known_slot_id(known_slots, slot_of, d.keys[i], &slot_ids[i]);
  table_folder_writer w;
  EMBCACHE_RETURN_IF_ERROR(
      w.open(folder, d.dim, opt_state_layout(with_state, state_width), with_slot_ids, true));
  const std::vector<std::int64_t> k64(d.keys.begin(), d.keys.end());
  EMBCACHE_RETURN_IF_ERROR(w.append(k64.data(), d.vectors.data(), d.dim, d.states.data(),
                                    state_width, d.versions.data(),
                                    with_slot_ids ? slot_ids.data() : nullptr, k64.size()));
  const std::vector<std::int64_t> e64(d.erased.begin(), d.erased.end());
  EMBCACHE_RETURN_IF_ERROR(w.append_erased(e64.data(), e64.size()));
  return w.finish(files);
}

// export_incremental_to(): the next `delta-NNNNNN` of `dir`, staged as a hidden folder beside it
// and published whole; the logs are consumed only once it is in place.
template <class Key, class Space>
result<std::string> training_cache_core<Key, Space>::export_to_folder(const std::string& dir,
                                                                      bool with_state,
                                                                      std::uint64_t number) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return status::io_error("cannot create '" + dir + "': " + ec.message());
  int next = 1;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("delta-", 0) == 0 && name.size() == 12) {
      next = std::max(next, std::atoi(name.c_str() + 6) + 1);
    }
  }
  if (number != 0) {
    if (number < std::uint64_t(next) || number > 999999)
      return status::invalid_argument("export_incremental_to: delta number " +
                                      std::to_string(number) + " in '" + dir + "', which needs " +
                                      std::to_string(next) + " or more (and at most 999999)");
    next = static_cast<int>(number);
  }
  std::vector<export_mark> marks;
  auto deltas = collect_deltas(with_state, &marks);
  if (!deltas.ok()) return deltas.get_status();
  char name[32];
  std::snprintf(name, sizeof name, "delta-%06d", next);
  const std::string final_dir = dir + "/" + name;
  // Removed on every failure below: a full disk leaves no partial delta folder.
  staging_folder staging;
  EMBCACHE_RETURN_IF_ERROR(staging.create(dir + "/." + name + ".tmp"));
  const std::string& staged = staging.path();
  nlohmann::json manifest = {{"format", "embcache-delta"},
                             {"format_version", model_format_version},
                             {"key_type", to_string(key_type_of<Key>())},
                             {"sequence", next},
                             {"run_id", run_id}};
  nlohmann::json entries = nlohmann::json::array();
  for (std::size_t t = 0; t < deltas.value().size(); ++t) {
    const auto& d = deltas.value()[t];
    const auto& tb = tables[t];
    nlohmann::json files = nlohmann::json::object();
    EMBCACHE_RETURN_IF_ERROR(write_delta_table(staged + "/" + d.table, d, with_state,
                                               tb.state_width, &tb.slot_ids, tb.opt.slot_of,
                                               &files));
    entries.push_back({{"name", d.table},
                       {"dim", d.dim},
                       {"state_width", with_state ? tb.state_width : 0},
                       {"optimizer", to_string(tb.opt.optimizer.kind)},
                       {"count", d.keys.size()},
                       {"erased", d.erased.size()},
                       {"since_version", d.since_version},
                       {"until_version", d.until_version},
                       {"files", files}});
  }
  manifest["tables"] = entries;
  EMBCACHE_RETURN_IF_ERROR(write_manifest(staged, manifest));
  EMBCACHE_RETURN_IF_ERROR(staging.publish(final_dir));
  commit_deltas(marks);  // the delta is in place: its rows leave the logs
  return final_dir;
}

}  // namespace embcache::detail
