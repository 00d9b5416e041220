// A small valid training-cache save shared by the save_manifest and save_files targets: one
// AdaGrad table "emb" of dim 4 holding six trained rows. Deterministic (fixed keys, seed and
// updates), so the seed corpora, written from it, carry checksums that match it.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "embcache/training_cache.hpp"
#include "fuzz_target.hpp"

namespace embcache::fuzz {

inline table_options<std::int64_t> save_fixture_table() {
  table_options<std::int64_t> o;
  o.name = "emb";
  o.dim = 4;
  o.optimizer.kind = optimizer_kind::adagrad;
  o.capacity = 64;
  o.init.seed = 11;
  return o;
}

/// A cache the save loads into.
inline std::unique_ptr<training_cache<std::int64_t>> save_fixture_cache() {
  return std::make_unique<training_cache<std::int64_t>>(training_cache_options{},
                                                        std::vector{save_fixture_table()});
}

/// Writes the save to `dir` (the folder save() writes: manifest.json and emb/{key, emb_vector,
/// version, AdaGrad.accm}).
inline status write_save_fixture(const std::string& dir) {
  auto tc = save_fixture_cache();
  const std::vector<std::int64_t> keys = {-7, 0, 3, 12, 1000, std::int64_t{1} << 40};
  EMBCACHE_RETURN_IF_ERROR(tc->begin_pass({keys}));
  const std::size_t w = tc->row_width(0);
  std::vector<float> rows(keys.size() * w);
  EMBCACHE_RETURN_IF_ERROR(tc->read(0, keys.data(), keys.size(), rows.data(), nullptr));
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = rows[i] * 0.5f + float(i) * 0.125f;
  EMBCACHE_RETURN_IF_ERROR(tc->assign(0, keys.data(), keys.size(), rows.data()));
  return tc->save(dir);
}

/// The whole content of `path` ("" when it cannot be read).
inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// An xxHash64 digest as a manifest writes it: 16 lower-case hex digits.
inline std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

/// An input whose first byte says what to do with the rest (the save_files and delta_folder
/// targets): `mode` (0 for an empty input) and the content after it.
struct mode_and_content {
  std::uint8_t mode = 0;
  const char* content = "";
  std::size_t size = 0;
};

inline mode_and_content split_mode(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return {};
  return {data[0], reinterpret_cast<const char*>(data + 1), size - 1};
}

/// Every row of the cache's store, by key, as raw bytes (so that NaN rows compare equal).
inline std::map<std::int64_t, std::string> save_fixture_rows(training_cache<std::int64_t>& tc) {
  std::map<std::int64_t, std::string> m;
  const std::size_t w = tc.row_width(0);
  const status s = tc.store(0).for_each(
      1024, [&](const std::int64_t* k, const float* r, const std::uint64_t*, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i)
          m[k[i]].assign(reinterpret_cast<const char*>(r + i * w), w * sizeof(float));
        return status{};
      });
  if (!s.ok()) throw error(s.code(), s.message());
  return m;
}

/// Replaces the content of `path` with `n` bytes, in place: a file truncated to zero and written
/// again (O_TRUNC) makes ext4 with online discard wait for the device on every input, and that
/// wait, not the load, would be the cost of an iteration. A file already holding the bytes is
/// left alone.
inline void overwrite_file(const std::string& path, const void* data, std::size_t n) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw error(status_code::io_error, "cannot open '" + path + "'");
  struct stat st {};
  ::fstat(fd, &st);
  bool same = static_cast<std::size_t>(st.st_size) == n;
  if (same && n > 0) {
    std::string old(n, '\0');
    same = ::pread(fd, old.data(), n, 0) == static_cast<ssize_t>(n) &&
           std::memcmp(old.data(), data, n) == 0;
  }
  bool ok = true;
  if (!same) {
    ok = n == 0 || ::pwrite(fd, data, n, 0) == static_cast<ssize_t>(n);
    if (ok && static_cast<std::size_t>(st.st_size) > n) ok = ::ftruncate(fd, off_t(n)) == 0;
  }
  ::close(fd);
  if (!ok) throw error(status_code::io_error, "cannot write '" + path + "'");
}

/// The input of a file target: a mode byte, then the new content of the file it picks.
struct file_input : mode_and_content {
  file_input(const std::uint8_t* data, std::size_t size) : mode_and_content(split_mode(data, size)) {}
  /// The load options of the mode: allow_hugectr_folder when `hugectr`, allow_duplicate_keys from
  /// bit 6, allow_non_finite from bit 7.
  load_options options(bool hugectr) const {
    load_options o;
    o.allow_hugectr_folder = hugectr;
    o.allow_duplicate_keys = mode & 64;
    o.allow_non_finite = mode & 128;
    return o;
  }
};

/// What a file target expects of a load whose options are `options`, given the rows before and
/// after and the keys of the key file: a refusal (corruption, invalid_argument or `also`) with a
/// message changes nothing; a success holds a row per key (fewer only when repeats are allowed)
/// and finite floats unless they are allowed. Returns whether the load succeeded.
inline bool check_load_outcome(const status& s, const load_options& options,
                               const std::map<std::int64_t, std::string>& before,
                               const std::map<std::int64_t, std::string>& after,
                               std::size_t keys_in_file,
                               status_code also = status_code::corruption) {
  if (!s.ok()) {
    const auto c = s.code();
    EMBCACHE_FUZZ_CHECK(c == status_code::corruption || c == status_code::invalid_argument ||
                        c == also);
    EMBCACHE_FUZZ_CHECK(!s.message().empty());
    EMBCACHE_FUZZ_CHECK(after == before);  // validated before anything changes
    return false;
  }
  if (options.allow_duplicate_keys)
    EMBCACHE_FUZZ_CHECK(after.size() <= keys_in_file);
  else
    EMBCACHE_FUZZ_CHECK(after.size() == keys_in_file);
  if (!options.allow_non_finite) {
    for (const auto& [k, r] : after) {
      for (std::size_t i = 0; i + 4 <= r.size(); i += 4) {
        float v;
        std::memcpy(&v, r.data() + i, 4);
        EMBCACHE_FUZZ_CHECK(std::isfinite(v));
      }
    }
  }
  return true;
}

}  // namespace embcache::fuzz
