target_sources(embcache_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/embedding_cache.cu)
