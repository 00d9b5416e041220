// The trainer's training-cache path in the cuda space (cache_path.hpp instantiated there: the
// tables in a training_cache<std::int64_t, cuda_space>, the sparse ops and the check of updated
// rows on the device): make_cuda_cache_path, which embedding_path.cpp calls when
// config.embedding_device resolves to "cuda". Its caches are checked against the device's free
// memory. Compiled into embcache_trainer in a cuda build only.
#include "cache_path.hpp"

namespace embcache::detail {
namespace {

// check_memory with the caches against the device's free memory (the host's parts were checked
// by trainer::create): out_of_device_memory naming the field, before anything is allocated.
status check_device_memory(const trainer_config& config) {
  std::size_t free = 0, total = 0;
  try {
    EMBCACHE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  } catch (const error& e) {
    return status(e.code(), std::string("config.embedding_device: ") + e.what());
  }
  memory_budget budget;
  budget.caches_on_device = true;
  budget.device_bytes = free;
  return check_memory(config, budget);
}

}  // namespace

result<std::unique_ptr<embedding_path>> make_cuda_cache_path(const trainer_config& config,
                                                             embedding_stores stores) {
  EMBCACHE_RETURN_IF_ERROR(check_device_memory(config));
  const cuda_space space{};
  auto tables = make_cache_tables(std::move(stores), space);
  if (!tables.ok()) return tables.get_status();
  return make_cache_path_in(config, space, std::move(tables).value());
}

}  // namespace embcache::detail
