// read_delta_folder of a small valid delta folder one of whose files is replaced by the input.
// The first byte chooses the file and what follows the mutation; the rest is the new content:
//   bits 0-2  the file (0 key, 1 emb_vector, 2 version, 3 opt_state, 4 erased, 5-7 manifest.json)
//   bit 3     the manifest gets the new file's xxh64 (so the content reaches the row checks)
//   bit 4     the manifest gets the new file's size as its `bytes`
//   bit 5     the manifest's `count` (`erased` for the erased file) becomes the new file's size /
//             its row size (rounded down)
// A refusal is a status naming the folder; a folder that is read holds arrays of the sizes its
// manifest gives, each key once, no key both a row and a tombstone, every float finite.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "delta_fixture.hpp"
#include "embcache/serving.hpp"
#include "fuzz_target.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace {

using embcache::status_code;
using embcache::fuzz::hex64;
using embcache::fuzz::read_bytes;

constexpr const char* delta_file_names[5] = {"key", "emb_vector", "version", "opt_state", "erased"};

struct delta_fixture {
  std::string dir;                               // the delta, its files rewritten for each input
  std::string file_bytes[5];                     // the delta's files
  nlohmann::json manifest;                       // the delta's manifest
  std::size_t row_bytes[5] = {8, 16, 8, 16, 8};  // dim 4, AdaGrad state width 4

  delta_fixture() {
    dir = embcache::fuzz::write_delta_fixture(embcache::fuzz::fresh_dir("delta_folder") + "d");
    for (int i = 0; i < 5; ++i) file_bytes[i] = read_bytes(dir + "/emb/" + delta_file_names[i]);
    manifest = nlohmann::json::parse(read_bytes(dir + "/manifest.json"));
    embcache::read_delta_folder(dir).value();  // the unchanged folder is read
  }
};

delta_fixture& the_delta_fixture() {
  static delta_fixture f;
  return f;
}

}  // namespace

EMBCACHE_FUZZ_TARGET(delta_folder) {
  delta_fixture& f = the_delta_fixture();
  const auto [mode, content, n] = embcache::fuzz::split_mode(data, size);
  const int which = mode & 7;
  for (int i = 0; i < 5; ++i) {
    const std::string path = f.dir + "/emb/" + delta_file_names[i];
    if (i == which)
      embcache::fuzz::overwrite_file(path, content, n);
    else
      embcache::fuzz::overwrite_file(path, f.file_bytes[i].data(), f.file_bytes[i].size());
  }
  if (which >= 5) {
    embcache::fuzz::overwrite_file(f.dir + "/manifest.json", content, n);
  } else {
    nlohmann::json m = f.manifest;
    auto& entry = m["tables"][0];
    if (mode & 8) entry["files"][delta_file_names[which]]["xxh64"] = hex64(XXH64(content, n, 0));
    if (mode & 16) entry["files"][delta_file_names[which]]["bytes"] = n;
    if (mode & 32) entry[which == 4 ? "erased" : "count"] = n / f.row_bytes[which];
    const std::string text = m.dump();
    embcache::fuzz::overwrite_file(f.dir + "/manifest.json", text.data(), text.size());
  }

  const auto r = embcache::read_delta_folder(f.dir);
  if (!r.ok()) {
    const auto c = r.get_status().code();
    EMBCACHE_FUZZ_CHECK(c == status_code::corruption || c == status_code::invalid_argument ||
                        c == status_code::not_found || c == status_code::unsupported);
    EMBCACHE_FUZZ_CHECK(r.get_status().message().find(f.dir) != std::string::npos);
    return;
  }
  for (const auto& t : r.value().tables) {
    EMBCACHE_FUZZ_CHECK(t.vectors.size() == t.keys.size() * t.dim);
    EMBCACHE_FUZZ_CHECK(t.states.size() == t.keys.size() * t.state_width);
    EMBCACHE_FUZZ_CHECK(t.versions.size() == t.keys.size());
    EMBCACHE_FUZZ_CHECK(t.since_version <= t.version);
    const std::set<std::int64_t> keys(t.keys.begin(), t.keys.end());
    EMBCACHE_FUZZ_CHECK(keys.size() == t.keys.size());
    for (auto k : t.erased) EMBCACHE_FUZZ_CHECK(keys.count(k) == 0);
    for (float v : t.vectors) EMBCACHE_FUZZ_CHECK(std::isfinite(v));
    for (float v : t.states) EMBCACHE_FUZZ_CHECK(std::isfinite(v));
  }
}
