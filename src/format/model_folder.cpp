// The model-folder module (model_folder.hpp). This file writes: table folders streamed in batches
// through durable files, the manifest, and the save of tables straight from their stores; the
// reading side is model_folder_read.inl, included at the end (one translation unit).
#include "format/model_folder.hpp"

#include <algorithm>
#include <filesystem>
#include <random>
#include <utility>

#include "common/durable_file.hpp"
#include "format/checked_io.hpp"

namespace embcache::detail {

namespace fs = std::filesystem;

std::string new_run_id() {
  std::random_device rd;
  const auto word = [&] { return (std::uint64_t{rd()} << 32) | std::uint64_t{rd()}; };
  return hex64(word()) + hex64(word());
}

bool is_run_id(const std::string& text) {
  return text.size() == 32 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

state_layout hugectr_state_layout(optimizer_kind optimizer, std::size_t dim) {
  state_layout s;
  for (const char* name : hugectr_state_files(optimizer)) s.files.emplace_back(name);
  s.part_width = dim;
  return s;
}

state_layout opt_state_layout(bool with_state, std::size_t state_width) {
  state_layout s;
  if (with_state) s.files.emplace_back("opt_state");
  s.part_width = state_width;
  return s;
}

table_folder_writer::table_folder_writer() = default;
table_folder_writer::~table_folder_writer() = default;

status table_folder_writer::open(const std::string& folder, std::size_t dim,
                                 const state_layout& state, bool with_slot_ids, bool with_erased) {
  folder_ = folder;
  dim_ = dim;
  state_ = state;
  slot_ids_ = with_slot_ids;
  erased_ = with_erased;
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) return status::io_error("cannot create '" + folder + "': " + ec.message());
  // The order of the files: key, emb_vector, version, state files, slot_id, erased.
  names_ = {"key", "emb_vector", "version"};
  names_.insert(names_.end(), state.files.begin(), state.files.end());
  if (with_slot_ids) names_.emplace_back("slot_id");
  if (with_erased) names_.emplace_back("erased");
  files_.clear();
  for (const auto& name : names_) {
    files_.push_back(std::make_unique<durable_file_writer>());
    EMBCACHE_RETURN_IF_ERROR(
        files_.back()->open(folder + "/" + name, file_placement::in_staged_folder));
  }
  return {};
}

status table_folder_writer::write_gathered(durable_file_writer& w, const float* src,
                                           std::size_t stride, std::size_t width, std::size_t n) {
  if (stride == width) return w.write(src, n * width * sizeof(float));
  scratch_.resize(n * width);
  for (std::size_t i = 0; i < n; ++i) {
    std::copy(src + i * stride, src + i * stride + width, scratch_.begin() + i * width);
  }
  return w.write(scratch_.data(), n * width * sizeof(float));
}

status table_folder_writer::append(const std::int64_t* keys, const float* emb,
                                   std::size_t emb_stride, const float* state,
                                   std::size_t state_stride, const std::uint64_t* versions,
                                   const std::uint64_t* slot_ids, std::size_t n) {
  if (n == 0) return {};
  EMBCACHE_RETURN_IF_ERROR(file(0).write(keys, n * sizeof(std::int64_t)));
  EMBCACHE_RETURN_IF_ERROR(write_gathered(file(1), emb, emb_stride, dim_, n));
  EMBCACHE_RETURN_IF_ERROR(file(2).write(versions, n * sizeof(std::uint64_t)));
  const std::size_t pw = state_.part_width;
  for (std::size_t p = 0; p < state_.files.size(); ++p) {
    EMBCACHE_RETURN_IF_ERROR(write_gathered(file(3 + p), state + p * pw, state_stride, pw, n));
  }
  if (slot_ids_) {
    EMBCACHE_RETURN_IF_ERROR(
        file(3 + state_.files.size()).write(slot_ids, n * sizeof(std::uint64_t)));
  }
  return {};
}

status table_folder_writer::append_erased(const std::int64_t* keys, std::size_t n) {
  if (!erased_) return status::internal("table_folder_writer: '" + folder_ + "' has no erased");
  return files_.back()->write(keys, n * sizeof(std::int64_t));
}

status table_folder_writer::finish(nlohmann::json* files) {
  for (std::size_t i = 0; i < files_.size(); ++i) {
    EMBCACHE_RETURN_IF_ERROR(files_[i]->commit());
    (*files)[names_[i]] = {{"bytes", files_[i]->bytes()}, {"xxh64", hex64(files_[i]->digest())}};
  }
  return sync_folder(folder_);
}

status write_manifest(const std::string& dir, const nlohmann::json& manifest) {
  const std::string text = manifest.dump(2);
  durable_file_writer w;
  EMBCACHE_RETURN_IF_ERROR(w.open(dir + "/manifest.json", file_placement::in_staged_folder));
  EMBCACHE_RETURN_IF_ERROR(w.write(text.data(), text.size()));
  return w.commit();
}

namespace {

// Rows pulled per batch while a table is written.
constexpr std::size_t save_batch_rows = 65536;

// The slot id save() writes for `key`, when one is known.
template <class Key>
bool slot_id_of(const stored_table<Key>& t, Key key, std::uint64_t* out) {
  return known_slot_id(t.slot_ids, t.slot_of, key, out);
}

// Writes the folder of one table from its store, in key order, and returns its manifest entry.
template <class Key>
status write_stored_table(const std::string& folder, const stored_table<Key>& t,
                          nlohmann::json* entry) {
  param_store<Key>& store = *t.store;
  std::vector<Key> keys;
  keys.reserve(store.size());
  EMBCACHE_RETURN_IF_ERROR(store.for_each(
      save_batch_rows, [&](const Key* k, const float*, const std::uint64_t*, std::size_t n) {
        keys.insert(keys.end(), k, k + n);
        return status{};
      }));
  std::sort(keys.begin(), keys.end());
  // `slot_id` only when every row has one: HugeCTR reads it as one slot per key.
  const bool any_slot_ids = (t.slot_ids && !t.slot_ids->empty()) || t.slot_of;
  std::size_t no_slot_id = 0;
  if (any_slot_ids) {
    std::uint64_t id = 0;
    for (const Key k : keys) no_slot_id += slot_id_of(t, k, &id) ? 0 : 1;
  }
  const bool with_slot_ids = any_slot_ids && no_slot_id == 0;
  const std::size_t dim = t.dim, w = store.row_width(), n = keys.size();
  table_folder_writer writer;
  EMBCACHE_RETURN_IF_ERROR(
      writer.open(folder, dim, hugectr_state_layout(t.optimizer, dim), with_slot_ids, false));
  const std::size_t batch = std::min(save_batch_rows, std::max<std::size_t>(n, 1));
  std::vector<float> rows(batch * w);
  std::vector<std::uint64_t> versions(batch), slot_ids(with_slot_ids ? batch : 0);
  std::vector<std::int64_t> k64(batch);
  std::unique_ptr<bool[]> found(new bool[batch]);
  for (std::size_t b = 0; b < n; b += batch) {
    const std::size_t m = std::min(batch, n - b);
    EMBCACHE_RETURN_IF_ERROR(
        store.pull(keys.data() + b, m, rows.data(), found.get(), versions.data()));
    for (std::size_t i = 0; i < m; ++i) {
      if (!found[i]) {
        return status::internal("save: key " + std::to_string(keys[b + i]) + " of table '" +
                                t.name + "' left its store during the save");
      }
      k64[i] = static_cast<std::int64_t>(keys[b + i]);  // HugeCTR's `key` is int64 for every type
      if (with_slot_ids) slot_id_of(t, keys[b + i], &slot_ids[i]);
    }
    EMBCACHE_RETURN_IF_ERROR(writer.append(k64.data(), rows.data(), w, rows.data() + dim, w,
                                           versions.data(), slot_ids.data(), m));
  }
  nlohmann::json files = nlohmann::json::object();
  if (t.admission && !t.admission->empty()) {
    durable_file_writer a;
    EMBCACHE_RETURN_IF_ERROR(a.open(folder + "/admission", file_placement::in_staged_folder));
    EMBCACHE_RETURN_IF_ERROR(
        a.write(t.admission->data(), t.admission->size() * sizeof(std::uint32_t)));
    EMBCACHE_RETURN_IF_ERROR(a.commit());
    files["admission"] = {{"bytes", a.bytes()}, {"xxh64", hex64(a.digest())}};
  }
  EMBCACHE_RETURN_IF_ERROR(writer.finish(&files));
  *entry = {{"name", t.name},
            {"dim", dim},
            {"state_width", w - dim},
            {"optimizer", to_string(t.optimizer)},
            {"count", n},
            {"version", t.version},
            {"files", files}};
  if (no_slot_id) (*entry)["rows_without_slot_id"] = no_slot_id;
  if (t.expiry) {
    (*entry)["expiry"] = {{"boundaries", t.expiry->boundaries},
                          {"pass_versions", t.expiry->versions}};
    if (t.expiry->steps != 0) {  // ttl_steps on: written once a step was begun
      (*entry)["expiry"]["steps"] = t.expiry->steps;
      (*entry)["expiry"]["step_versions"] = t.expiry->step_versions;
    }
  }
  return {};
}

}  // namespace

template <class Key>
status write_model_folder(const std::string& dir_in, const std::vector<stored_table<Key>>& tables,
                          const save_progress& on_progress, const std::string& run_id) {
  std::uint64_t rows_total = 0, rows_done = 0;
  for (const auto& t : tables) rows_total += t.store->size();
  if (on_progress) on_progress(0, rows_total);
  const std::string dir = strip_slashes(dir_in);
  // Removed on every failure below: a full disk leaves no partial folder.
  staging_folder staging;
  EMBCACHE_RETURN_IF_ERROR(staging.create(staging_folder_of(dir)));
  const std::string& staged = staging.path();
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& t : tables) {
    nlohmann::json entry;
    EMBCACHE_RETURN_IF_ERROR(write_stored_table(staged + "/" + t.name, t, &entry));
    rows_done += entry["count"].get<std::uint64_t>();
    entries.push_back(std::move(entry));
    if (on_progress) on_progress(rows_done, rows_total);
  }
  nlohmann::json manifest = {{"format", "embcache-model"},
                             {"format_version", model_format_version},
                             {"key_type", to_string(key_type_of<Key>())},
                             {"tables", entries}};
  if (!run_id.empty()) manifest["run_id"] = run_id;
  EMBCACHE_RETURN_IF_ERROR(write_manifest(staged, manifest));
  // `dir` is replaced as a whole: a crash at any point leaves the previous save loadable.
  return staging.publish(dir);
}

template <class Key>
status save_stores(const std::string& dir, const std::vector<table_options<Key>>& tables,
                   const save_progress& on_progress, const std::string& run_id) {
  std::vector<stored_table<Key>> stored;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const auto& o = tables[t];
    const std::string who = "save_stores: table " + std::to_string(t) + " '" + o.name + "'";
    if (!o.store) return status::invalid_argument(who + " has no store");
    const std::size_t width = o.dim + state_width(o.optimizer.kind, o.dim);
    if (o.dim == 0 || o.store->row_width() != width) {
      return status::invalid_argument(
          who + ": store row width " + std::to_string(o.store->row_width()) + ", dim " +
          std::to_string(o.dim) + " and optimizer " + to_string(o.optimizer.kind) + " need " +
          std::to_string(width));
    }
    EMBCACHE_RETURN_IF_ERROR(o.store->flush().with_context(who));
    stored.push_back({o.name, o.dim, o.optimizer.kind, o.store.get(), o.store->max_version(),
                      nullptr, o.slot_of, nullptr});
  }
  return write_model_folder(dir, stored, on_progress, run_id);
}

template status write_model_folder(const std::string&,
                                   const std::vector<stored_table<std::int64_t>>&,
                                   const save_progress&, const std::string&);
template status write_model_folder(const std::string&,
                                   const std::vector<stored_table<std::uint32_t>>&,
                                   const save_progress&, const std::string&);
template status save_stores(const std::string&, const std::vector<table_options<std::int64_t>>&,
                            const save_progress&, const std::string&);
template status save_stores(const std::string&, const std::vector<table_options<std::uint32_t>>&,
                            const save_progress&, const std::string&);

}  // namespace embcache::detail

#include "format/model_folder_read.inl"
