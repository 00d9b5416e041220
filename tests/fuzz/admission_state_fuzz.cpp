// training_cache::load of a small valid save with admission on, its table's `admission` file
// replaced by the input after its first byte. The first byte chooses:
//   bit 0  the manifest gets the new file's xxh64 and size (so the content reaches the checks of
//          admission_sketch::from_words; otherwise the manifest's checks refuse it first)
// A load that succeeds counts on from exactly the input's words (saved again, the file is the
// input); one that fails names the admission file or the manifest, and changes nothing.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fuzz_target.hpp"
#include "save_fixture.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace {

namespace fs = std::filesystem;
using embcache::fuzz::read_bytes;

embcache::table_options<std::int64_t> admission_table() {
  auto o = embcache::fuzz::save_fixture_table();
  o.admission.min_count = 2;
  o.admission.sketch_width = 16;
  o.admission.sketch_depth = 2;
  o.admission.seed = 3;
  return o;
}

std::unique_ptr<embcache::training_cache<std::int64_t>> admission_cache() {
  return std::make_unique<embcache::training_cache<std::int64_t>>(
      embcache::training_cache_options{}, std::vector{admission_table()});
}

struct admission_fixture {
  std::string dir, again;
  nlohmann::json manifest;
  std::string base_manifest;
  std::unique_ptr<embcache::training_cache<std::int64_t>> cache;

  admission_fixture() {
    const std::string root = embcache::fuzz::fresh_dir("admission_state");
    dir = root + "save";
    again = root + "again";
    auto tc = admission_cache();
    tc->begin_pass({{1, 2, 3}}).throw_if_error();
    tc->begin_pass({{1, 2, 4}}).throw_if_error();
    tc->save(dir).throw_if_error();
    base_manifest = read_bytes(dir + "/manifest.json");
    manifest = nlohmann::json::parse(base_manifest);
    cache = admission_cache();
    cache->load(dir).throw_if_error();
  }
};

admission_fixture& the_admission_fixture() {
  static admission_fixture f;
  return f;
}

}  // namespace

EMBCACHE_FUZZ_TARGET(admission_state) {
  admission_fixture& f = the_admission_fixture();
  const auto in = embcache::fuzz::split_mode(data, size);
  const std::string file = f.dir + "/emb/admission";
  embcache::fuzz::overwrite_file(file, in.content, in.size);
  nlohmann::json m = f.manifest;
  if (in.mode & 1) {
    auto& e = m["tables"][0]["files"]["admission"];
    e["bytes"] = in.size;
    e["xxh64"] = embcache::fuzz::hex64(XXH64(in.content, in.size, 0));
  }
  const std::string text = m.dump(2);
  embcache::fuzz::overwrite_file(f.dir + "/manifest.json", text.data(), text.size());
  const auto before = embcache::fuzz::save_fixture_rows(*f.cache);
  const embcache::status s = f.cache->load(f.dir);
  if (s.ok()) {
    EMBCACHE_FUZZ_CHECK(f.cache->save(f.again).ok());
    EMBCACHE_FUZZ_CHECK(read_bytes(f.again + "/emb/admission") == std::string(in.content, in.size));
  } else {
    EMBCACHE_FUZZ_CHECK(s.code() == embcache::status_code::corruption);
    EMBCACHE_FUZZ_CHECK(s.message().find("admission") != std::string::npos);
    EMBCACHE_FUZZ_CHECK(embcache::fuzz::save_fixture_rows(*f.cache) == before);
  }
}
