# The reference trainer's dense layers in the cuda space (cuBLAS). They share the network's
# layout, initialization and serialized form with the host space, hence embcache_trainer.
target_sources(embcache_cuda PRIVATE ${CMAKE_CURRENT_LIST_DIR}/dense_network.cu)
target_link_libraries(embcache_cuda PUBLIC embcache_trainer CUDA::cublas)
