// training_cache::load of a small valid save one of whose binary files (key, emb_vector, version,
// AdaGrad.accm) is replaced by the input. The first byte chooses the file and what follows the
// mutation; the rest is the file's new content:
//   bits 0-1  the file (0 key, 1 emb_vector, 2 version, 3 AdaGrad.accm, HugeCTR's state file)
//   bit 2     the manifest gets the new file's xxh64 (so the content reaches the row checks)
//   bit 3     the manifest gets the new file's size as its `bytes`
//   bit 4     the manifest's `count` becomes the new file's size / its row size (rounded down)
//   bit 5     no manifest: loaded as a plain HugeCTR folder (load_options::allow_hugectr_folder)
//   bit 6     load_options::allow_duplicate_keys
//   bit 7     load_options::allow_non_finite
// A load that fails changes nothing; one that succeeds holds what the files say, each key once
// and every float finite unless the options allow otherwise.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fuzz_target.hpp"
#include "save_fixture.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace {

using embcache::fuzz::hex64;
using embcache::fuzz::read_bytes;
namespace fs = std::filesystem;
using embcache::status_code;

constexpr const char* file_names[4] = {"key", "emb_vector", "version", "AdaGrad.accm"};

struct files_fixture {
  std::string dir;                // a save, its files rewritten for each input
  std::string plain;              // the same files without the manifest: a plain HugeCTR folder
  std::string file_bytes[4];      // the save's files
  nlohmann::json manifest;        // the save's manifest
  std::size_t row_bytes[4] = {};  // bytes per row of each file
  std::unique_ptr<embcache::training_cache<std::int64_t>> cache;
  std::map<std::int64_t, std::string> rows;  // the save's rows

  files_fixture() {
    const std::string root = embcache::fuzz::fresh_dir("save_files");
    const std::string base = root + "base";
    embcache::fuzz::write_save_fixture(base).throw_if_error();
    for (int i = 0; i < 4; ++i)
      file_bytes[i] = embcache::fuzz::read_bytes(base + "/emb/" + file_names[i]);
    manifest = nlohmann::json::parse(embcache::fuzz::read_bytes(base + "/manifest.json"));
    const auto& t = manifest["tables"][0];
    const std::size_t dim = t["dim"].get<std::size_t>(), sw = t["state_width"].get<std::size_t>();
    row_bytes[0] = 8;
    row_bytes[1] = dim * 4;
    row_bytes[2] = 8;
    row_bytes[3] = sw * 4;
    cache = embcache::fuzz::save_fixture_cache();
    cache->load(base).throw_if_error();
    rows = embcache::fuzz::save_fixture_rows(*cache);
    dir = root + "save";
    plain = root + "plain";
    fs::create_directories(dir + "/emb");
    fs::create_directories(plain + "/emb");
  }
};

files_fixture& the_files_fixture() {
  static files_fixture f;
  return f;
}

}  // namespace

EMBCACHE_FUZZ_TARGET(save_files) {
  files_fixture& f = the_files_fixture();
  const embcache::fuzz::file_input in(data, size);
  const int which = in.mode & 3;
  const bool hugectr = in.mode & 32;
  const embcache::load_options options = in.options(hugectr);

  const std::string& folder = hugectr ? f.plain : f.dir;
  for (int i = 0; i < 4; ++i) {
    const std::string path = folder + "/emb/" + file_names[i];
    if (i == which)
      embcache::fuzz::overwrite_file(path, in.content, in.size);
    else
      embcache::fuzz::overwrite_file(path, f.file_bytes[i].data(), f.file_bytes[i].size());
  }
  nlohmann::json m = f.manifest;
  auto& entry = m["tables"][0];
  if (in.mode & 4)
    entry["files"][file_names[which]]["xxh64"] = embcache::fuzz::hex64(XXH64(in.content, in.size, 0));
  if (in.mode & 8) entry["files"][file_names[which]]["bytes"] = in.size;
  if ((in.mode & 16) && f.row_bytes[which] > 0) entry["count"] = in.size / f.row_bytes[which];
  if (!hugectr) {
    const std::string text = m.dump();
    embcache::fuzz::overwrite_file(f.dir + "/manifest.json", text.data(), text.size());
  }

  const auto before = embcache::fuzz::save_fixture_rows(*f.cache);
  const embcache::status s = f.cache->load(folder, options);
  const auto after = embcache::fuzz::save_fixture_rows(*f.cache);
  // One row per key of the key file, fewer only when repeats were allowed.
  const std::size_t keys_in_file = (which == 0 ? in.size : f.file_bytes[0].size()) / 8;
  if (!embcache::fuzz::check_load_outcome(s, options, before, after, keys_in_file)) return;
  // Without a new checksum a loaded manifest save read the save's own bytes.
  if (!hugectr && !(in.mode & 4)) EMBCACHE_FUZZ_CHECK(after == f.rows);
  if (!hugectr) EMBCACHE_FUZZ_CHECK(entry["count"].get<std::size_t>() == keys_in_file);
}
