// Applying deltas to a base model folder: which deltas follow the base, the rows merged in memory,
// the result written beside the base and swapped in atomically.
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>

#include "common/durable_file.hpp"
#include "embcache/optimizers.hpp"
#include "embcache/serving.hpp"
#include "embcache/training_cache.hpp"
#include "format/checked_io.hpp"

namespace embcache {

namespace {

namespace fs = std::filesystem;

std::string seq_name(std::uint64_t s) { return "delta-" + std::to_string(s); }

// Overwrites the base's rows with `d`'s and deletes its tombstones; rows stay sorted by key.
void merge_table(folder_table& b, const folder_table& d, bool keep_state, apply_report* report) {
  const std::size_t dim = b.dim, sw = keep_state ? b.state_width : 0;
  std::vector<std::int64_t> erased = d.erased;
  std::sort(erased.begin(), erased.end());
  // Source of every output row: (key, from delta?, index); the delta's row wins a tie.
  struct src {
    std::int64_t key;
    bool delta;
    std::size_t i;
  };
  std::vector<src> all;
  all.reserve(b.keys.size() + d.keys.size());
  for (std::size_t i = 0; i < b.keys.size(); ++i) {
    if (std::binary_search(erased.begin(), erased.end(), b.keys[i])) {
      ++report->rows_erased;
      continue;
    }
    all.push_back({b.keys[i], false, i});
  }
  for (std::size_t i = 0; i < d.keys.size(); ++i) all.push_back({d.keys[i], true, i});
  std::stable_sort(all.begin(), all.end(), [](const src& x, const src& y) {
    return x.key != y.key ? x.key < y.key : (!x.delta && y.delta);
  });
  folder_table out;
  // Slot ids: a delta row's own (a delta carries them when each of its rows had one), else the
  // base's for a row it overwrites (a key's slot never changes); a base row keeps its own. Rows
  // with none are counted, and `slot_id` is written only when every row has one.
  const bool base_slots = !b.slot_ids.empty() && b.slot_ids.size() == b.keys.size();
  const bool delta_slots = !d.slot_ids.empty() && d.slot_ids.size() == d.keys.size();
  const bool track = base_slots || delta_slots;
  std::uint64_t no_slot = 0;
  const std::uint64_t* overwritten_slot = nullptr;
  for (std::size_t j = 0; j < all.size(); ++j) {
    if (j + 1 < all.size() && all[j + 1].key == all[j].key) {  // the delta's is next
      overwritten_slot = base_slots ? &b.slot_ids[all[j].i] : nullptr;
      continue;
    }
    const src& s = all[j];
    const folder_table& from = s.delta ? d : b;
    if (track) {
      const std::uint64_t* slot = s.delta      ? (delta_slots ? &d.slot_ids[s.i] : overwritten_slot)
                                  : base_slots ? &b.slot_ids[s.i]
                                               : nullptr;
      if (slot) {
        out.slot_ids.push_back(*slot);
      } else {
        ++no_slot;
      }
    }
    overwritten_slot = nullptr;
    out.keys.push_back(s.key);
    out.versions.push_back(from.versions[s.i]);
    out.vectors.insert(out.vectors.end(), from.vectors.begin() + s.i * dim,
                       from.vectors.begin() + (s.i + 1) * dim);
    if (sw) {
      out.states.insert(out.states.end(), from.states.begin() + s.i * sw,
                        from.states.begin() + (s.i + 1) * sw);
    }
  }
  report->rows_written += d.keys.size();
  b.keys = std::move(out.keys);
  b.vectors = std::move(out.vectors);
  b.states = std::move(out.states);
  b.versions = std::move(out.versions);
  if (track) b.rows_without_slot_id = no_slot;  // exact: the merged rows without one
  b.slot_ids = track && no_slot == 0 ? std::move(out.slot_ids) : std::vector<std::uint64_t>{};
  if (!keep_state) b.state_width = 0;
}

template <class T>
status write_array(const std::string& path, const std::vector<T>& v, nlohmann::json* files,
                   const char* name) {
  detail::durable_file_writer w;
  EMBCACHE_RETURN_IF_ERROR(w.open(path, detail::file_placement::in_staged_folder));
  EMBCACHE_RETURN_IF_ERROR(w.write(v.data(), v.size() * sizeof(T)));
  EMBCACHE_RETURN_IF_ERROR(w.commit());
  (*files)[name] = {{"bytes", w.bytes()}, {"xxh64", detail::hex64(w.digest())}};
  return {};
}

// The optimizer state of `t` as save() writes it: HugeCTR's files of its optimizer, each one
// dim-wide part of the row's state; nothing for a state width of 0 (sgd, or a serving-only model).
status write_state(const std::string& folder, const folder_table& t, nlohmann::json* files) {
  if (t.state_width == 0) return {};
  optimizer_kind kind{};
  const auto names = optimizer_kind_from_string(t.optimizer, &kind) ? hugectr_state_files(kind)
                                                                    : std::vector<const char*>{};
  if (names.size() * t.dim != t.state_width) {
    return status::invalid_argument("table '" + t.name + "': state width " +
                                    std::to_string(t.state_width) + " does not match optimizer " +
                                    t.optimizer + " and dim " + std::to_string(t.dim));
  }
  std::vector<float> part(t.keys.size() * t.dim);
  for (std::size_t p = 0; p < names.size(); ++p) {
    for (std::size_t i = 0; i < t.keys.size(); ++i) {
      const auto row = t.states.begin() + i * t.state_width + p * t.dim;
      std::copy(row, row + t.dim, part.begin() + i * t.dim);
    }
    EMBCACHE_RETURN_IF_ERROR(write_array(folder + "/" + names[p], part, files, names[p]));
  }
  return {};
}

// Writes `m` as save() does (plus applied_delta) into the new, empty folder `dir`, every file
// and folder fsynced.
status write_model(const std::string& dir, const model_folder& m) {
  std::error_code ec;
  nlohmann::json tables = nlohmann::json::array();
  for (const folder_table& t : m.tables) {
    const std::string folder = dir + "/" + t.name;
    if (!fs::create_directory(folder, ec)) {
      return status::io_error("cannot create '" + folder + "': " + ec.message());
    }
    nlohmann::json files = nlohmann::json::object();
    EMBCACHE_RETURN_IF_ERROR(write_array(folder + "/key", t.keys, &files, "key"));
    EMBCACHE_RETURN_IF_ERROR(write_array(folder + "/emb_vector", t.vectors, &files, "emb_vector"));
    EMBCACHE_RETURN_IF_ERROR(write_array(folder + "/version", t.versions, &files, "version"));
    EMBCACHE_RETURN_IF_ERROR(write_state(folder, t, &files));
    if (!t.slot_ids.empty()) {
      EMBCACHE_RETURN_IF_ERROR(write_array(folder + "/slot_id", t.slot_ids, &files, "slot_id"));
    }
    EMBCACHE_RETURN_IF_ERROR(detail::sync_folder(folder));
    tables.push_back({{"name", t.name},
                      {"dim", t.dim},
                      {"state_width", t.state_width},
                      {"optimizer", t.optimizer},
                      {"count", t.keys.size()},
                      {"version", t.version},
                      {"files", files}});
    if (t.rows_without_slot_id > 0) tables.back()["rows_without_slot_id"] = t.rows_without_slot_id;
  }
  nlohmann::json manifest = {{"format", "embcache-model"},
                             {"format_version", model_format_version},
                             {"key_type", to_string(m.key_type)},
                             {"applied_delta", m.sequence},
                             {"tables", tables}};
  if (!m.run_id.empty()) manifest["run_id"] = m.run_id;
  const std::string text = manifest.dump(2);
  detail::durable_file_writer w;
  EMBCACHE_RETURN_IF_ERROR(
      w.open(dir + "/manifest.json", detail::file_placement::in_staged_folder));
  EMBCACHE_RETURN_IF_ERROR(w.write(text.data(), text.size()));
  return w.commit();
}

}  // namespace

model_position position_of(const model_folder& model) {
  model_position p;
  p.applied_delta = model.sequence;
  for (const auto& t : model.tables) p.versions.emplace_back(t.name, t.version);
  return p;
}

result<std::vector<delta_entry>> plan_deltas(const model_position& position,
                                             const std::vector<delta_entry>& deltas,
                                             std::uint64_t until) {
  if (until < position.applied_delta) {
    return status::invalid_argument("the model is at delta " +
                                    std::to_string(position.applied_delta) + ", past --until " +
                                    std::to_string(until) + " (deltas cannot be taken back)");
  }
  std::vector<delta_entry> out;
  for (const delta_entry& e : deltas) {
    if (e.sequence <= position.applied_delta || e.sequence > until) continue;
    const std::uint64_t want =
        out.empty() ? (position.applied_delta ? position.applied_delta + 1 : e.sequence)
                    : out.back().sequence + 1;
    if (e.sequence != want) {
      return status::invalid_argument("gap in the deltas: " + seq_name(want) +
                                      " is missing before '" + e.path + "'");
    }
    out.push_back(e);
  }
  return out;
}

status advance_position(model_position& position, const model_folder& delta,
                        std::vector<bool>* apply) {
  if (delta.tables.size() != position.versions.size()) {
    return status::invalid_argument("'" + delta.path + "' has " +
                                    std::to_string(delta.tables.size()) + " tables, the model " +
                                    std::to_string(position.versions.size()));
  }
  std::vector<bool> flags(delta.tables.size());
  std::vector<std::uint64_t> next(position.versions.size());
  for (std::size_t i = 0; i < position.versions.size(); ++i) next[i] = position.versions[i].second;
  for (std::size_t t = 0; t < delta.tables.size(); ++t) {
    const folder_table& d = delta.tables[t];
    const auto it = std::find_if(position.versions.begin(), position.versions.end(),
                                 [&](const auto& v) { return v.first == d.name; });
    if (it == position.versions.end()) {
      return status::invalid_argument("'" + delta.path + "' has table '" + d.name +
                                      "', which the model does not have");
    }
    const std::uint64_t at = it->second;
    if (d.version <= at) continue;  // already contained: the model was saved after this export
    if (d.since_version > at) {
      return status::invalid_argument(
          "gap before '" + delta.path + "': table '" + d.name + "' holds changes after version " +
          std::to_string(d.since_version) + ", the model only up to version " + std::to_string(at) +
          " (a delta is missing or the model is older than the deltas)");
    }
    flags[t] = true;
    next[static_cast<std::size_t>(it - position.versions.begin())] = d.version;
  }
  for (std::size_t i = 0; i < next.size(); ++i) position.versions[i].second = next[i];
  position.applied_delta = delta.sequence;
  if (apply) *apply = std::move(flags);
  return {};
}

result<apply_report> apply_deltas(const std::string& base_in, const std::string& deltas_dir,
                                  const apply_options& options) {
  apply_report report;
  const std::string dir = model_folder_of(detail::strip_slashes(base_in));
  const std::string output = detail::strip_slashes(options.output);
  const bool in_place = output.empty() || output == dir;
  // The folder written: the base, or the output (the base is then only read).
  const std::string target = in_place ? dir : output;
  report.model_dir = target;
  detail::file_lock lock;
  const std::string lock_path =
      detail::parent_dir(target) + "/." + fs::path(target).filename().string() + ".apply.lock";
  EMBCACHE_RETURN_IF_ERROR(lock.try_lock(lock_path, "model folder '" + target + "'"));
  auto base = read_base(dir);
  if (!base.ok()) return base.get_status().with_context("apply: base");
  model_folder& m = base.value();
  if (m.sharded && in_place)
    return status::invalid_argument("apply: base '" + m.path +
                                    "' is a sharded save, which is not rewritten in place: name "
                                    "the model folder to write (apply_options::output, --output)");
  if (!in_place) {
    std::error_code ec;
    if (fs::exists(output, ec) && !fs::exists(output + "/manifest.json", ec))
      return status::invalid_argument("apply: output '" + output +
                                      "' exists and is not a model folder (no manifest.json); "
                                      "it is replaced only when it is one");
  }
  report.from_delta = report.applied_delta = m.sequence;
  if (deltas_dir.empty() && in_place)
    return status::invalid_argument("apply: no deltas folder, and no output to write the base to");
  std::vector<delta_entry> listed;
  if (!deltas_dir.empty()) {
    auto l = list_deltas(deltas_dir);
    if (!l.ok()) return l.get_status().with_context("apply");
    listed = std::move(l).value();
  }
  model_position pos = position_of(m);
  auto plan = plan_deltas(pos, listed, options.until);
  if (!plan.ok()) return plan.get_status().with_context("apply: base '" + m.path + "'");
  // Read, check and merge everything in memory before anything is written.
  for (const delta_entry& e : plan.value()) {
    auto d = read_delta(e.path);
    if (!d.ok()) return d.get_status().with_context("apply");
    if (d.value().sequence != e.sequence) {
      return status::corruption(
          "apply: '" + e.path + (d.value().sharded ? "'" : "/manifest.json'") + " has sequence " +
          std::to_string(d.value().sequence) + ", its name " + std::to_string(e.sequence));
    }
    if (d.value().key_type != m.key_type) {
      return status::invalid_argument("apply: '" + e.path + "' holds " +
                                      to_string(d.value().key_type) + " keys, the base " +
                                      to_string(m.key_type));
    }
    // Another run's delta would mix two models; a side without an identity (written by an
    // earlier version) is not checked, and the result takes the first identity it meets.
    const std::string& run = d.value().run_id;
    if (!run.empty() && !m.run_id.empty() && run != m.run_id) {
      return status::invalid_argument("apply: '" + e.path + "' belongs to run " + run +
                                      ", the base '" + m.path + "' to run " + m.run_id +
                                      " (deltas of different runs do not mix)");
    }
    report.run_unchecked = report.run_unchecked || run.empty() || m.run_id.empty();
    if (m.run_id.empty()) m.run_id = run;
    std::vector<bool> apply;
    EMBCACHE_RETURN_IF_ERROR(advance_position(pos, d.value(), &apply).with_context("apply"));
    for (std::size_t t = 0; t < apply.size(); ++t) {
      const folder_table& dt = d.value().tables[t];
      folder_table& bt = *std::find_if(m.tables.begin(), m.tables.end(),
                                       [&](const folder_table& x) { return x.name == dt.name; });
      if (dt.dim != bt.dim || dt.optimizer != bt.optimizer) {
        return status::invalid_argument("apply: table '" + dt.name + "' of '" + e.path +
                                        "' has dim " + std::to_string(dt.dim) + ", optimizer " +
                                        dt.optimizer + "; the base " + std::to_string(bt.dim) +
                                        ", " + bt.optimizer);
      }
      if (dt.state_width > 0 && bt.state_width > 0 && dt.state_width != bt.state_width) {
        return status::invalid_argument("apply: table '" + dt.name + "' of '" + e.path +
                                        "' has state width " + std::to_string(dt.state_width) +
                                        ", the base " + std::to_string(bt.state_width));
      }
      if (!apply[t]) continue;
      const bool keep_state = dt.state_width == bt.state_width;
      report.state_dropped = report.state_dropped || (bt.state_width > 0 && !keep_state);
      merge_table(bt, dt, keep_state, &report);
      bt.version = dt.version;
    }
    m.sequence = e.sequence;
    report.deltas.push_back(e.sequence);
  }
  report.applied_delta = m.sequence;
  if (report.deltas.empty() && in_place) return report;
  // Removed on every failure (a full disk): no partial `<target>.tmp` stays behind.
  detail::staging_folder staging;
  EMBCACHE_RETURN_IF_ERROR(
      staging.create(detail::staging_folder_of(target)).with_context("apply: writing the result"));
  EMBCACHE_RETURN_IF_ERROR(
      write_model(staging.path(), m).with_context("apply: writing the result"));
  EMBCACHE_RETURN_IF_ERROR(staging.publish(target).with_context("apply"));
  report.changed = true;
  return report;
}

}  // namespace embcache
