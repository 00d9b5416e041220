// training_cache::load of a small valid save of an Adam table with slot ids, or of the same files
// as a plain HugeCTR folder, one of whose files (slot_id, Adam.m, Adam.v: HugeCTR's per-key
// slot ids and optimizer state) is replaced by the input or removed. The first byte chooses the
// file and what follows the mutation; the rest is the file's new content:
//   bits 0-1  the file (0 slot_id, 1 Adam.m, 2 Adam.v, 3 key)
//   bit 2     the file is removed instead (and, in a save, its manifest entry)
//   bit 3     no manifest: loaded as a plain HugeCTR folder (load_options::allow_hugectr_folder)
//   bit 4     the manifest gets the new file's xxh64 and size (so the content reaches the checks)
//   bit 5     the manifest's `count` becomes the new file's size / its row size (rounded down)
//   bit 6     load_options::allow_duplicate_keys
//   bit 7     load_options::allow_non_finite
// A load that fails changes nothing; one that succeeds holds a row per key of the key file, every
// float finite unless allowed otherwise, and the slot id of each key exactly when `slot_id` was
// there (the file's own ids when the key file is unchanged).
#include <filesystem>
#include <nlohmann/json.hpp>

#include "fuzz_target.hpp"
#include "save_fixture.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace {

namespace fs = std::filesystem;
using embcache::status_code;

constexpr const char* hugectr_file_names[4] = {"slot_id", "Adam.m", "Adam.v", "key"};
constexpr const char* other_files[2] = {"emb_vector", "version"};  // never changed

embcache::table_options<std::int64_t> adam_table() {
  auto o = embcache::fuzz::save_fixture_table();
  o.optimizer.kind = embcache::optimizer_kind::adam;
  o.dim = 3;
  return o;
}

std::unique_ptr<embcache::training_cache<std::int64_t>> adam_cache() {
  return std::make_unique<embcache::training_cache<std::int64_t>>(
      embcache::training_cache_options{}, std::vector{adam_table()});
}

struct hugectr_fixture {
  std::string dir, plain;         // a save, and the same files without the manifest
  std::string file_bytes[4];      // the save's files of hugectr_file_names
  std::string other_bytes[2];     // and of other_files
  nlohmann::json manifest;        // the save's manifest
  std::size_t row_bytes[4] = {};  // bytes per row of each file
  std::vector<std::int64_t> keys;
  std::vector<std::uint64_t> slot_ids;  // of keys
  std::unique_ptr<embcache::training_cache<std::int64_t>> cache;

  hugectr_fixture() {
    const std::string root = embcache::fuzz::fresh_dir("hugectr_files");
    const std::string base = root + "base";
    keys = {-7, 0, 3, 12, 1000};
    slot_ids = {4, 0, 4, 25, 1};
    {
      auto tc = adam_cache();
      tc->begin_pass({keys}).throw_if_error();
      std::vector<float> rows(keys.size() * tc->row_width(0));
      for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = 0.25f + float(i) * 0.5f;
      tc->assign(0, keys.data(), keys.size(), rows.data()).throw_if_error();
      tc->set_slot_ids(0, keys.data(), slot_ids.data(), keys.size()).throw_if_error();
      tc->save(base).throw_if_error();
    }
    for (int i = 0; i < 4; ++i)
      file_bytes[i] = embcache::fuzz::read_bytes(base + "/emb/" + hugectr_file_names[i]);
    for (int i = 0; i < 2; ++i)
      other_bytes[i] = embcache::fuzz::read_bytes(base + "/emb/" + other_files[i]);
    manifest = nlohmann::json::parse(embcache::fuzz::read_bytes(base + "/manifest.json"));
    const std::size_t dim = manifest["tables"][0]["dim"].get<std::size_t>();
    row_bytes[0] = 8;
    row_bytes[1] = row_bytes[2] = dim * 4;
    row_bytes[3] = 8;
    cache = adam_cache();
    cache->load(base).throw_if_error();
    dir = root + "save";
    plain = root + "plain";
    for (const std::string& d : {dir, plain}) {
      fs::create_directories(d + "/emb");
      for (int i = 0; i < 2; ++i) {
        embcache::fuzz::overwrite_file(d + "/emb/" + other_files[i], other_bytes[i].data(),
                                       other_bytes[i].size());
      }
    }
  }
};

hugectr_fixture& the_hugectr_fixture() {
  static hugectr_fixture f;
  return f;
}

}  // namespace

EMBCACHE_FUZZ_TARGET(hugectr_files) {
  hugectr_fixture& f = the_hugectr_fixture();
  const embcache::fuzz::file_input in(data, size);
  const int which = in.mode & 3;
  const bool removed = in.mode & 4, hugectr = in.mode & 8;
  const embcache::load_options options = in.options(hugectr);

  const std::string& folder = hugectr ? f.plain : f.dir;
  for (int i = 0; i < 4; ++i) {
    const std::string path = folder + "/emb/" + hugectr_file_names[i];
    if (i != which)
      embcache::fuzz::overwrite_file(path, f.file_bytes[i].data(), f.file_bytes[i].size());
    else if (!removed)
      embcache::fuzz::overwrite_file(path, in.content, in.size);
    else
      fs::remove(path);
  }
  nlohmann::json m = f.manifest;
  auto& entry = m["tables"][0];
  auto& files = entry["files"];
  if (removed) {
    files.erase(hugectr_file_names[which]);
  } else if (in.mode & 16) {
    files[hugectr_file_names[which]] = {
        {"bytes", in.size}, {"xxh64", embcache::fuzz::hex64(XXH64(in.content, in.size, 0))}};
  }
  if (in.mode & 32) entry["count"] = in.size / f.row_bytes[which];
  if (!hugectr) {
    const std::string text = m.dump();
    embcache::fuzz::overwrite_file(f.dir + "/manifest.json", text.data(), text.size());
  }

  const auto before = embcache::fuzz::save_fixture_rows(*f.cache);
  const embcache::status s = f.cache->load(folder, options);
  const auto after = embcache::fuzz::save_fixture_rows(*f.cache);
  const std::size_t keys_in_file = (which == 3 ? in.size : f.file_bytes[3].size()) / 8;
  if (!embcache::fuzz::check_load_outcome(s, options, before, after, keys_in_file,
                                          status_code::not_found)) {
    return;
  }
  // Without its key file nothing loads; without one of Adam's files a save does not either.
  EMBCACHE_FUZZ_CHECK(!(removed && which == 3));
  if (!hugectr) EMBCACHE_FUZZ_CHECK(!(removed && (which == 1 || which == 2)));
  const bool have_slot_ids = !(removed && which == 0);
  for (const auto& [k, r] : after) {
    const auto id = f.cache->slot_id(0, k);
    EMBCACHE_FUZZ_CHECK(id.ok() == have_slot_ids);
  }
  if (have_slot_ids && which != 0 && which != 3) {
    for (std::size_t i = 0; i < f.keys.size(); ++i) {
      EMBCACHE_FUZZ_CHECK(f.cache->slot_id(0, f.keys[i]).value() == f.slot_ids[i]);
    }
  }
}
