// trainer_config_from_text on the bytes: a configuration is either refused with a message that
// names where, or holds only values within the documented ranges and reads back unchanged.
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "embcache/trainer/trainer.hpp"
#include "fuzz_target.hpp"

EMBCACHE_FUZZ_TARGET(trainer_config) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = embcache::trainer_config_from_text(text);
  if (!r.ok()) {
    EMBCACHE_FUZZ_CHECK(r.get_status().code() == embcache::status_code::invalid_argument);
    EMBCACHE_FUZZ_CHECK(r.get_status().message().rfind("config text: ", 0) == 0);
    return;
  }
  const embcache::trainer_config& c = r.value();
  EMBCACHE_FUZZ_CHECK(embcache::validate(c).ok());
  EMBCACHE_FUZZ_CHECK(!c.passes.empty());
  // Each pass names either shards or a dataset folder.
  for (const auto& p : c.passes) EMBCACHE_FUZZ_CHECK(p.shards.empty() != p.dataset.empty());
  EMBCACHE_FUZZ_CHECK(c.tables.size() == 2);
  EMBCACHE_FUZZ_CHECK(c.tables[0].name != c.tables[1].name);
  for (const auto& t : c.tables) {
    EMBCACHE_FUZZ_CHECK(t.name == "wide" || t.name == "deep");
    EMBCACHE_FUZZ_CHECK(t.dim >= 1 && t.dim <= 4096);
    EMBCACHE_FUZZ_CHECK(t.name != "wide" || t.dim == 1);
    EMBCACHE_FUZZ_CHECK(t.capacity >= 1 && t.capacity <= (std::size_t{1} << 40));
    // With capacity "auto" the capacity is known once the datasets are read.
    EMBCACHE_FUZZ_CHECK(t.slots == 0 || (t.slots <= (std::size_t{1} << 40) &&
                                         (t.capacity_auto || t.slots >= t.capacity)));
    EMBCACHE_FUZZ_CHECK(t.max_resident == 0 || t.capacity_auto || t.max_resident >= t.capacity);
    EMBCACHE_FUZZ_CHECK(std::isfinite(t.init_scale) && t.init_scale >= 0);
    EMBCACHE_FUZZ_CHECK(std::isfinite(t.optimizer.learning_rate) && t.optimizer.learning_rate > 0);
    EMBCACHE_FUZZ_CHECK(t.store != "rocksdb" || !t.store_path.empty());
  }
  EMBCACHE_FUZZ_CHECK(c.batch_size >= 1 && c.batch_size <= (std::size_t{1} << 20));
  EMBCACHE_FUZZ_CHECK(c.model.hidden.size() <= 32);
  for (std::size_t w : c.model.hidden) EMBCACHE_FUZZ_CHECK(w >= 1 && w <= 65536);
  EMBCACHE_FUZZ_CHECK(c.model.dropout >= 0 && c.model.dropout < 1);
  EMBCACHE_FUZZ_CHECK(std::isfinite(c.model.adam.learning_rate) && c.model.adam.learning_rate > 0);
  EMBCACHE_FUZZ_CHECK(c.threads >= 0 && c.threads <= 4096);
  EMBCACHE_FUZZ_CHECK(c.blas_threads >= 0 && c.blas_threads <= 4096);
  // The memory estimate is total over valid configurations: a status, never a wrapped product.
  const embcache::status m = embcache::check_memory(c, std::numeric_limits<std::uint64_t>::max());
  EMBCACHE_FUZZ_CHECK(m.ok());
  // The configuration's JSON reads back to the same configuration.
  const nlohmann::json j = c;
  auto again = embcache::trainer_config_from_json(j);
  EMBCACHE_FUZZ_CHECK(again.ok());
  EMBCACHE_FUZZ_CHECK(nlohmann::json(again.value()) == j);
}
