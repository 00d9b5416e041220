// read_dataset_manifest on a folder whose manifest.json holds the bytes.
#include <filesystem>
#include <fstream>
#include <string>

#include "embcache/shard.hpp"
#include "fuzz_target.hpp"

EMBCACHE_FUZZ_TARGET(dataset_manifest) {
  const std::string dir = embcache::fuzz::fresh_dir("dataset");
  {
    std::ofstream f(dir + "manifest.json", std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  auto r = embcache::read_dataset_manifest(dir);
  if (!r.ok()) {
    EMBCACHE_FUZZ_CHECK(r.get_status().code() == embcache::status_code::corruption ||
                        r.get_status().code() == embcache::status_code::unsupported);
    EMBCACHE_FUZZ_CHECK(r.get_status().message().find("manifest.json") != std::string::npos);
    return;
  }
  const embcache::dataset_summary& s = r.value();
  EMBCACHE_FUZZ_CHECK(s.num_crossed <= 0xffff);
  // The schema (Criteo's when absent) is valid, and the per-slot counts are one per slot.
  EMBCACHE_FUZZ_CHECK(embcache::validate(s.schema).ok());
  EMBCACHE_FUZZ_CHECK(s.unique_keys.size() ==
                      (s.has_unique_stats ? s.schema.num_categorical() : 0));
  EMBCACHE_FUZZ_CHECK(s.label_mean >= 0.0 && s.label_mean <= 1.0);
  std::uint64_t total = 0;
  const std::filesystem::path folder = std::filesystem::path(dir).parent_path();  // no '/'

  for (const auto& f : s.shards) {
    total += f.rows;
    for (const std::string* p : {&f.shard, &f.keyset}) {
      EMBCACHE_FUZZ_CHECK(std::filesystem::path(*p).parent_path() == folder);
    }
    EMBCACHE_FUZZ_CHECK(f.crossed_keyset.empty() == (s.num_crossed == 0));
    // No shard file is there, so none can hold rows: only the sum is checked.
    EMBCACHE_FUZZ_CHECK(f.rows <= s.rows);
    // Keyset sizes, when recorded, fit the rows (the schema's slot keys, crossed_per_row
    // crossed keys).
    if (f.has_key_counts) {
      EMBCACHE_FUZZ_CHECK(f.keys / s.schema.num_categorical() <= f.rows);
      EMBCACHE_FUZZ_CHECK(s.num_crossed > 0 || f.crossed_keys == 0);
    } else {
      EMBCACHE_FUZZ_CHECK(f.keys == 0 && f.crossed_keys == 0);
    }
  }
  EMBCACHE_FUZZ_CHECK(total == s.rows);
}
