// The trainer's training-cache path in the cuda space (src/trainer/cache_path.hpp instantiated
// there: the tables in a training_cache<std::int64_t, cuda_space>, the sparse ops and the check
// of updated rows on the device), and register_cuda_embeddings, which lets
// config.embedding_device pick it.
#include "embcache/cuda/algorithms.cuh"
// The portable path needs the cuda primitives above.
#include "trainer/cache_path.hpp"

namespace embcache {
namespace {

result<std::unique_ptr<detail::embedding_path>> make_cuda_cache_path(
    const trainer_config& config, detail::embedding_stores stores) {
  const cuda_space space{};
  auto tables = detail::make_cache_tables(std::move(stores), space);
  if (!tables.ok()) return tables.get_status();
  return detail::make_cache_path_in(config, space, std::move(tables).value());
}

}  // namespace

void register_cuda_embeddings() { detail::set_cuda_cache_path_factory(&make_cuda_cache_path); }

}  // namespace embcache
