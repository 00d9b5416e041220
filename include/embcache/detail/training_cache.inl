/// @file detail/training_cache.inl
/// @brief Definitions of training_cache<Key, Space>. The orchestration (which rows stay, leave and
/// come, staging, write-behind, export, save and load) runs on the host in both spaces; it keeps
/// keys, slots and rows in host memory and reaches the device cache through `cache_io`, which in
/// the cuda space moves each call's arguments through device buffers and keeps the staging and
/// write-behind rows in pinned memory.
///
/// Included by exactly one translation unit per space, which instantiates it: the host space in
/// src/training/training_cache.cpp (library embcache), the cuda space in cuda/training_cache.cpp
/// (library embcache::cuda).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "embcache/buffer.hpp"
#include "embcache/detail/cache_ref.hpp"
#include "embcache/host_store.hpp"
#include "embcache/training_cache.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace embcache {

namespace fs = std::filesystem;

namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::uint64_t fold_seed(std::uint64_t seed, std::size_t table) {
  std::uint64_t x = seed ^ (0x9e3779b97f4a7c15ULL * (table + 1));
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ULL;
  return x ^ (x >> 29);
}

// Sorted unique copy, or the input itself when it already is (keyset files are).
template <class Key>
const std::vector<Key>& sorted_unique(const std::vector<Key>& in, std::vector<Key>& scratch) {
  bool ok = true;
  for (std::size_t i = 1; i < in.size() && ok; ++i) ok = in[i - 1] < in[i];
  if (ok) return in;
  scratch = in;
  std::sort(scratch.begin(), scratch.end());
  scratch.erase(std::unique(scratch.begin(), scratch.end()), scratch.end());
  return scratch;
}

// Keeps in `slots` the `need` rows to evict first: oldest version (least recently updated), then
// smallest key, so that the choice is deterministic.
template <class Ref>
void pick_oldest(const Ref& ref, std::vector<std::int64_t>& slots, std::size_t need) {
  if (need >= slots.size()) return;
  std::nth_element(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(need), slots.end(),
                   [&](std::int64_t a, std::int64_t b) {
                     return ref.versions[a] != ref.versions[b] ? ref.versions[a] < ref.versions[b]
                                                               : ref.keys[a] < ref.keys[b];
                   });
  slots.resize(need);
}

// --- the device cache seen from the host ------------------------------------------------------

// Host memory for rows on their way to or from the cache: pageable in the host space, pinned in
// the cuda space (so that copies to and from the device run at full speed and need no bounce).
template <class T, class Space>
struct staging_allocator {
  using value_type = T;
  staging_allocator() = default;
  template <class U>
  staging_allocator(const staging_allocator<U, Space>&) noexcept {}  // NOLINT
  T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_alloc();
    const std::size_t bytes = n * sizeof(T);
    if constexpr (is_cuda_space_v<Space>) {
      return static_cast<T*>(detail::cuda_allocate_pinned(bytes));
    } else {
      return static_cast<T*>(detail::host_allocate(bytes));
    }
  }
  void deallocate(T* p, std::size_t) noexcept {
    if constexpr (is_cuda_space_v<Space>) {
      detail::cuda_deallocate_pinned(p);
    } else {
      detail::host_deallocate(p);
    }
  }
  template <class U>
  bool operator==(const staging_allocator<U, Space>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const staging_allocator<U, Space>&) const noexcept {
    return false;
  }
};

// The status of an exception thrown by a CUDA call, an allocation or Thrust.
status status_of(const std::exception& e) {
  if (const auto* x = dynamic_cast<const error*>(&e)) return status(x->code(), x->what());
  if (dynamic_cast<const std::bad_alloc*>(&e)) return status::out_of_space(e.what());
  return status::internal(e.what());
}

// Runs `f` (returning a status), turning an exception into the status it stands for.
template <class F>
status guarded(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return status_of(e);
  }
}

// Slot metadata read on the host: states, keys and versions of every slot. In the host space it
// points at the table; in the cuda space it is a copy taken when it was made.
template <class Key>
struct slot_meta {
  slot_meta() = default;
  slot_meta(const slot_meta&) = delete;  // the pointers may aim at this object's vectors
  slot_meta& operator=(const slot_meta&) = delete;
  slot_meta(slot_meta&&) noexcept = default;  // a vector's move keeps its data where it is
  slot_meta& operator=(slot_meta&&) noexcept = default;
  const std::uint8_t* states = nullptr;
  const Key* keys = nullptr;
  const std::uint64_t* versions = nullptr;
  std::vector<std::uint8_t> states_copy;
  std::vector<Key> keys_copy;
  std::vector<std::uint64_t> versions_copy;
};

// The cache's bulk calls with every argument in host memory. The host space passes them through;
// the cuda space copies inputs into device buffers, runs the call on the cache's stream and copies
// outputs back (each call returns once its results are on the host); a CUDA failure there becomes
// the returned status instead of an exception.
template <class Key, class Space>
class cache_io {
 public:
  using cache_type = embedding_cache<Key, Space>;
  explicit cache_io(cache_type* cache = nullptr) : cache_(cache) {}

  status lookup_slots(const Key* keys, std::size_t n, std::int64_t* slots) {
    if constexpr (is_host_space_v<Space>) {
      return cache_->lookup_slots(keys, n, slots);
    } else {
      return guarded([&]() -> status {
        // Called even for n == 0: like the host space's, it takes an op (LRU scores stay equal).
        auto k = in(keys, n);
        buffer<std::int64_t, Space> s(n, space());
        EMBCACHE_RETURN_IF_ERROR(cache_->lookup_slots(k.data(), n, s.data()));
        s.copy_to_host(slots, n);
        return {};
      });
    }
  }
  status read_slots(const std::int64_t* slots, std::size_t n, float* rows) {
    if constexpr (is_host_space_v<Space>) {
      return cache_->read_slots(slots, n, rows), status{};
    } else {
      return guarded([&]() -> status {
        if (n == 0) return {};
        const std::size_t w = cache_->row_width();
        auto s = in(slots, n);
        buffer<float, Space> r(n * w, space());
        // Slots of -1 leave their rows untouched: start from the caller's rows.
        bool all = true;
        for (std::size_t i = 0; i < n && all; ++i) all = slots[i] >= 0;
        if (!all) r.copy_from_host(rows, n * w);
        cache_->read_slots(s.data(), n, r.data());
        r.copy_to_host(rows, n * w);
        return {};
      });
    }
  }
  status insert_or_assign(const Key* keys, std::size_t n, const float* rows,
                          const std::uint64_t* versions) {
    if constexpr (is_host_space_v<Space>) {
      return cache_->insert_or_assign(keys, n, rows, versions);
    } else {
      return guarded([&]() -> status {
        if (n == 0) return {};
        auto k = in(keys, n);
        auto r = in(rows, n * cache_->row_width());
        auto v = in(versions, n);
        return cache_->insert_or_assign(k.data(), n, r.data(), versions ? v.data() : nullptr);
      });
    }
  }
  status assign_slots(const std::int64_t* slots, std::size_t n, const float* rows) {
    if constexpr (is_host_space_v<Space>) {
      return cache_->assign_slots(slots, n, rows), status{};
    } else {
      return guarded([&]() -> status {
        if (n == 0) return {};
        auto s = in(slots, n);
        auto r = in(rows, n * cache_->row_width());
        return cache_->assign_slots(s.data(), n, r.data()), status{};
      });
    }
  }
  status erase(const Key* keys, std::size_t n) {
    if constexpr (is_host_space_v<Space>) {
      return cache_->erase(keys, n), status{};
    } else {
      return guarded([&]() -> status {
        if (n == 0) return {};
        auto k = in(keys, n);
        return cache_->erase(k.data(), n), status{};
      });
    }
  }
  // Keys and versions of the rows that pass `filter` (rows are not needed by the orchestration).
  status export_if(const export_filter& filter, Key* keys, float* rows, std::uint64_t* versions,
                   std::size_t max_out, std::size_t* count) {
    if constexpr (is_host_space_v<Space>) {
      return cache_->export_if(filter, keys, rows, versions, max_out, count);
    } else {
      return guarded([&]() -> status {
        if (rows) return status::internal("cache_io::export_if copies no rows");
        buffer<Key, Space> k(max_out, space());
        buffer<std::uint64_t, Space> v(max_out, space());
        EMBCACHE_RETURN_IF_ERROR(
            cache_->export_if(filter, k.data(), nullptr, v.data(), max_out, count));
        k.copy_to_host(keys, *count);
        if (versions) v.copy_to_host(versions, *count);
        return {};
      });
    }
  }
  status insert_and_evict(const Key* keys, std::size_t n, const float* rows_in,
                          const std::uint64_t* versions_in, Key* evicted_keys, float* evicted_rows,
                          std::uint64_t* evicted_versions, std::size_t* evicted_count,
                          bool* found_out, std::int64_t* slots_out) {
    if constexpr (is_host_space_v<Space>) {
      return cache_->insert_and_evict(keys, n, rows_in, versions_in, evicted_keys, evicted_rows,
                                      evicted_versions, evicted_count, found_out, slots_out);
    } else {
      return guarded([&]() -> status {
        *evicted_count = 0;
        if (n == 0) return {};
        const std::size_t w = cache_->row_width();
        auto k = in(keys, n);
        auto r = in(rows_in, n * w);
        auto v = in(versions_in, n);
        buffer<Key, Space> ek(n, space());
        buffer<float, Space> er(n * w, space());
        buffer<std::uint64_t, Space> ev(n, space());
        buffer<bool, Space> f(n, space());
        buffer<std::int64_t, Space> s(n, space());
        const status st = cache_->insert_and_evict(
            k.data(), n, rows_in ? r.data() : nullptr, versions_in ? v.data() : nullptr, ek.data(),
            er.data(), ev.data(), evicted_count, f.data(), s.data());
        // The outputs are complete even when some key found no room.
        const std::size_t e = *evicted_count;
        ek.copy_to_host(evicted_keys, e);
        er.copy_to_host(evicted_rows, e * w);
        ev.copy_to_host(evicted_versions, e);
        if (found_out) f.copy_to_host(found_out, n);
        if (slots_out) s.copy_to_host(slots_out, n);
        return st;
      });
    }
  }
  // States, keys and versions of every slot, readable on the host.
  slot_meta<Key> meta() const {
    slot_meta<Key> m;
    const auto ref = cache_->ref();
    if constexpr (is_host_space_v<Space>) {
      m.states = ref.states;
      m.keys = ref.keys;
      m.versions = ref.versions;
    } else {
      const std::size_t n = cache_->capacity();
      m.states_copy.resize(n);
      m.keys_copy.resize(n);
      m.versions_copy.resize(n);
      detail::copy(space(), m.states_copy.data(), ref.states, n);
      detail::copy(space(), m.keys_copy.data(), ref.keys, n * sizeof(Key));
      detail::copy(space(), m.versions_copy.data(), ref.versions, n * sizeof(std::uint64_t));
      m.states = m.states_copy.data();
      m.keys = m.keys_copy.data();
      m.versions = m.versions_copy.data();
    }
    return m;
  }

 private:
  const Space& space() const { return cache_->space(); }
  template <class T>
  buffer<T, Space> in(const T* host, std::size_t n) const {
    if (!host || n == 0) return {};
    buffer<T, Space> b(n, space());
    b.copy_from_host(host, n);
    return b;
  }

  cache_type* cache_;
};

// --- files -------------------------------------------------------------------------------------

status sys_error(const std::string& what, const std::string& path, int err) {
  std::string m = what + " '" + path + "': " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return status::out_of_space(m);
  if (err == ENOENT) return status::not_found(m);
  return status::io_error(m);
}

// Writes `bytes` to a new file, fsyncs it; `digest` gets its xxHash64.
status write_file(const std::string& path, const void* data, std::size_t bytes,
                  std::uint64_t* digest) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return sys_error("cannot create", path, errno);
  const char* p = static_cast<const char*>(data);
  std::size_t left = bytes;
  while (left > 0) {
    const ssize_t w = ::write(fd, p, std::min<std::size_t>(left, std::size_t{1} << 26));
    if (w < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      return sys_error("cannot write", path, e);
    }
    p += w;
    left -= static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    return sys_error("cannot fsync", path, e);
  }
  if (::close(fd) != 0) return sys_error("cannot close", path, errno);
  if (digest) *digest = XXH64(data, bytes, 0);
  return {};
}

status sync_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return sys_error("cannot open folder", dir, errno);
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0) return sys_error("cannot fsync folder", dir, e);
  return {};
}

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// How a table folder holds the optimizer state: one file per part of `part_width` floats of the
// row's state, in row order (`{"opt_state"}` with the whole state width, or HugeCTR's files with
// dim each); no names: not written.
struct state_files {
  std::vector<const char*> names;
  std::size_t part_width = 0;
};

// Writes one table's arrays into `folder` (`slot_ids` as `slot_id` unless null) and returns the
// manifest entry of its files.
template <class Key>
status write_table_folder(const std::string& folder, const std::vector<Key>& keys,
                          const std::vector<float>& vectors, const std::vector<float>& states,
                          const std::vector<std::uint64_t>& versions, const state_files& sf,
                          const std::vector<std::uint64_t>* slot_ids,
                          const std::vector<Key>* erased, nlohmann::json* files) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) return status::io_error("cannot create '" + folder + "': " + ec.message());
  const auto put = [&](const char* name, const void* data, std::size_t bytes) -> status {
    std::uint64_t d = 0;
    EMBCACHE_RETURN_IF_ERROR(write_file(folder + "/" + name, data, bytes, &d));
    (*files)[name] = {{"bytes", bytes}, {"xxh64", hex(d)}};
    return {};
  };
  // HugeCTR's `key` file is int64 whatever the key type of the table.
  const std::vector<std::int64_t> k64(keys.begin(), keys.end());
  EMBCACHE_RETURN_IF_ERROR(put("key", k64.data(), k64.size() * 8));
  EMBCACHE_RETURN_IF_ERROR(put("emb_vector", vectors.data(), vectors.size() * 4));
  EMBCACHE_RETURN_IF_ERROR(put("version", versions.data(), versions.size() * 8));
  const std::size_t n = keys.size(), parts = sf.names.size(), pw = sf.part_width;
  std::vector<float> part;
  for (std::size_t p = 0; p < parts; ++p) {
    const float* data = states.data();
    if (parts > 1) {  // one part of each row's state, rows in order
      part.resize(n * pw);
      for (std::size_t i = 0; i < n; ++i) {
        std::memcpy(part.data() + i * pw, states.data() + (i * parts + p) * pw, pw * 4);
      }
      data = part.data();
    }
    EMBCACHE_RETURN_IF_ERROR(put(sf.names[p], data, n * pw * 4));
  }
  if (slot_ids) EMBCACHE_RETURN_IF_ERROR(put("slot_id", slot_ids->data(), slot_ids->size() * 8));
  if (erased) {
    const std::vector<std::int64_t> e64(erased->begin(), erased->end());
    EMBCACHE_RETURN_IF_ERROR(put("erased", e64.data(), e64.size() * 8));
  }
  return sync_folder(folder);
}

status write_manifest(const std::string& dir, const nlohmann::json& manifest) {
  const std::string text = manifest.dump(2);
  return write_file(dir + "/manifest.json", text.data(), text.size(), nullptr);
}

// --- loading a saved model ---------------------------------------------------------------------

// The rows of one table as read from a folder, before anything is changed.
struct loaded_table {
  // One file of optimizer state: `width` floats per row, at `offset` in the row's state.
  struct state_part {
    std::string file;
    std::size_t offset = 0, width = 0;
    std::vector<float> values;
  };
  std::string folder;
  std::vector<std::int64_t> keys;
  std::vector<float> vectors;
  std::vector<state_part> states;  // empty: the state is initialized
  std::vector<std::uint64_t> versions, slot_ids;
  bool has_slot_ids = false;
  std::uint64_t version = 0;
};

// What the cache expects of a table in a save.
struct table_schema {
  std::string name;
  std::size_t dim = 0, state_width = 0;
  optimizer_kind optimizer = optimizer_kind::sgd;
};

// Bytes of the files in a save: every size is a product of manifest fields, checked for overflow
// before it is compared with anything.
bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// The largest manifest.json read: far above any real one (a few hundred bytes per table).
constexpr std::uint64_t max_manifest_bytes = std::uint64_t{64} << 20;

result<std::uint64_t> regular_file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return sys_error("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) return status::corruption("'" + path + "' is not a regular file");
  return static_cast<std::uint64_t>(st.st_size);
}

// Reads `path`, whose size the caller checked to be `bytes` (a multiple of sizeof(T)); a file
// that changed size since is refused as truncated.
template <class T>
status read_exact(const std::string& path, std::uint64_t bytes, std::vector<T>* out,
                  std::uint64_t* digest) {
  if (bytes % sizeof(T) != 0 || bytes > std::numeric_limits<std::size_t>::max()) {
    return status::corruption("'" + path + "' has " + std::to_string(bytes) +
                              " bytes, not a whole number of " + std::to_string(sizeof(T)) +
                              "-byte items");
  }
  out->assign(static_cast<std::size_t>(bytes / sizeof(T)), T{});
  std::ifstream in(path, std::ios::binary);
  if (!in) return status::io_error("cannot open '" + path + "'");
  if (bytes > 0 &&
      !in.read(reinterpret_cast<char*>(out->data()), static_cast<std::streamsize>(bytes))) {
    return status::corruption("'" + path + "' ends before " + std::to_string(bytes) +
                              " bytes (truncated while being read)");
  }
  if (digest) *digest = XXH64(out->data(), static_cast<std::size_t>(bytes), 0);
  return {};
}

// Field readers of manifest.json that name the file and the field in every refusal.
struct manifest_fields {
  std::string path;

  status missing(const std::string& field, const char* what) const {
    return status::corruption("load: '" + path + "': field '" + field + "' must be " + what);
  }
  status str(const nlohmann::json& o, const char* name, const std::string& at,
             std::string* out) const {
    const auto it = o.find(name);
    if (it == o.end() || !it->is_string()) return missing(at + name, "a string");
    *out = it->get<std::string>();
    return {};
  }
  status u64(const nlohmann::json& o, const char* name, const std::string& at,
             std::uint64_t* out) const {
    const auto it = o.find(name);
    if (it == o.end() || !it->is_number_unsigned()) {
      return missing(at + name, "an unsigned integer");
    }
    *out = it->get<std::uint64_t>();
    return {};
  }
};

// Reads and checks the folder written by save(): manifest fields, file sizes against the count
// (overflow-safe) before reading, then checksums. Nothing outside `out` changes.
status read_saved_model(const std::string& dir, const std::string& key_type,
                        const std::vector<table_schema>& want, std::vector<loaded_table>* out) {
  const manifest_fields f{dir + "/manifest.json"};
  auto size = regular_file_size(f.path);
  if (!size.ok()) return size.get_status().with_context("load");
  if (size.value() > max_manifest_bytes) {
    return status::corruption("load: '" + f.path + "' has " + std::to_string(size.value()) +
                              " bytes, more than the " + std::to_string(max_manifest_bytes) +
                              " a manifest may have");
  }
  std::vector<char> text;
  EMBCACHE_RETURN_IF_ERROR(read_exact(f.path, size.value(), &text, nullptr).with_context("load"));
  const nlohmann::json m = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (m.is_discarded()) return status::corruption("load: '" + f.path + "' is not valid JSON");
  if (!m.is_object()) return status::corruption("load: '" + f.path + "' is not a JSON object");
  std::string format, kt;
  EMBCACHE_RETURN_IF_ERROR(f.str(m, "format", "", &format));
  if (format != "embcache-model") {
    return status::invalid_argument("load: '" + f.path + "' has format '" + format +
                                    "', expected 'embcache-model' (not a saved model)");
  }
  const auto fv = m.find("format_version");
  if (fv == m.end() || !fv->is_number_integer()) return f.missing("format_version", "an integer");
  if (fv->get<std::int64_t>() != model_format_version) {
    return status::unsupported("load: '" + f.path + "' has format_version " + fv->dump() +
                               ", expected " + std::to_string(model_format_version));
  }
  EMBCACHE_RETURN_IF_ERROR(f.str(m, "key_type", "", &kt));
  if (kt != key_type) {
    return status::invalid_argument("load: '" + f.path + "' holds " + kt + " keys, expected " +
                                    key_type);
  }
  const auto mt = m.find("tables");
  if (mt == m.end() || !mt->is_array()) return f.missing("tables", "an array");
  if (mt->size() != want.size()) {
    return status::invalid_argument("load: '" + f.path + "' has " + std::to_string(mt->size()) +
                                    " tables, the cache " + std::to_string(want.size()));
  }
  std::vector<std::string> names(mt->size());
  for (std::size_t i = 0; i < mt->size(); ++i) {
    const std::string at = "tables[" + std::to_string(i) + "].";
    if (!(*mt)[i].is_object()) return f.missing(at.substr(0, at.size() - 1), "an object");
    EMBCACHE_RETURN_IF_ERROR(f.str((*mt)[i], "name", at, &names[i]));
    for (std::size_t j = 0; j < i; ++j) {
      if (names[j] == names[i]) {
        return status::corruption("load: '" + f.path + "' lists table '" + names[i] + "' twice");
      }
    }
  }
  for (std::size_t t = 0; t < want.size(); ++t) {
    const table_schema& w = want[t];
    const std::string where = "load: table '" + w.name + "' of '" + dir + "'";
    const std::size_t i =
        static_cast<std::size_t>(std::find(names.begin(), names.end(), w.name) - names.begin());
    if (i == names.size()) return status::not_found(where + " is missing");
    const nlohmann::json& e = (*mt)[i];
    const std::string at = "tables[" + std::to_string(i) + "].";
    std::uint64_t dim = 0, state_width = 0, count = 0, version = 0;
    std::string optimizer;
    EMBCACHE_RETURN_IF_ERROR(f.u64(e, "dim", at, &dim));
    EMBCACHE_RETURN_IF_ERROR(f.u64(e, "state_width", at, &state_width));
    EMBCACHE_RETURN_IF_ERROR(f.str(e, "optimizer", at, &optimizer));
    EMBCACHE_RETURN_IF_ERROR(f.u64(e, "count", at, &count));
    EMBCACHE_RETURN_IF_ERROR(f.u64(e, "version", at, &version));
    if (dim != w.dim || state_width != w.state_width || optimizer != to_string(w.optimizer)) {
      return status::invalid_argument(where + " has dim " + std::to_string(dim) + ", state width " +
                                      std::to_string(state_width) + ", optimizer " + optimizer +
                                      "; expected " + std::to_string(w.dim) + ", " +
                                      std::to_string(w.state_width) + ", " +
                                      to_string(w.optimizer));
    }
    const auto files = e.find("files");
    if (files == e.end() || !files->is_object()) return f.missing(at + "files", "an object");
    loaded_table& L = (*out)[t];
    L.folder = dir + "/" + w.name;
    // The files of the table: the state as HugeCTR's optimizer files or, in saves of earlier
    // versions, as one `opt_state`; `slot_id` when the save has it.
    struct file_spec {
      std::string name;
      std::uint64_t per_row;  // items per row
      std::uint64_t item_bytes;
      const char* per_row_field;
      std::vector<std::int64_t>* i64 = nullptr;  // where it is read to: one of these
      std::vector<std::uint64_t>* u64 = nullptr;
      std::vector<float>* f32 = nullptr;
    };
    std::vector<file_spec> specs = {{"key", 1, 8, nullptr, &L.keys},
                                    {"emb_vector", dim, 4, "dim", nullptr, nullptr, &L.vectors},
                                    {"version", 1, 8, nullptr, nullptr, &L.versions}};
    L.states.clear();
    if (files->contains("opt_state")) {
      L.states.push_back({"opt_state", 0, w.state_width, {}});
    } else {
      const auto names = hugectr_state_files(w.optimizer);
      for (std::size_t p = 0; p < names.size(); ++p) {
        L.states.push_back({names[p], p * w.dim, w.dim, {}});
      }
    }
    for (auto& part : L.states) {
      const bool whole = part.file == "opt_state";
      specs.push_back({part.file, whole ? state_width : dim, 4, whole ? "state_width" : "dim",
                       nullptr, nullptr, &part.values});
    }
    L.has_slot_ids = files->contains("slot_id");
    if (L.has_slot_ids) specs.push_back({"slot_id", 1, 8, nullptr, nullptr, &L.slot_ids});
    for (const file_spec& x : specs) {
      const std::string fat = at + "files." + x.name;
      const auto fe = files->find(x.name);
      if (fe == files->end() || !fe->is_object()) return f.missing(fat, "an object");
      std::uint64_t bytes = 0;
      std::string digest_text;
      EMBCACHE_RETURN_IF_ERROR(f.u64(*fe, "bytes", fat + ".", &bytes));
      EMBCACHE_RETURN_IF_ERROR(f.str(*fe, "xxh64", fat + ".", &digest_text));
      const std::string sizes = at + "count " + std::to_string(count) +
                                (x.per_row_field ? std::string(" and ") + at + x.per_row_field +
                                                       " " + std::to_string(x.per_row)
                                                 : std::string()) +
                                " (" + std::to_string(x.item_bytes) + "-byte items)";
      std::uint64_t expect = 0;
      if (!checked_mul(count, x.per_row, &expect) || !checked_mul(expect, x.item_bytes, &expect)) {
        return status::corruption("load: '" + f.path + "': the size of '" + x.name + "' given by " +
                                  sizes + " overflows 64 bits");
      }
      if (bytes != expect) {
        return status::corruption("load: '" + f.path + "': " + fat + ".bytes is " +
                                  std::to_string(bytes) + ", expected " + std::to_string(expect) +
                                  " from " + sizes);
      }
      const std::string path = L.folder + "/" + x.name;
      auto actual = regular_file_size(path);
      if (!actual.ok()) return actual.get_status().with_context(where);
      if (actual.value() != expect) {
        return status::corruption("load: '" + path + "' is " + std::to_string(actual.value()) +
                                  " bytes, expected " + std::to_string(expect) + " from " + sizes +
                                  " of '" + f.path + "'" +
                                  (actual.value() < expect ? " (truncated)" : ""));
      }
      std::uint64_t digest = 0;
      const status s = x.i64   ? read_exact(path, expect, x.i64, &digest)
                       : x.u64 ? read_exact(path, expect, x.u64, &digest)
                               : read_exact(path, expect, x.f32, &digest);
      EMBCACHE_RETURN_IF_ERROR(s.with_context(where));
      if (digest_text != hex(digest)) {
        return status::corruption("load: '" + path + "' has checksum " + hex(digest) + ", '" +
                                  f.path + "' says \"" + digest_text + "\" (" + fat + ".xxh64)");
      }
    }
    L.version = version;
  }
  return {};
}

// Reads an optional file of a plain HugeCTR table folder holding `per_row` items of T for each
// of `n` rows; false in `*found` when it is absent. Sizes are checked before reading.
template <class T>
status read_hugectr_rows(const std::string& path, std::uint64_t n, std::uint64_t per_row,
                         std::vector<T>* out, bool* found) {
  std::error_code ec;
  *found = fs::exists(path, ec);
  if (!*found) return {};
  auto bytes = regular_file_size(path);
  if (!bytes.ok()) return bytes.get_status();
  std::uint64_t expect = 0;
  if (!checked_mul(n, per_row, &expect) || !checked_mul(expect, sizeof(T), &expect)) {
    return status::corruption("the size of '" + path + "' for " + std::to_string(n) + " keys of " +
                              std::to_string(per_row) + " items overflows 64 bits");
  }
  if (bytes.value() != expect) {
    return status::corruption("'" + path + "' has " + std::to_string(bytes.value()) + " bytes; " +
                              std::to_string(n) + " keys need " + std::to_string(n) + " * " +
                              std::to_string(per_row) + " * " + std::to_string(sizeof(T)) +
                              (bytes.value() < expect ? " (truncated)" : ""));
  }
  return read_exact(path, expect, out, nullptr);
}

// Reads a plain HugeCTR table folder (`key` int64, `emb_vector` float32[n][dim], optional
// `slot_id` uint64[n] and the optimizer files of `optimizer`, float32[n][dim] each: all of them
// or none); sizes are checked before reading.
status read_hugectr_table(const std::string& folder, std::size_t dim, optimizer_kind optimizer,
                          loaded_table* L) {
  L->folder = folder;
  const std::string key_path = folder + "/key", vec_path = folder + "/emb_vector";
  auto key_bytes = regular_file_size(key_path);
  if (!key_bytes.ok()) return key_bytes.get_status();
  if (key_bytes.value() % 8 != 0) {
    return status::corruption("'" + key_path + "' has " + std::to_string(key_bytes.value()) +
                              " bytes, not a multiple of 8 (int64 keys)");
  }
  const std::uint64_t n = key_bytes.value() / 8;
  auto vec_bytes = regular_file_size(vec_path);
  if (!vec_bytes.ok()) return vec_bytes.get_status();
  std::uint64_t expect = 0;
  if (!checked_mul(n, dim, &expect) || !checked_mul(expect, 4, &expect) ||
      vec_bytes.value() != expect) {
    return status::invalid_argument("'" + vec_path + "' has " + std::to_string(vec_bytes.value()) +
                                    " bytes; " + std::to_string(n) + " keys of dim " +
                                    std::to_string(dim) + " need " + std::to_string(n) + " * " +
                                    std::to_string(dim) + " * 4");
  }
  EMBCACHE_RETURN_IF_ERROR(read_exact(key_path, key_bytes.value(), &L->keys, nullptr));
  EMBCACHE_RETURN_IF_ERROR(read_exact(vec_path, expect, &L->vectors, nullptr));
  EMBCACHE_RETURN_IF_ERROR(
      read_hugectr_rows(folder + "/slot_id", n, 1, &L->slot_ids, &L->has_slot_ids));
  const auto names = hugectr_state_files(optimizer);
  L->states.clear();
  std::string present, absent;
  for (std::size_t p = 0; p < names.size(); ++p) {
    loaded_table::state_part part{names[p], p * dim, dim, {}};
    bool found = false;
    EMBCACHE_RETURN_IF_ERROR(
        read_hugectr_rows(folder + "/" + names[p], n, dim, &part.values, &found));
    (found ? present : absent) = names[p];
    if (found) L->states.push_back(std::move(part));
  }
  if (!present.empty() && !absent.empty()) {
    return status::corruption("'" + folder + "/" + absent + "' is missing while '" + present +
                              "' is there; the " + to_string(optimizer) +
                              " state needs all its files (or none: state initialized)");
  }
  L->versions.assign(L->keys.size(), 1);
  L->version = 1;
  return {};
}

// Finds the first non-finite float of `values` (rows of `width`), naming the row's key.
status check_finite(const std::vector<float>& values, std::size_t width,
                    const std::vector<std::int64_t>& keys, const std::string& path) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return status::invalid_argument(
          "'" + path + "' holds " + std::to_string(values[i]) + " for key " +
          std::to_string(keys[i / width]) + " (float " + std::to_string(i % width) +
          " of its row); expected finite floats (load_options::allow_non_finite accepts them)");
    }
  }
  return {};
}

// Refuses repeated keys and non-finite floats unless `options` allows them.
status check_loaded_rows(const loaded_table& L, std::size_t dim, const load_options& options) {
  if (!options.allow_duplicate_keys) {
    std::vector<std::int64_t> sorted = L.keys;
    std::sort(sorted.begin(), sorted.end());
    const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    if (dup != sorted.end()) {
      return status::invalid_argument("'" + L.folder + "/key' repeats key " + std::to_string(*dup) +
                                      "; expected each key once (load_options::"
                                      "allow_duplicate_keys keeps the last occurrence)");
    }
  }
  if (!options.allow_non_finite) {
    EMBCACHE_RETURN_IF_ERROR(check_finite(L.vectors, dim, L.keys, L.folder + "/emb_vector"));
    for (const auto& part : L.states) {
      if (part.width == 0) continue;
      EMBCACHE_RETURN_IF_ERROR(
          check_finite(part.values, part.width, L.keys, L.folder + "/" + part.file));
    }
  }
  return {};
}

}  // namespace

// --- state ---------------------------------------------------------------------------------------

template <class Key, class Space>
struct training_cache<Key, Space>::impl {
  using rows_vector = std::vector<float, staging_allocator<float, Space>>;
  struct staging {
    std::vector<Key> keys;  // sorted
    rows_vector rows;
    std::vector<std::uint64_t> versions;
    std::vector<std::uint8_t> found;  // 0 = initialized by staging
    // Gather buffer for the rows the next begin_pass writes behind, sized (and its pages
    // touched) by the worker so that the boundary does not pay for page faults.
    rows_vector gather;
    // The prefetched keyset (sorted, unique) and the slots of its keys resident at prefetch
    // time: begin_pass of the same keyset with the residency unchanged needs no lookup.
    std::vector<Key> keyset;
    std::vector<std::int64_t> hit_slots;
    std::uint64_t residency = 0;
    std::size_t resident_rows = 0;
    // Filled by the worker once it has settled the residency for the next pass (early_evict):
    // the resident slots outside the prefetched keyset, i.e. the eviction candidates of the next
    // begin_pass, and how many of the keyset's missing rows it already inserted.
    std::vector<std::int64_t> leave_slots;
    bool leave_valid = false;
    std::size_t early_inserted = 0;
    std::uint32_t premark = 0;  // epoch of the worker's marks in next_mark; 0 = none
    double seconds = 0;
  };

  struct table_state {
    table_options<Key> opt;
    std::size_t index = 0;
    std::size_t state_width = 0;
    std::size_t row_width = 0;
    std::unique_ptr<cache_type> cache;
    // Rows the cache may hold between passes (table_options::max_resident, resolved).
    std::size_t max_resident = 0;
    cache_io<Key, Space> io;  // the cache's calls with host-memory arguments
    std::shared_ptr<param_store<Key>> store;
    std::unique_ptr<std::mutex> store_mutex = std::make_unique<std::mutex>();
    // Held by the prefetch worker while it changes the table's residency during a pass
    // (early_evict, early_insert), and by the caller's calls that read or change residency or the
    // slot bookkeeping below while a worker may run. Taken before store_mutex, never after it.
    std::unique_ptr<std::mutex> install_mutex = std::make_unique<std::mutex>();
    // Work of the worker's early install not yet in a pass's counters.
    table_counters early;
    // Per slot: whether the slot holds a row inserted by us, and the version that row had when
    // last in sync with the store (a row is dirty while its version is greater).
    std::vector<std::uint8_t> slot_used;
    std::vector<std::uint64_t> slot_synced;
    // Export tracking.
    std::uint64_t last_export_version = 0;
    std::vector<Key> written_since_export;
    std::vector<Key> erased_since_export;
    // Keys pushed to or erased from the store while a staging exists (prefetch hazard).
    std::vector<Key> store_writes_log;
    bool log_store_writes = false;
    staging staged;
    // Write-behind: dirty rows that left the device at the last boundary, pushed by the flusher
    // thread. Owned by the caller's thread; the flusher only reads them until it is joined.
    std::vector<Key> wb_keys;
    rows_vector wb_rows;  // at least wb_keys.size() rows
    std::vector<std::uint64_t> wb_versions;
    bool wb_pushed = false;      // set by the flusher once they are in the store
    double wb_seconds = 0;       // the flusher's push time (set by the flusher)
    double wb_seconds_done = 0;  // pushes over, not yet in a pass's counters
    rows_vector spare_rows;      // recycled gather buffer (its pages already touched)
    // begin_pass scratch, kept to avoid allocating per pass.
    std::vector<std::int64_t> scratch_slots;
    std::vector<Key> scratch_keys;
    std::vector<std::uint32_t> slot_mark;  // == mark_epoch: slot holds a key of the keyset
    std::uint32_t mark_epoch = 0;
    // The prefetch worker marks the next keyset's resident slots here (with staged.premark, a
    // later epoch); the boundary swaps it with slot_mark instead of marking them itself. Epochs
    // only grow, so stale marks in either array never match a current one.
    std::vector<std::uint32_t> next_mark;
    // Counts the calls that change which keys are resident (begin_pass, lookup, erase, load).
    std::uint64_t residency = 0;
    // Slot ids loaded from a folder's `slot_id` file or given to set_slot_ids(), for save().
    std::unordered_map<Key, std::uint64_t> slot_ids;
  };

  training_cache_options options;
  int device = 0;  // cuda space: the device the caches live on
  std::vector<table_state> tables;
  cache_counters counters;
  std::thread worker;
  bool staged_valid = false;
  status staging_status;
  // The flusher pushes every table's write-behind rows; `flushing` is cleared when it is done,
  // so that the staging worker can wait for it without joining it.
  std::thread flusher;
  std::mutex flush_mutex;
  std::condition_variable flush_cv;
  bool flushing = false;

  bool write_behind_pending() const {
    for (const auto& tb : tables) {
      if (!tb.wb_keys.empty()) return true;
    }
    return false;
  }

  void start_flusher() {
    {
      std::lock_guard<std::mutex> l(flush_mutex);
      flushing = true;
    }
    flusher = std::thread([this] {
      status s;
      for (auto& tb : tables) {
        if (tb.wb_keys.empty()) continue;
        const auto t0 = clock_type::now();
        {
          // Not logged for the prefetch hazard: staging starts pulling only after this push is
          // over (wait_flush), so no staged row can predate it.
          std::lock_guard<std::mutex> lock(*tb.store_mutex);
          s = tb.store->push(tb.wb_keys.data(), tb.wb_keys.size(), tb.wb_rows.data(),
                             tb.wb_versions.data());
        }
        tb.wb_seconds = seconds_since(t0);
        if (!s.ok()) break;  // settle() pushes what is left and reports the error
        tb.wb_pushed = true;
      }
      std::lock_guard<std::mutex> l(flush_mutex);
      flushing = false;
      flush_cv.notify_all();
    });
  }

  // For the staging worker: returns once no write-behind push is running.
  void wait_flush() {
    std::unique_lock<std::mutex> l(flush_mutex);
    flush_cv.wait(l, [&] { return !flushing; });
  }

  // Waits for the write-behind and retires its rows. Rows the flusher did not push (its push
  // failed, or begin_pass failed before starting it) are pushed here, logged like every push of
  // the caller; while that fails they stay pending and every call that needs the store returns
  // the error.
  status settle() {
    if (flusher.joinable()) flusher.join();
    for (auto& tb : tables) {
      if (tb.wb_keys.empty()) continue;
      if (!tb.wb_pushed) {
        EMBCACHE_RETURN_IF_ERROR(
            push(tb, tb.wb_keys.data(), tb.wb_keys.size(), tb.wb_rows.data(), tb.wb_versions.data())
                .with_context("write-behind of table '" + tb.opt.name + "'"));
      }
      tb.wb_seconds_done += tb.wb_seconds;
      tb.wb_seconds = 0;
      tb.wb_pushed = false;
      tb.wb_keys.clear();
      tb.wb_versions.clear();
      if (tb.wb_rows.size() > tb.spare_rows.size()) tb.spare_rows.swap(tb.wb_rows);
    }
    return {};
  }

  // Drops the write-behind rows unpushed (load() replaces the whole store).
  void discard_write_behind() {
    if (flusher.joinable()) flusher.join();
    for (auto& tb : tables) {
      tb.wb_keys.clear();
      tb.wb_versions.clear();
      tb.wb_seconds = 0;
      tb.wb_pushed = false;
    }
  }

  // Store access, serialized with the prefetch worker.
  status push(table_state& tb, const Key* keys, std::size_t n, const float* rows,
              const std::uint64_t* versions) {
    if (n == 0) return {};
    std::lock_guard<std::mutex> lock(*tb.store_mutex);
    if (tb.log_store_writes) tb.store_writes_log.insert(tb.store_writes_log.end(), keys, keys + n);
    return tb.store->push(keys, n, rows, versions);
  }
  status pull(table_state& tb, const Key* keys, std::size_t n, float* rows, bool* found,
              std::uint64_t* versions) {
    if (n == 0) return {};
    std::lock_guard<std::mutex> lock(*tb.store_mutex);
    return tb.store->pull(keys, n, rows, found, versions);
  }

  void initialize_row(const table_state& tb, Key k, float* dst) const {
    tb.cache->ref().initialize_row(k, dst);
    if (tb.state_width) initialize_state(tb.opt.optimizer, tb.opt.dim, dst + tb.opt.dim);
  }

  std::uint64_t fresh_version(table_state& tb) {
    const std::uint64_t v = tb.cache->version() + 1;
    tb.cache->advance_version(v);
    return v;
  }

  // Resident keys (sorted) and their versions.
  status residents(table_state& tb, std::vector<Key>* keys, std::vector<std::uint64_t>* vers) {
    const auto all = export_filter::all();
    const std::size_t n = tb.cache->size();
    keys->resize(n);
    vers->resize(n);
    std::size_t count = 0;
    EMBCACHE_RETURN_IF_ERROR(tb.io.export_if(all, keys->data(), nullptr, vers->data(), n, &count));
    keys->resize(count);
    vers->resize(count);
    return {};
  }

  // Writes back the dirty rows among resident `keys` (versions `vers`), then erases all of them
  // from the cache when `evict`.
  status write_back(table_state& tb, const std::vector<Key>& keys,
                    const std::vector<std::uint64_t>& vers, bool evict, table_counters& c) {
    const auto t0 = clock_type::now();
    const std::size_t n = keys.size();
    std::vector<std::int64_t> slots(n);
    EMBCACHE_RETURN_IF_ERROR(tb.io.lookup_slots(keys.data(), n, slots.data()));
    std::vector<std::int64_t> dirty_slots;
    std::vector<Key> dirty_keys;
    std::vector<std::uint64_t> dirty_vers;
    for (std::size_t i = 0; i < n; ++i) {
      const auto s = slots[i];
      if (s < 0) return status::internal("resident key vanished during write-back");
      if (!tb.slot_used[s] || vers[i] > tb.slot_synced[s]) {
        dirty_slots.push_back(s);
        dirty_keys.push_back(keys[i]);
        dirty_vers.push_back(vers[i]);
      }
    }
    std::vector<float> rows(dirty_slots.size() * tb.row_width);
    EMBCACHE_RETURN_IF_ERROR(tb.io.read_slots(dirty_slots.data(), dirty_slots.size(), rows.data()));
    EMBCACHE_RETURN_IF_ERROR(
        push(tb, dirty_keys.data(), dirty_keys.size(), rows.data(), dirty_vers.data())
            .with_context("write-back of table '" + tb.opt.name + "'"));
    tb.written_since_export.insert(tb.written_since_export.end(), dirty_keys.begin(),
                                   dirty_keys.end());
    for (std::size_t i = 0; i < dirty_slots.size(); ++i) {
      tb.slot_synced[dirty_slots[i]] = dirty_vers[i];
      tb.slot_used[dirty_slots[i]] = 1;
    }
    c.rows_pushed += dirty_keys.size();
    c.bytes_cache_to_store += dirty_keys.size() * tb.row_width * sizeof(float);
    if (evict) {
      for (auto s : slots) tb.slot_used[s] = 0;
      EMBCACHE_RETURN_IF_ERROR(tb.io.erase(keys.data(), n));
      c.rows_evicted += n;
    }
    c.seconds_write_back += seconds_since(t0);
    return {};
  }

  status stage(table_state& tb, std::vector<Key> keys, std::size_t spare_floats);
  bool early_current(const table_state& tb) const;
  void early_changed(table_state& tb);
  status early_evict(table_state& tb, bool* go_on);
  status early_insert(table_state& tb, std::size_t b, std::size_t m,
                      std::vector<std::uint8_t>& taken, bool* go_on);

  void wait_worker() {
    if (worker.joinable()) worker.join();
  }

  void drop_staging() {
    wait_worker();
    staged_valid = false;
    for (auto& tb : tables) {
      // The log belongs to the caller's thread (the worker only pulls, the flusher's pushes are
      // not logged), so no lock: taking the store's would wait for a running write-behind.
      tb.log_store_writes = false;
      tb.store_writes_log.clear();
      if (tb.staged.premark != 0) {
        // Unused marks of a replaced prefetch would match the next one's epoch.
        for (const auto s : tb.staged.hit_slots) tb.next_mark[s] = 0;
      }
      // The row buffer is kept: the next staging reuses its pages instead of faulting new ones.
      auto rows = std::move(tb.staged.rows);
      tb.staged = staging{};
      tb.staged.rows = std::move(rows);
    }
  }

  status swap_in(table_state& tb, const std::vector<Key>& missing, bool use_staging,
                 table_counters& c);
  status swap_in_staged(table_state& tb, const std::vector<Key>& missing, table_counters& c);
  status evict(table_state& tb, const std::vector<std::int64_t>& victims,
               const slot_meta<Key>& meta, table_counters& c);
  status transition(table_state& tb, const std::vector<Key>& keys, bool use_staging,
                    table_counters& c);
  status begin_pass(const std::vector<std::vector<Key>>& keysets);
  status lookup(table_state& tb, const Key* keys, std::size_t n, std::int64_t* slots_out);
  status dump_store(table_state& tb, std::vector<Key>* keys, std::vector<float>* vectors,
                    std::vector<float>* states, std::vector<std::uint64_t>* versions);
};

template <class Key, class Space>
status training_cache<Key, Space>::impl::swap_in(table_state& tb, const std::vector<Key>& missing,
                                                 bool use_staging, table_counters& c) {
  if (use_staging && tb.store_writes_log.empty() &&
      (&missing == &tb.staged.keys || tb.staged.keys == missing)) {
    return swap_in_staged(tb, missing, c);
  }
  const auto t0 = clock_type::now();
  const std::size_t n = missing.size(), w = tb.row_width;
  std::vector<float> rows(n * w);
  std::vector<std::uint64_t> vers(n, 0);
  std::unique_ptr<bool[]> found(new bool[std::max<std::size_t>(n, 1)]);
  std::vector<std::size_t> to_pull;
  if (use_staging) {
    // Keys the store changed for after staging began must be re-pulled.
    auto log = std::move(tb.store_writes_log);
    std::sort(log.begin(), log.end());
    const auto& st = tb.staged;
    std::size_t j = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const Key k = missing[i];
      while (j < st.keys.size() && st.keys[j] < k) ++j;
      const bool staged = j < st.keys.size() && st.keys[j] == k;
      if (staged && !std::binary_search(log.begin(), log.end(), k)) {
        std::memcpy(rows.data() + i * w, st.rows.data() + j * w, w * sizeof(float));
        vers[i] = st.versions[j];
        found[i] = st.found[j] != 0;
        ++c.rows_staged;
      } else {
        if (staged) ++c.rows_restaged;
        to_pull.push_back(i);
      }
    }
  } else {
    to_pull.resize(n);
    std::iota(to_pull.begin(), to_pull.end(), std::size_t{0});
  }
  if (to_pull.size() == n) {
    EMBCACHE_RETURN_IF_ERROR(pull(tb, missing.data(), n, rows.data(), found.get(), vers.data()));
  } else if (!to_pull.empty()) {
    const std::size_t m = to_pull.size();
    std::vector<Key> k(m);
    std::vector<float> r(m * w);
    std::vector<std::uint64_t> v(m);
    std::unique_ptr<bool[]> f(new bool[m]);
    for (std::size_t i = 0; i < m; ++i) k[i] = missing[to_pull[i]];
    EMBCACHE_RETURN_IF_ERROR(pull(tb, k.data(), m, r.data(), f.get(), v.data()));
    for (std::size_t i = 0; i < m; ++i) {
      const std::size_t d = to_pull[i];
      std::memcpy(rows.data() + d * w, r.data() + i * w, w * sizeof(float));
      vers[d] = v[i];
      found[d] = f[i];
    }
  }
  c.rows_pulled += to_pull.size();
  // New rows get a fresh version so that they are dirty (written back) and exported.
  std::uint64_t init_version = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (found[i]) continue;
    if (!init_version) init_version = fresh_version(tb);
    initialize_row(tb, missing[i], rows.data() + i * w);
    vers[i] = init_version;
    ++c.rows_initialized;
  }
  c.bytes_store_to_cache += (n - c.rows_initialized) * w * sizeof(float);
  EMBCACHE_RETURN_IF_ERROR(tb.io.insert_or_assign(missing.data(), n, rows.data(), vers.data()));
  std::vector<std::int64_t> slots(n);
  EMBCACHE_RETURN_IF_ERROR(tb.io.lookup_slots(missing.data(), n, slots.data()));
  for (std::size_t i = 0; i < n; ++i) {
    if (slots[i] < 0) return status::internal("inserted key is absent from the cache");
    tb.slot_used[slots[i]] = 1;
    tb.slot_mark[slots[i]] = tb.mark_epoch;  // a key of this pass (early_evict reads it)
    tb.slot_synced[slots[i]] = found[i] ? vers[i] : 0;
  }
  c.seconds_swap_in += seconds_since(t0);
  return {};
}

// Every missing key staged, none written to the store since: the staged rows go in as they are,
// without another copy (the common case, and the one whose blocking time prefetch must cut).
template <class Key, class Space>
status training_cache<Key, Space>::impl::swap_in_staged(table_state& tb,
                                                        const std::vector<Key>& missing,
                                                        table_counters& c) {
  const auto t0 = clock_type::now();
  auto& st = tb.staged;
  const std::size_t n = missing.size(), w = tb.row_width;
  std::uint64_t init_version = 0;
  std::size_t initialized = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (st.found[i]) continue;
    // Initialized by the worker; a fresh version makes the row dirty (written back, exported).
    if (!init_version) init_version = fresh_version(tb);
    st.versions[i] = init_version;
    ++initialized;
  }
  c.rows_staged += n;
  c.rows_initialized += initialized;
  c.bytes_store_to_cache += (n - initialized) * w * sizeof(float);
  EMBCACHE_RETURN_IF_ERROR(
      tb.io.insert_or_assign(missing.data(), n, st.rows.data(), st.versions.data()));
  auto& slots = tb.scratch_slots;
  slots.resize(n);
  EMBCACHE_RETURN_IF_ERROR(tb.io.lookup_slots(missing.data(), n, slots.data()));
  for (std::size_t i = 0; i < n; ++i) {
    if (slots[i] < 0) return status::internal("inserted key is absent from the cache");
    tb.slot_used[slots[i]] = 1;
    tb.slot_mark[slots[i]] = tb.mark_epoch;  // a key of this pass (early_evict reads it)
    tb.slot_synced[slots[i]] = st.found[i] ? st.versions[i] : 0;
  }
  c.seconds_swap_in += seconds_since(t0);
  return {};
}

// Removes the rows of `victims` (slots) from the cache; the dirty ones are gathered and pushed,
// by the flusher after begin_pass returns when write-behind is on.
template <class Key, class Space>
status training_cache<Key, Space>::impl::evict(table_state& tb,
                                               const std::vector<std::int64_t>& victims,
                                               const slot_meta<Key>& ref, table_counters& c) {
  const auto t0 = clock_type::now();
  const std::size_t m = victims.size(), w = tb.row_width;
  std::vector<Key>& keys = tb.scratch_keys;
  keys.resize(m);
  std::vector<std::int64_t> dirty_slots;
  std::vector<Key> dirty_keys;
  std::vector<std::uint64_t> dirty_vers;
  dirty_slots.reserve(m);
  dirty_keys.reserve(m);
  dirty_vers.reserve(m);
  for (std::size_t i = 0; i < m; ++i) {
    const auto s = victims[i];
    keys[i] = ref.keys[s];
    const std::uint64_t v = ref.versions[s];
    if (!tb.slot_used[s] || v > tb.slot_synced[s]) {
      dirty_slots.push_back(s);
      dirty_keys.push_back(keys[i]);
      dirty_vers.push_back(v);
    }
    tb.slot_used[s] = 0;
  }
  const std::size_t d = dirty_slots.size();
  auto& rows = tb.spare_rows;
  if (rows.size() < d * w) rows.resize(d * w);
  EMBCACHE_RETURN_IF_ERROR(tb.io.read_slots(dirty_slots.data(), d, rows.data()));
  EMBCACHE_RETURN_IF_ERROR(tb.io.erase(keys.data(), m));
  tb.written_since_export.insert(tb.written_since_export.end(), dirty_keys.begin(),
                                 dirty_keys.end());
  c.rows_pushed += d;
  c.rows_evicted += m;
  c.bytes_cache_to_store += d * w * sizeof(float);
  if (options.write_behind) {
    tb.wb_keys = std::move(dirty_keys);
    tb.wb_versions = std::move(dirty_vers);
    tb.wb_rows.swap(rows);
  } else {
    EMBCACHE_RETURN_IF_ERROR(push(tb, dirty_keys.data(), d, rows.data(), dirty_vers.data())
                                 .with_context("write-back of table '" + tb.opt.name + "'"));
  }
  c.seconds_write_back += seconds_since(t0);
  return {};
}

// The prefetch worker's early install (keyset mode). The caller's pass updates rows of its own
// keyset in place and changes no residency, so what the next boundary decides from the resident
// set and the next keyset alone can be done during the pass: residents outside both keysets
// (frozen: nothing touches them before the boundary) are evicted first, as far as the next
// keyset's misses need the room; then each staged batch is inserted as far as it fits, right
// after its pull (while it is still in the processor's cache). begin_pass only handles what is
// left, with the eviction candidates listed here. Everything stops as soon as the residency or
// the store changed behind the worker (the boundary then does the rest).
template <class Key, class Space>
bool training_cache<Key, Space>::impl::early_current(const table_state& tb) const {
  return tb.staged.residency == tb.residency && tb.staged.resident_rows == tb.cache->size();
}

template <class Key, class Space>
void training_cache<Key, Space>::impl::early_changed(table_state& tb) {
  ++tb.residency;
  tb.staged.residency = tb.residency;
  tb.staged.resident_rows = tb.cache->size();
}

template <class Key, class Space>
status training_cache<Key, Space>::impl::early_evict(table_state& tb, bool* go_on) {
  *go_on = false;
  std::lock_guard<std::mutex> lock(*tb.install_mutex);
  auto& st = tb.staged;
  if (!early_current(tb)) return {};
  const auto ref = tb.io.meta();
  const std::size_t slots = tb.cache->capacity(), w = tb.row_width;
  std::vector<std::uint8_t> keep(slots, 0);  // 1: a hit of the next keyset; 2: evicted here
  for (const auto s : st.hit_slots) keep[s] = 1;
  // The slots of the current pass's keyset carry mark_epoch (set by its begin_pass).
  const bool know_current = tb.mark_epoch != 0 && tb.slot_mark.size() == slots;
  std::vector<std::int64_t> leave, frozen;
  for (std::size_t s = 0; s < slots; ++s) {
    if (ref.states[s] <= detail::state_busy || keep[s]) continue;
    leave.push_back(static_cast<std::int64_t>(s));
    if (know_current && tb.slot_mark[s] != tb.mark_epoch) frozen.push_back(std::int64_t(s));
  }
  const std::size_t resident = tb.cache->size(), cap = tb.max_resident;
  const std::size_t need = resident + st.keys.size() > cap ? resident + st.keys.size() - cap : 0;
  const std::size_t ev = std::min(need, frozen.size());
  if (ev > 0) {
    pick_oldest(ref, frozen, ev);
    std::vector<Key> keys(ev);
    const std::size_t batch = std::max<std::size_t>(1, options.prefetch_batch);
    std::vector<std::int64_t> dirty_slots;
    std::vector<Key> dirty_keys;
    std::vector<std::uint64_t> dirty_vers;
    std::vector<float> rows;
    std::size_t pushed = 0;
    for (std::size_t b = 0; b < ev; b += batch) {
      const std::size_t m = std::min(batch, ev - b);
      dirty_slots.clear();
      dirty_keys.clear();
      dirty_vers.clear();
      for (std::size_t i = b; i < b + m; ++i) {
        const auto s = frozen[i];
        keys[i] = ref.keys[s];
        const std::uint64_t v = ref.versions[s];
        if (!tb.slot_used[s] || v > tb.slot_synced[s]) {
          dirty_slots.push_back(s);
          dirty_keys.push_back(keys[i]);
          dirty_vers.push_back(v);
        }
      }
      const std::size_t d = dirty_slots.size();
      if (d == 0) continue;
      rows.resize(d * w);
      EMBCACHE_RETURN_IF_ERROR(tb.io.read_slots(dirty_slots.data(), d, rows.data()));
      {
        // Not logged for the prefetch hazard: these keys are outside the staged keyset.
        std::lock_guard<std::mutex> store_lock(*tb.store_mutex);
        EMBCACHE_RETURN_IF_ERROR(
            tb.store->push(dirty_keys.data(), d, rows.data(), dirty_vers.data())
                .with_context("early write-back of table '" + tb.opt.name + "'"));
      }
      tb.written_since_export.insert(tb.written_since_export.end(), dirty_keys.begin(),
                                     dirty_keys.end());
      pushed += d;
    }
    // Pushed first, erased after: a row is always in the device or in the store.
    EMBCACHE_RETURN_IF_ERROR(tb.io.erase(keys.data(), ev));
    for (std::size_t i = 0; i < ev; ++i) {
      tb.slot_used[frozen[i]] = 0;
      keep[frozen[i]] = 2;
    }
    tb.early.rows_evicted += ev;
    tb.early.rows_pushed += pushed;
    tb.early.bytes_cache_to_store += pushed * w * sizeof(float);
    leave.erase(
        std::remove_if(leave.begin(), leave.end(), [&](std::int64_t s) { return keep[s] == 2; }),
        leave.end());
    early_changed(tb);
  }
  st.leave_slots = std::move(leave);
  *go_on = true;
  return {};
}

// Inserts the staged rows [b, b + m) found in the store as far as they fit; `taken` marks them.
// Rows the initializer made wait for the boundary, which gives them a fresh version (until then
// the key does not exist). A store write since staging began (erase, write-back) stops it.
template <class Key, class Space>
status training_cache<Key, Space>::impl::early_insert(table_state& tb, std::size_t b, std::size_t m,
                                                      std::vector<std::uint8_t>& taken,
                                                      bool* go_on) {
  std::lock_guard<std::mutex> lock(*tb.install_mutex);
  auto& st = tb.staged;
  const std::size_t cap = tb.max_resident, w = tb.row_width;
  bool logged = false;
  {
    // The caller's pushes append to the log under the store's mutex (settle() may push while this
    // runs), so it is read under it too.
    std::lock_guard<std::mutex> store_lock(*tb.store_mutex);
    logged = !tb.store_writes_log.empty();
  }
  if (!early_current(tb) || logged || tb.cache->size() >= cap) {
    *go_on = false;
    return {};
  }
  const std::size_t room = cap - tb.cache->size();
  std::vector<std::size_t> pick;
  for (std::size_t i = b; i < b + m && pick.size() < room; ++i) {
    if (st.found[i]) pick.push_back(i);
  }
  const std::size_t k = pick.size();
  if (k == 0) return {};
  const bool whole = k == m;  // the batch as it lies in the staging
  std::vector<Key> keys(k);
  std::vector<std::uint64_t> vers(k);
  std::vector<float> gathered(whole ? 0 : k * w);
  for (std::size_t i = 0; i < k; ++i) {
    keys[i] = st.keys[pick[i]];
    vers[i] = st.versions[pick[i]];
    if (!whole) {
      std::memcpy(gathered.data() + i * w, st.rows.data() + pick[i] * w, w * sizeof(float));
    }
  }
  EMBCACHE_RETURN_IF_ERROR(tb.io.insert_or_assign(
      keys.data(), k, whole ? st.rows.data() + b * w : gathered.data(), vers.data()));
  std::vector<std::int64_t> placed(k);
  EMBCACHE_RETURN_IF_ERROR(tb.io.lookup_slots(keys.data(), k, placed.data()));
  for (std::size_t i = 0; i < k; ++i) {
    if (placed[i] < 0) return status::internal("early-inserted key is absent from the cache");
    tb.slot_used[placed[i]] = 1;
    tb.slot_synced[placed[i]] = vers[i];
    st.hit_slots.push_back(placed[i]);
    taken[pick[i]] = 1;
  }
  st.early_inserted += k;
  tb.early.rows_staged += k;
  tb.early.bytes_store_to_cache += k * w * sizeof(float);
  early_changed(tb);
  return {};
}

// Runs in the worker: stages the rows of `keys` (sorted, not resident at prefetch time), with the
// early install in keyset mode.
template <class Key, class Space>
status training_cache<Key, Space>::impl::stage(table_state& tb, std::vector<Key> keys,
                                               std::size_t spare_floats) {
  const auto t0 = clock_type::now();
  auto& st = tb.staged;
  st.keys = std::move(keys);
  const std::size_t n = st.keys.size(), w = tb.row_width;
  st.rows.resize(n * w);
  st.versions.assign(n, 0);
  st.found.assign(n, 0);
  bool early = false;
  if (options.mode == cache_mode::keyset) EMBCACHE_RETURN_IF_ERROR(early_evict(tb, &early));
  {
    // Rows the boundary will still have to gather (at most); its write-behind buffer is sized,
    // and its pages touched, here rather than at the boundary.
    const std::size_t resident = tb.cache->size(), cap = tb.max_resident;
    const std::size_t need = resident + n > cap ? resident + n - cap : 0;
    const std::size_t leaving = std::min(need, resident - std::min(resident, st.hit_slots.size()));
    if (spare_floats < leaving * w) st.gather.resize(leaving * w);
  }
  const bool planned = early;
  std::vector<std::uint8_t> taken(early ? n : 0, 0);
  const std::size_t batch = std::max<std::size_t>(1, options.prefetch_batch);
  std::unique_ptr<bool[]> found(new bool[std::min(batch, std::max<std::size_t>(n, 1))]);
  for (std::size_t b = 0; b < n; b += batch) {
    const std::size_t m = std::min(batch, n - b);
    EMBCACHE_RETURN_IF_ERROR(pull(tb, st.keys.data() + b, m, st.rows.data() + b * w, found.get(),
                                  st.versions.data() + b));
    for (std::size_t i = 0; i < m; ++i) {
      st.found[b + i] = found[i];
      if (!found[i]) initialize_row(tb, st.keys[b + i], st.rows.data() + (b + i) * w);
    }
    if (early) EMBCACHE_RETURN_IF_ERROR(early_insert(tb, b, m, taken, &early));
  }
  if (st.early_inserted > 0) {
    // Keep in the staging only the rows still missing, in key order.
    std::size_t out = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (taken[i]) continue;
      if (out != i) {
        st.keys[out] = st.keys[i];
        st.versions[out] = st.versions[i];
        st.found[out] = st.found[i];
        std::memmove(st.rows.data() + out * w, st.rows.data() + i * w, w * sizeof(float));
      }
      ++out;
    }
    st.keys.resize(out);
    st.versions.resize(out);
    st.found.resize(out);
  }
  if (planned) {
    std::lock_guard<std::mutex> lock(*tb.install_mutex);
    st.leave_valid = early_current(tb);
    const std::uint32_t e = tb.mark_epoch + 1;
    if (st.leave_valid && e != 0 && tb.slot_mark.size() == tb.cache->capacity()) {
      if (tb.next_mark.size() != tb.slot_mark.size()) tb.next_mark.assign(tb.slot_mark.size(), 0);
      for (const auto s : st.hit_slots) tb.next_mark[s] = e;
      st.premark = e;
    }
  }
  st.seconds = seconds_since(t0);
  return {};
}

// One table's boundary: which keys are missing, which residents leave, then out and in. Works on
// slots (no export, no sort of the residents).
template <class Key, class Space>
status training_cache<Key, Space>::impl::transition(table_state& tb, const std::vector<Key>& keys,
                                                    bool use_staging, table_counters& c) {
  const std::size_t n = keys.size();
  auto& st = tb.staged;
  const bool as_staged = use_staging && st.residency == tb.residency &&
                         st.resident_rows == tb.cache->size() && st.keyset == keys;
  if (tb.slot_mark.size() != tb.cache->capacity()) tb.slot_mark.assign(tb.cache->capacity(), 0);
  const bool premarked = as_staged && st.premark != 0;
  if (premarked) {
    std::swap(tb.slot_mark, tb.next_mark);  // the worker marked the keyset's resident slots
    tb.mark_epoch = st.premark;
    st.premark = 0;  // consumed
  } else if (++tb.mark_epoch == 0) {
    std::fill(tb.slot_mark.begin(), tb.slot_mark.end(), 0);
    std::fill(tb.next_mark.begin(), tb.next_mark.end(), 0);
    tb.mark_epoch = 1;
  }
  std::vector<Key> computed;
  const std::vector<Key>* miss = &computed;
  std::size_t early = 0;
  bool planned = false;
  if (as_staged) {
    // Nothing entered or left since prefetch computed the hits and staged the misses (and the
    // worker settled what it could of the residency).
    if (!premarked) {
      for (const auto s : st.hit_slots) tb.slot_mark[s] = tb.mark_epoch;
    }
    miss = &st.keys;
    early = st.early_inserted;
    planned = st.leave_valid;
  } else {
    auto& missing = computed;
    auto& slots = tb.scratch_slots;
    slots.resize(n);
    EMBCACHE_RETURN_IF_ERROR(tb.io.lookup_slots(keys.data(), n, slots.data()));
    missing.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (slots[i] < 0) {
        missing.push_back(keys[i]);
      } else {
        tb.slot_mark[slots[i]] = tb.mark_epoch;
      }
    }
  }
  ++tb.residency;
  const std::vector<Key>& missing = *miss;
  // Rows the worker inserted early were missing when the pass was prefetched.
  c.misses = missing.size() + early;
  c.hits = n - c.misses;
  const std::size_t resident = tb.cache->size();
  if (resident + missing.size() > tb.max_resident) {
    const std::size_t need = resident + missing.size() - tb.max_resident;
    const auto ref = tb.io.meta();
    std::vector<std::int64_t> computed_victims;
    std::vector<std::int64_t>& victims = planned ? st.leave_slots : computed_victims;
    if (!planned) {
      victims.reserve(resident - (n - missing.size()));
      const std::size_t cap = tb.cache->capacity();
      for (std::size_t s = 0; s < cap; ++s) {
        if (ref.states[s] > detail::state_busy && tb.slot_mark[s] != tb.mark_epoch) {
          victims.push_back(static_cast<std::int64_t>(s));
        }
      }
    }
    pick_oldest(ref, victims, need);
    EMBCACHE_RETURN_IF_ERROR(evict(tb, victims, ref, c));
  }
  return swap_in(tb, missing, use_staging, c);
}

template <class Key, class Space>
status training_cache<Key, Space>::impl::begin_pass(const std::vector<std::vector<Key>>& keysets) {
  if (keysets.size() != tables.size()) {
    return status::invalid_argument("begin_pass: " + std::to_string(keysets.size()) +
                                    " keysets for " + std::to_string(tables.size()) + " tables");
  }
  std::vector<std::vector<Key>> scratch(tables.size());
  std::vector<const std::vector<Key>*> ks(tables.size());
  for (std::size_t t = 0; t < tables.size(); ++t) {
    ks[t] = &sorted_unique(keysets[t], scratch[t]);
    if (ks[t]->size() > tables[t].opt.capacity) {
      return status::capacity_exceeded(
          "keyset of table '" + tables[t].opt.name + "' has " + std::to_string(ks[t]->size()) +
          " distinct keys, more than the cache capacity " + std::to_string(tables[t].opt.capacity));
    }
  }
  std::vector<table_counters> pass(tables.size());
  const auto tw = clock_type::now();
  const bool had_worker = worker.joinable() || flusher.joinable();
  wait_worker();
  // The previous boundary's write-behind must be in the store before this one reads it.
  const status settled = settle();
  const double waited = had_worker ? seconds_since(tw) : 0.0;
  if (!staging_status.ok()) {
    status s = staging_status;
    staging_status = {};
    drop_staging();
    return s.with_context("prefetch");
  }
  EMBCACHE_RETURN_IF_ERROR(settled);
  const bool use_staging = staged_valid;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    auto& tb = tables[t];
    auto& c = pass[t];
    c.seconds_prefetch_wait = t == 0 ? waited : 0.0;
    c.seconds_write_behind = tb.wb_seconds_done;
    tb.wb_seconds_done = 0;
    // What the worker evicted and inserted during the pass that just ended.
    c += tb.early;
    tb.early = {};
    if (use_staging && tb.staged.gather.size() > tb.spare_rows.size()) {
      tb.spare_rows.swap(tb.staged.gather);
    }
    EMBCACHE_RETURN_IF_ERROR(transition(tb, *ks[t], use_staging, c));
    c.seconds_staging = use_staging ? tb.staged.seconds : 0.0;
  }
  if (use_staging) drop_staging();
  if (write_behind_pending()) start_flusher();
  ++counters.passes;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    counters.last[t] = pass[t];
    counters.total[t] += pass[t];
  }
  return {};
}

template <class Key, class Space>
status training_cache<Key, Space>::impl::lookup(table_state& tb, const Key* keys, std::size_t n,
                                                std::int64_t* slots_out) {
  table_counters c;
  std::vector<Key> u(keys, keys + n);
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  const std::size_t m = u.size(), w = tb.row_width;
  if (m > tb.opt.capacity) {
    return status::capacity_exceeded("lookup batch of table '" + tb.opt.name + "' has " +
                                     std::to_string(m) + " distinct keys, more than the capacity " +
                                     std::to_string(tb.opt.capacity));
  }
  std::vector<std::int64_t> slots(m);
  EMBCACHE_RETURN_IF_ERROR(tb.io.lookup_slots(u.data(), m, slots.data()));
  std::vector<Key> miss;
  std::vector<std::size_t> miss_at;
  for (std::size_t i = 0; i < m; ++i) {
    if (slots[i] < 0) {
      miss.push_back(u[i]);
      miss_at.push_back(i);
    }
  }
  c.misses = miss.size();
  c.hits = m - miss.size();
  const auto t0 = clock_type::now();
  std::vector<float> rows(m * w, 0.0f);
  std::vector<std::uint64_t> vers(m, 0);
  std::vector<std::uint8_t> fresh(m, 0);
  if (!miss.empty()) {
    std::vector<float> r(miss.size() * w);
    std::vector<std::uint64_t> v(miss.size());
    std::unique_ptr<bool[]> f(new bool[miss.size()]);
    EMBCACHE_RETURN_IF_ERROR(pull(tb, miss.data(), miss.size(), r.data(), f.get(), v.data()));
    c.rows_pulled += miss.size();
    std::uint64_t init_version = 0;
    for (std::size_t i = 0; i < miss.size(); ++i) {
      const std::size_t d = miss_at[i];
      if (f[i]) {
        std::memcpy(rows.data() + d * w, r.data() + i * w, w * sizeof(float));
        vers[d] = v[i];
        c.bytes_store_to_cache += w * sizeof(float);
      } else {
        if (!init_version) init_version = fresh_version(tb);
        initialize_row(tb, miss[i], rows.data() + d * w);
        vers[d] = init_version;
        fresh[d] = 1;
        ++c.rows_initialized;
      }
    }
  }
  c.seconds_swap_in += seconds_since(t0);
  // Every distinct key goes in, hits included, so that no key of this batch is a victim.
  std::vector<Key> ev_keys(m);
  std::vector<float> ev_rows(m * w);
  std::vector<std::uint64_t> ev_vers(m);
  std::size_t ev_count = 0;
  std::unique_ptr<bool[]> found(new bool[std::max<std::size_t>(m, 1)]);
  std::vector<std::int64_t> placed(m);
  EMBCACHE_RETURN_IF_ERROR(tb.io.insert_and_evict(u.data(), m, rows.data(), vers.data(),
                                                  ev_keys.data(), ev_rows.data(), ev_vers.data(),
                                                  &ev_count, found.get(), placed.data()));
  // A victim leaves the slot its displacer now holds; displacers come in batch order.
  std::vector<std::uint8_t> dirty(ev_count, 1);
  {
    std::size_t j = 0;
    std::vector<std::uint64_t> synced_before;
    for (std::size_t i = 0; i < m; ++i) {
      if (found[i]) continue;
      const auto s = placed[i];
      if (s >= 0 && tb.slot_used[s]) {
        if (j < ev_count) dirty[j] = ev_vers[j] > tb.slot_synced[s];
        ++j;
      }
    }
    // Should the pairing not hold, every victim is written back (correct, only slower).
    if (j != ev_count) std::fill(dirty.begin(), dirty.end(), 1);
  }
  for (std::size_t i = 0; i < m; ++i) {
    if (found[i] || placed[i] < 0) continue;
    tb.slot_used[placed[i]] = 1;
    tb.slot_synced[placed[i]] = fresh[i] ? 0 : vers[i];
  }
  const auto t1 = clock_type::now();
  std::vector<Key> pk;
  std::vector<float> pr;
  std::vector<std::uint64_t> pv;
  for (std::size_t j = 0; j < ev_count; ++j) {
    if (!dirty[j]) continue;
    pk.push_back(ev_keys[j]);
    pr.insert(pr.end(), ev_rows.begin() + j * w, ev_rows.begin() + (j + 1) * w);
    pv.push_back(ev_vers[j]);
  }
  EMBCACHE_RETURN_IF_ERROR(push(tb, pk.data(), pk.size(), pr.data(), pv.data()));
  tb.written_since_export.insert(tb.written_since_export.end(), pk.begin(), pk.end());
  c.rows_pushed += pk.size();
  c.rows_evicted += ev_count;
  c.bytes_cache_to_store += pk.size() * w * sizeof(float);
  c.seconds_write_back += seconds_since(t1);
  if (slots_out) {
    for (std::size_t i = 0; i < n; ++i) {
      const auto d = std::lower_bound(u.begin(), u.end(), keys[i]) - u.begin();
      slots_out[i] = placed[d];
    }
  }
  counters.last[tb.index] = c;
  counters.total[tb.index] += c;
  for (std::size_t i = 0; i < m; ++i) {
    if (placed[i] < 0) {
      return status::capacity_exceeded("lookup: no room for key " + std::to_string(u[i]) +
                                       " in table '" + tb.opt.name + "'");
    }
  }
  return {};
}

template <class Key, class Space>
status training_cache<Key, Space>::impl::dump_store(table_state& tb, std::vector<Key>* keys,
                                                    std::vector<float>* vectors,
                                                    std::vector<float>* states,
                                                    std::vector<std::uint64_t>* versions) {
  const std::size_t w = tb.row_width, dim = tb.opt.dim, sw = tb.state_width;
  std::vector<Key> k;
  std::vector<float> r;
  std::vector<std::uint64_t> v;
  {
    std::lock_guard<std::mutex> lock(*tb.store_mutex);
    EMBCACHE_RETURN_IF_ERROR(tb.store->for_each(
        65536, [&](const Key* bk, const float* br, const std::uint64_t* bv, std::size_t n) {
          k.insert(k.end(), bk, bk + n);
          r.insert(r.end(), br, br + n * w);
          v.insert(v.end(), bv, bv + n);
          return status{};
        }));
  }
  std::vector<std::size_t> order(k.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return k[a] < k[b]; });
  const std::size_t n = k.size();
  keys->resize(n);
  vectors->resize(n * dim);
  states->resize(n * sw);
  versions->resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t o = order[i];
    (*keys)[i] = k[o];
    (*versions)[i] = v[o];
    std::memcpy(vectors->data() + i * dim, r.data() + o * w, dim * sizeof(float));
    if (sw) std::memcpy(states->data() + i * sw, r.data() + o * w + dim, sw * sizeof(float));
  }
  return {};
}

// --- public ------------------------------------------------------------------------------------

template <class Key, class Space>
training_cache<Key, Space>::training_cache(training_cache_options options,
                                           std::vector<table_options<Key>> tables, Space space)
    : impl_(std::make_unique<impl>()) {
  impl_->options = options;
  if constexpr (is_cuda_space_v<Space>) {
    if (!cuda_device_available()) {
      throw error(status_code::unsupported, "training_cache: the cuda space needs a CUDA device");
    }
    impl_->device = detail::cuda_current_device();
  }
  if (tables.empty()) throw error(status_code::invalid_argument, "training_cache: no tables");
  std::unordered_set<std::string> names;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    auto& o = tables[t];
    const std::string who = "training_cache: table " + std::to_string(t) + " '" + o.name + "'";
    if (o.name.empty() || !names.insert(o.name).second) {
      throw error(status_code::invalid_argument, who + ": empty or repeated name");
    }
    if (o.dim == 0 || o.capacity == 0) {
      throw error(status_code::invalid_argument, who + ": dim and capacity must be >= 1");
    }
    check_options(o.optimizer).with_context(who).throw_if_error();
    typename impl::table_state tb;
    tb.index = t;
    tb.state_width = state_width(o.optimizer.kind, o.dim);
    tb.row_width = o.dim + tb.state_width;
    cache_options co;
    co.capacity = o.slots ? std::max(o.slots, o.capacity) : o.capacity + o.capacity / 4;
    co.dim = o.dim;
    co.state_width = tb.state_width;
    co.init = o.init;
    co.init.seed = fold_seed(o.init.seed, t);
    co.init.state_value = initial_state_value(o.optimizer);
    co.scores = o.scores;
    tb.cache = std::make_unique<cache_type>(co, space);
    tb.io = cache_io<Key, Space>(tb.cache.get());
    const std::size_t slots = tb.cache->capacity();
    // Default: the slack of the default slots (capacity / 8 above capacity, 90% of capacity * 5 /
    // 4), never more than 90% of the slots (a user who asked for more slots for short probing
    // keeps them short).
    tb.max_resident = o.max_resident
                          ? o.max_resident
                          : std::max(o.capacity, std::min(slots / 10 * 9, o.capacity / 8 * 9));
    if (tb.max_resident < o.capacity || tb.max_resident > slots) {
      throw error(status_code::invalid_argument,
                  who + ": max_resident " + std::to_string(tb.max_resident) +
                      " must lie between the capacity " + std::to_string(o.capacity) +
                      " and the table's slots " + std::to_string(slots));
    }
    tb.slot_used.assign(tb.cache->capacity(), 0);
    tb.slot_synced.assign(tb.cache->capacity(), 0);
    if (o.store) {
      if (o.store->row_width() != tb.row_width) {
        throw error(status_code::invalid_argument,
                    who + ": store row width " + std::to_string(o.store->row_width()) +
                        " differs from dim + state width " + std::to_string(tb.row_width));
      }
      tb.store = o.store;
    } else {
      host_store_options ho;
      ho.table_name = o.name;
      ho.row_width = tb.row_width;
      tb.store = std::make_shared<host_store<Key>>(ho);
    }
    // Versions of rows already in the store stay below every version the cache hands out.
    tb.cache->advance_version(tb.store->max_version());
    tb.last_export_version = tb.store->max_version();
    tb.opt = std::move(o);
    impl_->tables.push_back(std::move(tb));
    impl_->counters.tables.push_back(impl_->tables.back().opt.name);
  }
  impl_->counters.last.resize(tables.size());
  impl_->counters.total.resize(tables.size());
}

template <class Key, class Space>
training_cache<Key, Space>::~training_cache() {
  if (impl_) {
    impl_->wait_worker();
    if (impl_->flusher.joinable()) impl_->flusher.join();
  }
}

template <class Key, class Space>
std::size_t training_cache<Key, Space>::num_tables() const noexcept {
  return impl_->tables.size();
}

template <class Key, class Space>
result<std::size_t> training_cache<Key, Space>::table_index(const std::string& name) const {
  for (std::size_t t = 0; t < impl_->tables.size(); ++t) {
    if (impl_->tables[t].opt.name == name) return t;
  }
  return status::not_found("no table named '" + name + "'");
}

template <class Key, class Space>
const table_options<Key>& training_cache<Key, Space>::table(std::size_t t) const {
  return impl_->tables.at(t).opt;
}
template <class Key, class Space>
std::size_t training_cache<Key, Space>::row_width(std::size_t t) const {
  return impl_->tables.at(t).row_width;
}
template <class Key, class Space>
typename training_cache<Key, Space>::cache_type& training_cache<Key, Space>::cache(std::size_t t) {
  return *impl_->tables.at(t).cache;
}
template <class Key, class Space>
param_store<Key>& training_cache<Key, Space>::store(std::size_t t) {
  auto& tb = impl_->tables.at(t);
  impl_->wait_worker();  // its early evictions push to the store
  // A failed push keeps its rows pending; the next call returning a status reports it.
  (void)impl_->settle();
  return *tb.store;
}
template <class Key, class Space>
const cache_counters& training_cache<Key, Space>::counters() const noexcept {
  return impl_->counters;
}
template <class Key, class Space>
const training_cache_options& training_cache<Key, Space>::options() const noexcept {
  return impl_->options;
}

template <class Key, class Space>
status training_cache<Key, Space>::begin_pass(const std::vector<std::vector<Key>>& keysets) {
  if (impl_->options.mode != cache_mode::keyset) {
    throw error(status_code::invalid_argument, "begin_pass needs cache_mode::keyset");
  }
  return impl_->begin_pass(keysets);
}

namespace {
template <class Key>
status read_keysets(const std::vector<std::string>& paths, keyset_format fmt,
                    std::vector<std::vector<Key>>* out) {
  out->clear();
  for (const auto& p : paths) {
    auto ks = read_keyset<Key>(p, fmt);
    if (!ks.ok()) return ks.get_status();
    out->push_back(std::move(ks).value());
  }
  return {};
}
}  // namespace

template <class Key, class Space>
status training_cache<Key, Space>::begin_pass_files(const std::vector<std::string>& paths) {
  std::vector<std::vector<Key>> ks;
  EMBCACHE_RETURN_IF_ERROR(read_keysets(paths, impl_->options.keyset_fmt, &ks));
  return begin_pass(ks);
}

template <class Key, class Space>
status training_cache<Key, Space>::prefetch(const std::vector<std::vector<Key>>& keysets) {
  auto& im = *impl_;
  if (keysets.size() != im.tables.size()) {
    return status::invalid_argument("prefetch: " + std::to_string(keysets.size()) +
                                    " keysets for " + std::to_string(im.tables.size()) + " tables");
  }
  im.drop_staging();
  im.staging_status = {};
  std::vector<std::vector<Key>> todo(im.tables.size());
  std::vector<std::size_t> spare(im.tables.size(), 0);
  for (std::size_t t = 0; t < im.tables.size(); ++t) {
    auto& tb = im.tables[t];
    std::vector<Key> scratch;
    const auto& keys = sorted_unique(keysets[t], scratch);
    std::vector<std::int64_t> slots(keys.size());
    EMBCACHE_RETURN_IF_ERROR(tb.io.lookup_slots(keys.data(), keys.size(), slots.data()));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (slots[i] < 0) todo[t].push_back(keys[i]);
    }
    auto& st = tb.staged;
    st.keyset.assign(keys.begin(), keys.end());
    st.hit_slots.clear();
    st.hit_slots.reserve(keys.size() - todo[t].size());
    for (const auto s : slots) {
      if (s >= 0) st.hit_slots.push_back(s);
    }
    st.residency = tb.residency;
    st.resident_rows = tb.cache->size();
    // The worker sizes the gather buffer of the boundary's write-behind, past what is spare.
    spare[t] = im.options.write_behind ? tb.spare_rows.size() : ~std::size_t{0};
    tb.log_store_writes = true;
  }
  im.staged_valid = true;
  im.worker = std::thread([&im, todo = std::move(todo), spare]() mutable {
    // Rows written behind at the last boundary must be in the store before staging reads it.
    im.wait_flush();
    std::size_t t = 0;
    try {
      // The worker's cache calls run on the device the cache was built on (a new thread starts
      // on device 0).
      if constexpr (is_cuda_space_v<Space>) detail::cuda_set_device(im.device);
      for (; t < im.tables.size(); ++t) {
        status s = im.stage(im.tables[t], std::move(todo[t]), spare[t]);
        if (!s.ok()) {
          im.staging_status = s.with_context("staging table '" + im.tables[t].opt.name + "'");
          return;
        }
      }
    } catch (const std::exception& e) {
      // A device or allocation failure: reported by the next begin_pass, never std::terminate.
      const std::string where =
          t < im.tables.size() ? "staging table '" + im.tables[t].opt.name + "'" : "staging";
      im.staging_status = status_of(e).with_context(where);
    }
  });
  return {};
}

template <class Key, class Space>
status training_cache<Key, Space>::prefetch_files(const std::vector<std::string>& paths) {
  std::vector<std::vector<Key>> ks;
  EMBCACHE_RETURN_IF_ERROR(read_keysets(paths, impl_->options.keyset_fmt, &ks));
  return prefetch(ks);
}

template <class Key, class Space>
bool training_cache<Key, Space>::prefetch_pending() const noexcept {
  return impl_->staged_valid;
}

template <class Key, class Space>
status training_cache<Key, Space>::lookup(std::size_t t, const Key* keys, std::size_t n,
                                          std::int64_t* slots_out) {
  if (impl_->options.mode != cache_mode::on_demand) {
    throw error(status_code::invalid_argument, "lookup needs cache_mode::on_demand");
  }
  EMBCACHE_RETURN_IF_ERROR(impl_->settle());
  auto& tb = impl_->tables.at(t);
  std::lock_guard<std::mutex> lock(*tb.install_mutex);
  ++tb.residency;
  return impl_->lookup(tb, keys, n, slots_out);
}

template <class Key, class Space>
status training_cache<Key, Space>::assign(std::size_t t, const Key* keys, std::size_t n,
                                          const float* rows) {
  auto& tb = impl_->tables.at(t);
  std::lock_guard<std::mutex> lock(*tb.install_mutex);
  std::vector<std::int64_t> slots(n);
  EMBCACHE_RETURN_IF_ERROR(tb.io.lookup_slots(keys, n, slots.data()));
  for (std::size_t i = 0; i < n; ++i) {
    if (slots[i] < 0) {
      return status::not_found("assign: key " + std::to_string(keys[i]) +
                               " is not resident in table '" + tb.opt.name + "'");
    }
  }
  return tb.io.assign_slots(slots.data(), n, rows);
}

template <class Key, class Space>
status training_cache<Key, Space>::read(std::size_t t, const Key* keys, std::size_t n,
                                        float* rows_out, bool* found_out) {
  auto& tb = impl_->tables.at(t);
  // Slots found here must not change owner before they are read.
  std::lock_guard<std::mutex> lock(*tb.install_mutex);
  std::vector<std::int64_t> slots(n);
  EMBCACHE_RETURN_IF_ERROR(tb.io.lookup_slots(keys, n, slots.data()));
  EMBCACHE_RETURN_IF_ERROR(tb.io.read_slots(slots.data(), n, rows_out));
  bool all_resident = true;
  for (std::size_t i = 0; i < n && all_resident; ++i) all_resident = slots[i] >= 0;
  // A row that left at the last boundary may still be on its way to the store.
  if (!all_resident) EMBCACHE_RETURN_IF_ERROR(impl_->settle());
  std::vector<Key> rest;
  std::vector<std::size_t> at;
  for (std::size_t i = 0; i < n; ++i) {
    if (found_out) found_out[i] = slots[i] >= 0;
    if (slots[i] < 0) {
      rest.push_back(keys[i]);
      at.push_back(i);
    }
  }
  if (rest.empty()) return {};
  const std::size_t w = tb.row_width;
  std::vector<float> r(rest.size() * w);
  std::unique_ptr<bool[]> f(new bool[rest.size()]);
  EMBCACHE_RETURN_IF_ERROR(impl_->pull(tb, rest.data(), rest.size(), r.data(), f.get(), nullptr));
  for (std::size_t i = 0; i < rest.size(); ++i) {
    if (f[i]) std::memcpy(rows_out + at[i] * w, r.data() + i * w, w * sizeof(float));
    if (found_out) found_out[at[i]] = f[i];
  }
  return {};
}

template <class Key, class Space>
status training_cache<Key, Space>::erase(std::size_t t, const Key* keys, std::size_t n) {
  auto& tb = impl_->tables.at(t);
  std::lock_guard<std::mutex> lock(*tb.install_mutex);
  // A pending write-behind of these keys must not land after the erase and revive them.
  EMBCACHE_RETURN_IF_ERROR(impl_->settle());
  std::vector<std::int64_t> slots(n);
  EMBCACHE_RETURN_IF_ERROR(tb.io.lookup_slots(keys, n, slots.data()));
  for (auto s : slots) {
    if (s >= 0) tb.slot_used[s] = 0;
  }
  ++tb.residency;
  EMBCACHE_RETURN_IF_ERROR(tb.io.erase(keys, n));
  {
    std::lock_guard<std::mutex> lock(*tb.store_mutex);
    if (tb.log_store_writes) tb.store_writes_log.insert(tb.store_writes_log.end(), keys, keys + n);
    EMBCACHE_RETURN_IF_ERROR(tb.store->erase(keys, n));
  }
  tb.erased_since_export.insert(tb.erased_since_export.end(), keys, keys + n);
  return {};
}

template <class Key, class Space>
status training_cache<Key, Space>::end_training() {
  auto& im = *impl_;
  // No early eviction of the worker may push after the flush.
  im.wait_worker();
  EMBCACHE_RETURN_IF_ERROR(im.settle());
  for (auto& tb : im.tables) {
    im.counters.total[tb.index] += tb.early;
    tb.early = {};
    std::vector<Key> rk;
    std::vector<std::uint64_t> rv;
    EMBCACHE_RETURN_IF_ERROR(im.residents(tb, &rk, &rv));
    EMBCACHE_RETURN_IF_ERROR(im.write_back(tb, rk, rv, false, im.counters.total[tb.index]));
    std::lock_guard<std::mutex> lock(*tb.store_mutex);
    EMBCACHE_RETURN_IF_ERROR(tb.store->flush());
  }
  return {};
}

namespace detail {

/// Where an export stands in one table's logs: the export point it reached and how many
/// written-back and erased keys it consumed. Applied only once the export is delivered, so a
/// failed delta write loses nothing: the next export covers the same rows again.
struct export_mark {
  std::uint64_t until_version = 0;
  std::size_t written = 0;
  std::size_t erased = 0;
};

template <class Impl>
void commit_deltas(Impl& im, const std::vector<export_mark>& marks) {
  for (std::size_t t = 0; t < im.tables.size() && t < marks.size(); ++t) {
    auto& tb = im.tables[t];
    std::lock_guard<std::mutex> install_lock(*tb.install_mutex);
    auto& w = tb.written_since_export;
    auto& e = tb.erased_since_export;
    w.erase(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(std::min(marks[t].written, w.size())));
    e.erase(e.begin(), e.begin() + static_cast<std::ptrdiff_t>(std::min(marks[t].erased, e.size())));
    tb.last_export_version = marks[t].until_version;
  }
}

/// The rows changed since the last export, per table; changes nothing but records in `marks`
/// what commit_deltas() consumes once the export is delivered.
template <class Key, class Impl>
result<std::vector<table_delta<Key>>> collect_deltas(Impl& im, bool with_state,
                                                    std::vector<export_mark>* marks) {
  EMBCACHE_RETURN_IF_ERROR(im.settle());
  std::vector<table_delta<Key>> out;
  marks->clear();
  for (auto& tb : im.tables) {
    std::lock_guard<std::mutex> install_lock(*tb.install_mutex);
    table_delta<Key> d;
    d.table = tb.opt.name;
    d.dim = tb.opt.dim;
    d.state_width = with_state ? tb.state_width : 0;
    d.since_version = tb.last_export_version;
    d.until_version = tb.cache->version();
    const auto f = export_filter::changed_since(d.since_version);
    auto res = tb.cache->export_to_host(f);
    if (!res.ok()) return res.get_status();
    auto& ex = res.value();
    // Rows written back since the last export and not resident any more come from the store.
    std::vector<Key> written = tb.written_since_export;
    export_mark mark;
    mark.until_version = d.until_version;
    mark.written = written.size();
    mark.erased = tb.erased_since_export.size();
    std::sort(written.begin(), written.end());
    written.erase(std::unique(written.begin(), written.end()), written.end());
    std::vector<std::int64_t> slots(written.size());
    EMBCACHE_RETURN_IF_ERROR(tb.io.lookup_slots(written.data(), written.size(), slots.data()));
    std::vector<Key> gone;
    for (std::size_t i = 0; i < written.size(); ++i) {
      if (slots[i] < 0) gone.push_back(written[i]);
    }
    const std::size_t w = tb.row_width;
    std::vector<float> gr(gone.size() * w);
    std::vector<std::uint64_t> gv(gone.size());
    std::unique_ptr<bool[]> gf(new bool[std::max<std::size_t>(gone.size(), 1)]);
    EMBCACHE_RETURN_IF_ERROR(im.pull(tb, gone.data(), gone.size(), gr.data(), gf.get(), gv.data()));
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
    std::vector<Key> erased = tb.erased_since_export;
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

}  // namespace detail

template <class Key, class Space>
result<std::vector<table_delta<Key>>> training_cache<Key, Space>::export_incremental(
    bool with_state) {
  std::vector<detail::export_mark> marks;
  auto out = detail::collect_deltas<Key>(*impl_, with_state, &marks);
  if (out.ok()) detail::commit_deltas(*impl_, marks);
  return out;
}


template <class Key, class Space>
result<std::string> training_cache<Key, Space>::export_incremental_to(const std::string& dir,
                                                                      bool with_state) {
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
  std::vector<detail::export_mark> marks;
  auto deltas = detail::collect_deltas<Key>(*impl_, with_state, &marks);
  if (!deltas.ok()) return deltas.get_status();
  char name[32];
  std::snprintf(name, sizeof name, "delta-%06d", next);
  const std::string final_dir = dir + "/" + name;
  const std::string tmp = dir + "/." + name + ".tmp";
  fs::remove_all(tmp, ec);
  nlohmann::json manifest = {{"format", "embcache-delta"},
                             {"format_version", model_format_version},
                             {"key_type", to_string(key_type_of<Key>())},
                             {"sequence", next}};
  nlohmann::json tables = nlohmann::json::array();
  for (std::size_t t = 0; t < deltas.value().size(); ++t) {
    const auto& d = deltas.value()[t];
    const auto& tb = impl_->tables[t];
    nlohmann::json files = nlohmann::json::object();
    const state_files sf{
        with_state ? std::vector<const char*>{"opt_state"} : std::vector<const char*>{},
        tb.state_width};
    EMBCACHE_RETURN_IF_ERROR(write_table_folder(tmp + "/" + d.table, d.keys, d.vectors, d.states,
                                                d.versions, sf, nullptr, &d.erased, &files));
    tables.push_back({{"name", d.table},
                      {"dim", d.dim},
                      {"state_width", with_state ? tb.state_width : 0},
                      {"optimizer", to_string(tb.opt.optimizer.kind)},
                      {"count", d.keys.size()},
                      {"erased", d.erased.size()},
                      {"since_version", d.since_version},
                      {"until_version", d.until_version},
                      {"files", files}});
  }
  manifest["tables"] = tables;
  EMBCACHE_RETURN_IF_ERROR(write_manifest(tmp, manifest));
  EMBCACHE_RETURN_IF_ERROR(sync_folder(tmp));
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    return sys_error("cannot rename to", final_dir, errno);
  }
  detail::commit_deltas(*impl_, marks);  // the delta is in place: its rows leave the logs
  EMBCACHE_RETURN_IF_ERROR(sync_folder(dir));
  return final_dir;
}

template <class Key, class Space>
status training_cache<Key, Space>::save(const std::string& dir_in,
                                        const save_progress& on_progress) {
  impl_->wait_worker();  // the store must not change between the write-back and the dump
  EMBCACHE_RETURN_IF_ERROR(end_training());
  std::uint64_t rows_total = 0, rows_done = 0;
  for (auto& tb : impl_->tables) rows_total += tb.store->size();
  if (on_progress) on_progress(0, rows_total);
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string tmp = dir + ".tmp";
  const std::string old = dir + ".old";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return status::io_error("cannot create '" + tmp + "': " + ec.message());
  nlohmann::json tables = nlohmann::json::array();
  for (auto& tb : impl_->tables) {
    std::vector<Key> keys;
    std::vector<float> vectors, states;
    std::vector<std::uint64_t> versions;
    EMBCACHE_RETURN_IF_ERROR(impl_->dump_store(tb, &keys, &vectors, &states, &versions));
    // `slot_id` only when every row has one: HugeCTR reads it as one slot per key.
    std::vector<std::uint64_t> slot_ids;
    std::size_t no_slot_id = 0;
    if (!tb.slot_ids.empty() || tb.opt.slot_of) {
      slot_ids.resize(keys.size());
      for (std::size_t i = 0; i < keys.size(); ++i) {
        const auto it = tb.slot_ids.find(keys[i]);
        if (it != tb.slot_ids.end())
          slot_ids[i] = it->second;
        else if (tb.opt.slot_of)
          slot_ids[i] = tb.opt.slot_of(keys[i]);
        else
          ++no_slot_id;
      }
    }
    const bool with_slot_ids = (!tb.slot_ids.empty() || tb.opt.slot_of) && no_slot_id == 0;
    nlohmann::json files = nlohmann::json::object();
    EMBCACHE_RETURN_IF_ERROR(
        write_table_folder(tmp + "/" + tb.opt.name, keys, vectors, states, versions,
                           state_files{hugectr_state_files(tb.opt.optimizer.kind), tb.opt.dim},
                           with_slot_ids ? &slot_ids : nullptr,
                           static_cast<const std::vector<Key>*>(nullptr), &files));
    tables.push_back({{"name", tb.opt.name},
                      {"dim", tb.opt.dim},
                      {"state_width", tb.state_width},
                      {"optimizer", to_string(tb.opt.optimizer.kind)},
                      {"count", keys.size()},
                      {"version", tb.cache->version()},
                      {"files", files}});
    if (no_slot_id) tables.back()["rows_without_slot_id"] = no_slot_id;
    rows_done += keys.size();
    if (on_progress) on_progress(rows_done, rows_total);
  }
  nlohmann::json manifest = {{"format", "embcache-model"},
                             {"format_version", model_format_version},
                             {"key_type", to_string(key_type_of<Key>())},
                             {"tables", tables}};
  EMBCACHE_RETURN_IF_ERROR(write_manifest(tmp, manifest));
  EMBCACHE_RETURN_IF_ERROR(sync_folder(tmp));
  const std::string parent =
      fs::path(dir).has_parent_path() ? fs::path(dir).parent_path().string() : std::string(".");
  // `dir` exists only when complete; while it is moved aside, `dir.old` is the complete one.
  if (fs::exists(dir)) {
    fs::remove_all(old, ec);
    if (::rename(dir.c_str(), old.c_str()) != 0) return sys_error("cannot rename", dir, errno);
    EMBCACHE_RETURN_IF_ERROR(sync_folder(parent));
  }
  if (::rename(tmp.c_str(), dir.c_str()) != 0) return sys_error("cannot rename to", dir, errno);
  EMBCACHE_RETURN_IF_ERROR(sync_folder(parent));
  fs::remove_all(old, ec);
  return {};
}

template <class Key, class Space>
status training_cache<Key, Space>::load(const std::string& dir_in, const load_options& options) {
  auto& im = *impl_;
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (!fs::exists(dir + "/manifest.json") && fs::exists(dir + ".old/manifest.json")) {
    dir += ".old";  // a save was interrupted between its two renames
  }
  std::vector<loaded_table> data(im.tables.size());
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return status::not_found("load: folder '" + dir + "' does not exist");
  }
  const std::string manifest_path = dir + "/manifest.json";
  if (fs::exists(manifest_path, ec)) {
    std::vector<table_schema> schemas;
    for (const auto& tb : im.tables) {
      schemas.push_back({tb.opt.name, tb.opt.dim, tb.state_width, tb.opt.optimizer.kind});
    }
    EMBCACHE_RETURN_IF_ERROR(read_saved_model(dir, to_string(key_type_of<Key>()), schemas, &data));
  } else if (!options.allow_hugectr_folder) {
    return status::not_found(
        "load: '" + manifest_path +
        "' is missing; a folder written by save() always has it (without it the optimizer state "
        "and the checksums would be dropped). To load a plain HugeCTR folder, pass "
        "load_options::allow_hugectr_folder");
  } else {
    // A plain HugeCTR sparse model folder per table.
    for (std::size_t t = 0; t < im.tables.size(); ++t) {
      auto& tb = im.tables[t];
      std::string folder = dir + "/" + tb.opt.name;
      if (!fs::exists(folder + "/key") && im.tables.size() == 1 && fs::exists(dir + "/key")) {
        folder = dir;
      }
      EMBCACHE_RETURN_IF_ERROR(
          read_hugectr_table(folder, tb.opt.dim, tb.opt.optimizer.kind, &data[t])
              .with_context("load: table '" + tb.opt.name + "'"));
    }
  }
  for (std::size_t t = 0; t < im.tables.size(); ++t) {
    const auto& tb = im.tables[t];
    EMBCACHE_RETURN_IF_ERROR(check_loaded_rows(data[t], tb.opt.dim, options)
                                 .with_context("load: table '" + tb.opt.name + "'"));
    if constexpr (!std::is_same_v<Key, std::int64_t>) {
      for (auto k : data[t].keys) {
        if (k < 0 || k > static_cast<std::int64_t>(std::numeric_limits<Key>::max())) {
          return status::invalid_argument(
              "load: key " + std::to_string(k) + " in '" + data[t].folder + "/key' of table '" +
              tb.opt.name + "' does not fit the key type " + to_string(key_type_of<Key>()));
        }
      }
    }
  }
  // Validated: replace the rows (write-behind rows of the old model would land on the new one).
  im.drop_staging();
  im.discard_write_behind();
  for (std::size_t t = 0; t < im.tables.size(); ++t) {
    auto& tb = im.tables[t];
    auto& L = data[t];
    ++tb.residency;
    tb.cache->clear();
    std::fill(tb.slot_used.begin(), tb.slot_used.end(), 0);
    std::vector<Key> old;
    {
      std::lock_guard<std::mutex> lock(*tb.store_mutex);
      EMBCACHE_RETURN_IF_ERROR(tb.store->for_each(
          65536, [&](const Key* k, const float*, const std::uint64_t*, std::size_t n) {
            old.insert(old.end(), k, k + n);
            return status{};
          }));
      EMBCACHE_RETURN_IF_ERROR(tb.store->erase(old.data(), old.size()));
    }
    const std::size_t n = L.keys.size(), w = tb.row_width, dim = tb.opt.dim;
    std::vector<Key> keys(L.keys.begin(), L.keys.end());
    std::vector<float> rows(n * w);
    std::uint64_t maxv = L.version;
    for (std::size_t i = 0; i < n; ++i) {
      float* row = rows.data() + i * w;
      std::memcpy(row, L.vectors.data() + i * dim, dim * sizeof(float));
      if (tb.state_width && L.states.empty()) initialize_state(tb.opt.optimizer, dim, row + dim);
      for (const auto& part : L.states) {
        std::memcpy(row + dim + part.offset, part.values.data() + i * part.width,
                    part.width * sizeof(float));
      }
      maxv = std::max(maxv, L.versions[i]);
    }
    tb.slot_ids.clear();
    for (std::size_t i = 0; L.has_slot_ids && i < n; ++i) tb.slot_ids[keys[i]] = L.slot_ids[i];
    EMBCACHE_RETURN_IF_ERROR(im.push(tb, keys.data(), n, rows.data(), L.versions.data()));
    {
      std::lock_guard<std::mutex> lock(*tb.store_mutex);
      EMBCACHE_RETURN_IF_ERROR(tb.store->flush());
    }
    tb.cache->advance_version(maxv);
    tb.last_export_version = tb.cache->version();
    tb.written_since_export.clear();
    tb.erased_since_export.clear();
  }
  return {};
}

template <class Key, class Space>
status training_cache<Key, Space>::set_slot_ids(std::size_t t, const Key* keys,
                                                const std::uint64_t* slot_ids, std::size_t n) {
  if (t >= impl_->tables.size()) {
    return status::invalid_argument("set_slot_ids: table " + std::to_string(t) + " of " +
                                    std::to_string(impl_->tables.size()));
  }
  auto& ids = impl_->tables[t].slot_ids;
  for (std::size_t i = 0; i < n; ++i) ids[keys[i]] = slot_ids[i];
  return {};
}

template <class Key, class Space>
result<std::uint64_t> training_cache<Key, Space>::slot_id(std::size_t t, Key key) const {
  if (t >= impl_->tables.size()) {
    return status::not_found("slot_id: table " + std::to_string(t) + " of " +
                             std::to_string(impl_->tables.size()));
  }
  const auto& tb = impl_->tables[t];
  const auto it = tb.slot_ids.find(key);
  if (it != tb.slot_ids.end()) return it->second;
  if (tb.opt.slot_of) return tb.opt.slot_of(key);
  return status::not_found("slot_id: key " + std::to_string(key) + " of table '" + tb.opt.name +
                           "' has no slot id");
}

}  // namespace embcache
