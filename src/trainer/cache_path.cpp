// The training-cache path on the host: cache_path.hpp instantiated in the host space.
#include "cache_path.hpp"

namespace embcache::detail {

std::unique_ptr<embedding_path> make_cache_path(const trainer_config& config, host_space space,
                                                embedding_tables tables) {
  return make_cache_path_in(config, space, std::move(tables));
}

}  // namespace embcache::detail
