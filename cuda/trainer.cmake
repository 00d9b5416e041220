# The reference trainer's dense layers in the cuda space (cuBLAS), and the dense_backend that puts
# them behind the trainer's host-memory interface. They share the network's layout,
# initialization and serialized form with the host space, hence embcache_trainer. Then the
# trainer's embedding path with its training cache in the cuda space (config.embedding_device).
target_sources(embcache_cuda PRIVATE ${CMAKE_CURRENT_LIST_DIR}/dense_network.cu
                                     ${CMAKE_CURRENT_LIST_DIR}/trainer_dense_backend.cu
                                     ${CMAKE_CURRENT_LIST_DIR}/trainer_cache_path.cu)
target_link_libraries(embcache_cuda PUBLIC embcache_trainer CUDA::cublas)
