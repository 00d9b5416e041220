target_sources(embcache_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/sparse_ops.cu)
