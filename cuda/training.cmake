# The training cache in the cuda space (host code over the device caches; compiled by the C++
# compiler).
target_sources(embcache_cuda PRIVATE ${CMAKE_CURRENT_LIST_DIR}/training_cache.cpp)
