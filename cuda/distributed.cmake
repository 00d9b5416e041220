# The NCCL communicator (embcache::nccl): device collectives bootstrapped over MPI. Host-compiled
# (NCCL and CUDA runtime calls only); built when MPI and NCCL are found (EMBCACHE_HAVE_NCCL).
if(EMBCACHE_HAVE_NCCL)
  add_library(embcache_nccl ${EMBCACHE_LIBRARY_TYPE} ${CMAKE_CURRENT_LIST_DIR}/nccl_communicator.cpp)
  add_library(embcache::nccl ALIAS embcache_nccl)
  set_target_properties(embcache_nccl PROPERTIES EXPORT_NAME nccl POSITION_INDEPENDENT_CODE ON)
  target_link_libraries(embcache_nccl PUBLIC embcache_mpi CUDA::cudart
                                      PRIVATE ${EMBCACHE_NCCL_LIBRARY})
  target_include_directories(embcache_nccl SYSTEM PRIVATE ${EMBCACHE_NCCL_INCLUDE_DIR})
  embcache_warnings(embcache_nccl)
  install(TARGETS embcache_nccl EXPORT embcache_nccl_targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
