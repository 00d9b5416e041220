// training_cache::load of a small valid save whose manifest.json is replaced by the input: any
// bytes are refused with a status or, when they describe the save's files (checksums included),
// load exactly its rows; a refusal changes nothing.
#include "fuzz_target.hpp"
#include "save_fixture.hpp"

namespace {

using embcache::status_code;

struct manifest_fixture {
  std::string dir;  // the save; its manifest.json is replaced by each input
  std::unique_ptr<embcache::training_cache<std::int64_t>> cache;
  std::map<std::int64_t, std::string> rows;  // the save's rows, held by the cache throughout

  manifest_fixture() : dir(embcache::fuzz::fresh_dir("save_manifest") + "save") {
    embcache::fuzz::write_save_fixture(dir).throw_if_error();
    cache = embcache::fuzz::save_fixture_cache();
    cache->load(dir).throw_if_error();
    rows = embcache::fuzz::save_fixture_rows(*cache);
  }
};

manifest_fixture& the_manifest_fixture() {
  static manifest_fixture f;
  return f;
}

}  // namespace

EMBCACHE_FUZZ_TARGET(save_manifest) {
  manifest_fixture& f = the_manifest_fixture();
  embcache::fuzz::overwrite_file(f.dir + "/manifest.json", data, size);
  const embcache::status s = f.cache->load(f.dir);
  if (!s.ok()) {
    const auto c = s.code();
    EMBCACHE_FUZZ_CHECK(c == status_code::corruption || c == status_code::invalid_argument ||
                        c == status_code::not_found || c == status_code::unsupported);
    EMBCACHE_FUZZ_CHECK(s.message().find("manifest.json") != std::string::npos ||
                        s.message().find("table 'emb'") != std::string::npos);
  }
  // The files are the save's: a load that succeeds read them (their checksums matched), one that
  // fails changed nothing. Either way the store holds the save's rows.
  EMBCACHE_FUZZ_CHECK(embcache::fuzz::save_fixture_rows(*f.cache) == f.rows);
}
