// Dataset folders: file names, the dataset_writer that fills a staging folder, and publishing it
// in place of the output folder.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "common/durable_file.hpp"
#include "dataset_files.hpp"
#include "embcache/keyset.hpp"
#include "embcache/shard.hpp"
#include "flat_set.hpp"
#include "schema_json.hpp"

namespace embcache {

namespace fs = std::filesystem;

// ---- dataset folders ------------------------------------------------------------------------

namespace {
std::string numbered(std::size_t index, const char* suffix) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "shard-%05zu%s", index, suffix);
  return buf;
}
}  // namespace

std::string shard_file_name(std::size_t index) { return numbered(index, ".bin"); }
std::string keyset_file_name(std::size_t index) { return numbered(index, ".keys"); }
std::string crossed_keyset_file_name(std::size_t index) { return numbered(index, ".cross.keys"); }

namespace {

// Temporaries of durable_file_writer for our files: "<name>.tmp.<pid>.<counter>".
bool is_our_temp_name(const std::string& name) {
  static const std::regex tmp(
      R"((shard-\d{5,}\.(bin|keys|cross\.keys)|manifest\.json)\.tmp\.\d+\.\d+)");
  return std::regex_match(name, tmp);
}

bool is_our_name(const std::string& name) {
  static const std::regex ours(R"(shard-\d{5,}\.(bin|keys|cross\.keys)|manifest\.json)");
  return std::regex_match(name, ours);
}

bool all_digits(const std::string& s, std::size_t from, std::size_t to) {
  if (from >= to) return false;
  for (std::size_t i = from; i < to; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return true;
}

// Staging folders of a dataset named `name`: ".<name>.new.<pid>.<n>" (and ".<name>.old.<pid>.<n>"
// where the folder swap falls back to two renames).
bool is_staging_name(const std::string& entry, const std::string& name) {
  for (const char* kind : {".new.", ".old."}) {
    const std::string prefix = "." + name + kind;
    if (entry.size() <= prefix.size() || entry.compare(0, prefix.size(), prefix) != 0) continue;
    const std::size_t dot = entry.find('.', prefix.size());
    if (dot != std::string::npos && all_digits(entry, prefix.size(), dot) &&
        all_digits(entry, dot + 1, entry.size())) {
      return true;
    }
  }
  return false;
}

// Removes the files named like ours (and their temporaries) from `dir`; the folder itself goes
// only when nothing else is left in it, so nothing but our own files is ever deleted.
void remove_our_files(const fs::path& dir, bool remove_dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string n = entry.path().filename().string();
    if (is_our_name(n) || is_our_temp_name(n)) fs::remove(entry.path(), ec);
  }
  if (remove_dir) fs::remove(dir, ec);  // fails, harmlessly, when something else is left
}

struct dataset_paths {
  fs::path dir;     // the final folder, absolute
  fs::path parent;  // its parent
  std::string name;
};

result<dataset_paths> resolve_output(const std::string& output_dir) {
  std::error_code ec;
  fs::path abs = fs::absolute(fs::path(output_dir), ec).lexically_normal();
  if (ec) return status::io_error("output folder '" + output_dir + "': " + ec.message());
  if (!abs.has_filename()) abs = abs.parent_path();
  // An output folder given as a symbolic link is followed: the dataset is written into (and
  // swapped in at) the folder it points to; the link itself is never replaced.
  abs = fs::path(detail::output_folder_of(abs.string()));
  if (!abs.has_filename()) abs = abs.parent_path();
  if (!abs.has_filename() || abs.filename() == "..") {
    return status::invalid_argument("output folder '" + output_dir +
                                    "': expected a folder with a name inside a parent folder");
  }
  return dataset_paths{abs, abs.parent_path(), abs.filename().string()};
}

}  // namespace

std::string dataset_lock_path(const std::string& output_dir) {
  auto p = resolve_output(output_dir);
  if (!p.ok()) return output_dir + ".lock";
  return (p.value().parent / ("." + p.value().name + ".lock")).string();
}

struct dataset_writer::impl {
  dataset_writer_options opts;
  dataset_paths paths;
  fs::path stage;  // where the files are written until finish() moves them into place
  detail::file_lock lock;
  bool published = false;
  dataset_summary summary;
  std::unique_ptr<shard_writer> shard;
  detail::flat_key_set shard_keys{1 << 16};
  detail::flat_key_set shard_crossed{1 << 12};
  std::vector<detail::flat_key_set> slot_keys;
  detail::flat_key_set all_crossed{1 << 12};
  double label_sum = 0;
  bool finished = false;

  ~impl() {
    shard.reset();  // removes its temporary
    if (!published && !stage.empty()) {
      std::error_code ec;
      fs::remove_all(stage, ec);  // only our files are ever in it before publishing
    }
  }

  std::string in_stage(const std::string& name) const { return (stage / name).string(); }
  std::string in_dir(const std::string& name) const { return (paths.dir / name).string(); }

  status close_shard() {
    if (!shard) return {};
    const std::size_t index = summary.shards.size();
    shard_files files;
    files.rows = shard->rows();
    files.shard = in_dir(shard_file_name(index));
    EMBCACHE_RETURN_IF_ERROR(shard->finish());
    shard.reset();
    std::vector<std::int64_t> keys;
    keys.reserve(shard_keys.size());
    shard_keys.for_each([&](std::int64_t k, std::uint32_t) { keys.push_back(k); });
    files.keyset = in_dir(keyset_file_name(index));
    files.has_key_counts = true;
    files.keys = keys.size();
    EMBCACHE_RETURN_IF_ERROR(
        write_keyset(in_stage(keyset_file_name(index)), keys.data(), keys.size(), opts.keyset));
    shard_keys.clear();
    if (opts.num_crossed) {
      keys.clear();
      shard_crossed.for_each([&](std::int64_t k, std::uint32_t) { keys.push_back(k); });
      files.crossed_keyset = in_dir(crossed_keyset_file_name(index));
      files.crossed_keys = keys.size();
      EMBCACHE_RETURN_IF_ERROR(write_keyset(in_stage(crossed_keyset_file_name(index)), keys.data(),
                                            keys.size(), opts.keyset));
      shard_crossed.clear();
    }
    summary.shards.push_back(std::move(files));
    return {};
  }

  // Moves the complete staged dataset into place. An existing folder is swapped with the
  // staged one in one step (renameat2 RENAME_EXCHANGE); what it held besides a dataset is
  // carried over (hard links, or a move for sub-folders) and the old dataset is removed last.
  status publish() {
    const fs::path& dir = paths.dir;
    std::error_code ec;
    EMBCACHE_RETURN_IF_ERROR(detail::sync_folder(stage.string()));
    if (!fs::exists(dir, ec)) {
      if (std::rename(stage.c_str(), dir.c_str()) != 0) {
        return detail::errno_status("cannot rename the finished dataset to", dir.string(), errno);
      }
      published = true;
      EMBCACHE_RETURN_IF_ERROR(detail::sync_folder(paths.parent.string()));
      return {};
    }
    std::vector<fs::path> folders;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string n = entry.path().filename().string();
      if (is_our_name(n) || is_our_temp_name(n)) continue;
      std::error_code e;
      if (entry.is_directory(e) && !entry.is_symlink(e)) {
        folders.push_back(entry.path());
        continue;
      }
      fs::create_hard_link(entry.path(), stage / n, e);
      if (e && entry.is_symlink(e)) {
        e.clear();
        fs::copy_symlink(entry.path(), stage / n, e);
      } else if (e) {
        e.clear();
        fs::copy_file(entry.path(), stage / n, e);
      }
      if (e) {
        return status::io_error("cannot carry '" + entry.path().string() +
                                "' over into the new dataset: " + e.message());
      }
    }
    if (ec) {
      return status::io_error("cannot list output folder '" + dir.string() + "': " + ec.message());
    }
    fs::path old = stage;  // after the exchange the staging name holds the old folder
    if (::renameat2(AT_FDCWD, stage.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
      if (errno != EINVAL && errno != ENOSYS) {
        return detail::errno_status("cannot swap the finished dataset into", dir.string(), errno);
      }
      // No atomic exchange on this file system: two renames, the old folder kept until the
      // new one is in place.
      std::string tail = stage.filename().string();
      tail.replace(tail.rfind(".new."), 5, ".old.");
      old = paths.parent / tail;
      if (std::rename(dir.c_str(), old.c_str()) != 0) {
        return detail::errno_status("cannot move the old dataset aside from", dir.string(), errno);
      }
      if (std::rename(stage.c_str(), dir.c_str()) != 0) {
        status s =
            detail::errno_status("cannot rename the finished dataset to", dir.string(), errno);
        (void)std::rename(old.c_str(), dir.c_str());
        return s;
      }
    }
    published = true;
    // The folders of the old dataset are carried over even when the sync fails: nothing of
    // the user's may stay behind in the old folder.
    const status synced = detail::sync_folder(paths.parent.string());
    bool moved_all = true;
    for (const fs::path& f : folders) {
      const fs::path from = old / f.filename();
      if (std::rename(from.c_str(), (dir / f.filename()).c_str()) != 0) moved_all = false;
    }
    if (!moved_all) {
      return status::io_error("dataset written to '" + dir.string() +
                              "', but some folders of the old one stay in '" + old.string() + "'");
    }
    // Only our files and duplicates (links or copies) of the carried-over files are left.
    fs::remove_all(old, ec);
    return synced;
  }
};

dataset_writer::dataset_writer() : impl_(std::make_unique<impl>()) {}
dataset_writer::~dataset_writer() = default;

result<std::unique_ptr<dataset_writer>> dataset_writer::create(const dataset_writer_options& opts) {
  if (opts.output_dir.empty()) return status::invalid_argument("dataset_writer: no output folder");
  if (opts.rows_per_shard == 0) {
    return status::invalid_argument("dataset_writer: rows_per_shard must be at least 1");
  }
  EMBCACHE_RETURN_IF_ERROR(validate(opts.schema, "dataset_writer_options.schema"));
  auto paths_or = resolve_output(opts.output_dir);
  if (!paths_or.ok()) return paths_or.get_status();
  const dataset_paths& paths = paths_or.value();
  std::error_code ec;
  fs::create_directories(paths.parent, ec);
  if (ec) {
    return status::io_error("cannot create the parent of output folder '" + opts.output_dir +
                            "': " + ec.message());
  }
  if (fs::exists(paths.dir, ec) && !fs::is_directory(paths.dir, ec)) {
    return status::invalid_argument("output folder '" + opts.output_dir +
                                    "' exists and is not a folder");
  }
  std::unique_ptr<dataset_writer> w(new dataset_writer());
  impl& m = *w->impl_;
  m.opts = opts;
  m.paths = paths;
  EMBCACHE_RETURN_IF_ERROR(m.lock.try_lock((paths.parent / ("." + paths.name + ".lock")).string(),
                                           "output folder '" + opts.output_dir + "'"));
  if (!opts.overwrite && fs::exists(paths.dir / detail::dataset_manifest_file, ec)) {
    return status::invalid_argument("output folder '" + opts.output_dir +
                                    "' already holds a dataset (manifest.json); choose another "
                                    "folder or allow overwriting");
  }
  // Holding the lock, nothing else writes here: temporaries and staging folders are leftovers
  // of a run that crashed.
  if (fs::is_directory(paths.dir, ec)) {
    for (const auto& entry : fs::directory_iterator(paths.dir, ec)) {
      if (is_our_temp_name(entry.path().filename().string())) {
        std::error_code e;
        fs::remove(entry.path(), e);
      }
    }
  }
  for (const auto& entry : fs::directory_iterator(paths.parent, ec)) {
    std::error_code e;
    if (is_staging_name(entry.path().filename().string(), paths.name) && entry.is_directory(e) &&
        !entry.is_symlink(e)) {
      remove_our_files(entry.path(), true);
    }
  }
  // A fresh name: a leftover that could not be cleaned (it holds something not ours) stays.
  static std::atomic<std::uint64_t> counter{0};
  for (int attempt = 0;; ++attempt) {
    m.stage = paths.parent / ("." + paths.name + ".new." + std::to_string(::getpid()) + "." +
                              std::to_string(counter++));
    if (fs::create_directory(m.stage, ec)) break;
    if (ec || attempt == 100) {
      m.stage.clear();
      return status::io_error("cannot create a staging folder beside output folder '" +
                              opts.output_dir + "': " + (ec ? ec.message() : "names taken"));
    }
  }
  m.summary.num_crossed = opts.num_crossed;
  m.summary.keyset = opts.keyset;
  m.summary.schema = opts.schema;
  m.summary.has_unique_stats = opts.unique_stats;
  if (opts.unique_stats) {
    m.slot_keys.assign(opts.schema.num_categorical(), detail::flat_key_set(1 << 10));
  }
  return w;
}

status dataset_writer::append(const criteo_sample& s, const std::int64_t* crossed) {
  if (!impl_->opts.schema.is_criteo()) {
    throw error(status_code::invalid_argument,
                "dataset_writer: append of a criteo_sample with a schema other than Criteo's");
  }
  return append_row(s.label, s.dense.data(), s.keys.data(), crossed);
}

status dataset_writer::append_row(float label, const float* dense, const std::int64_t* keys,
                                  const std::int64_t* crossed) {
  impl& m = *impl_;
  if (m.finished) throw error(status_code::invalid_argument, "dataset_writer: append after finish");
  const std::size_t slots = m.opts.schema.num_categorical();
  if (!m.shard) {
    auto w = shard_writer::create(m.in_stage(shard_file_name(m.summary.shards.size())),
                                  m.opts.num_crossed, m.opts.schema.num_dense(), slots);
    if (!w.ok()) return w.get_status();
    m.shard = std::move(w).value();
  }
  EMBCACHE_RETURN_IF_ERROR(m.shard->append_row(label, dense, keys, crossed));
  for (std::size_t j = 0; j < slots; ++j) m.shard_keys.add(keys[j]);
  for (std::size_t j = 0; j < m.opts.num_crossed; ++j) m.shard_crossed.add(crossed[j]);
  if (m.opts.unique_stats) {
    for (std::size_t j = 0; j < slots; ++j) m.slot_keys[j].add(keys[j]);
    for (std::size_t j = 0; j < m.opts.num_crossed; ++j) m.all_crossed.add(crossed[j]);
  }
  m.label_sum += label;
  ++m.summary.rows;
  if (m.shard->rows() == m.opts.rows_per_shard) return m.close_shard();
  return {};
}

status dataset_writer::finish(std::vector<std::pair<std::string, std::string>> producer) {
  impl& m = *impl_;
  if (m.finished) throw error(status_code::invalid_argument, "dataset_writer: finish twice");
  m.finished = true;
  EMBCACHE_RETURN_IF_ERROR(m.close_shard());
  dataset_summary& s = m.summary;
  s.label_mean = s.rows ? m.label_sum / static_cast<double>(s.rows) : 0.0;
  if (m.opts.unique_stats) {
    s.unique_keys.clear();
    for (const auto& keys : m.slot_keys) s.unique_keys.push_back(keys.size());
    s.unique_crossed_keys = m.all_crossed.size();
    m.slot_keys.clear();
  }
  s.producer = std::move(producer);

  nlohmann::ordered_json j;
  j["format"] = "embcache-dataset";
  j["version"] = 1;
  j["rows"] = s.rows;
  j["label_mean"] = s.label_mean;
  j["dense_count"] = s.schema.num_dense();
  j["slot_count"] = s.schema.num_categorical();
  j["crossed_per_row"] = s.num_crossed;
  // Criteo's schema is the one a manifest without "schema" has: its manifests stay as they were.
  if (!s.schema.is_criteo()) j["schema"] = detail::schema_to_json(s.schema);
  j["keyset_format"] = to_string(s.keyset);
  j["key_type"] = key_type_name<std::int64_t>();
  if (s.has_unique_stats) {
    j["unique_keys_per_slot"] = s.unique_keys;
    j["unique_crossed_keys"] = s.unique_crossed_keys;
  }
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  for (const auto& f : s.shards) {
    nlohmann::ordered_json e;
    e["file"] = fs::path(f.shard).filename().string();
    e["rows"] = f.rows;
    e["keyset"] = fs::path(f.keyset).filename().string();
    if (!f.crossed_keyset.empty()) {
      e["crossed_keyset"] = fs::path(f.crossed_keyset).filename().string();
    }
    e["keys"] = f.keys;
    if (!f.crossed_keyset.empty()) e["crossed_keys"] = f.crossed_keys;
    shards.push_back(std::move(e));
  }
  j["shards"] = std::move(shards);
  nlohmann::ordered_json prod = nlohmann::ordered_json::object();
  for (const auto& [k, v] : s.producer) prod[k] = v;
  j["producer"] = std::move(prod);
  const std::string text = j.dump(2) + "\n";
  detail::durable_file_writer out;
  EMBCACHE_RETURN_IF_ERROR(out.open(m.in_stage(detail::dataset_manifest_file)));
  EMBCACHE_RETURN_IF_ERROR(out.write(text.data(), text.size()));
  EMBCACHE_RETURN_IF_ERROR(out.commit());
  status published = m.publish();
  m.lock.unlock();
  return published;
}

const dataset_summary& dataset_writer::summary() const noexcept { return impl_->summary; }

}  // namespace embcache
