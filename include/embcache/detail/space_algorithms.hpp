/// @file detail/space_algorithms.hpp
/// @brief The bulk primitives of the space a translation unit compiles for: the cuda space's
/// (cuda/algorithms.cuh, and the warp-per-key overloads of the cache's loops in
/// cuda/embedding_cache_ref.cuh) under nvcc, the host space's (detail/host_algorithms.hpp)
/// otherwise.
///
/// The definitions shared by the spaces (detail/*.inl, the trainer's cache path) call the
/// primitives by qualified name (`detail::for_each_index`), which binds to the overloads declared
/// before the definition. Each of them includes this header before its definitions, so a unit
/// that instantiates them includes just the definitions it instantiates, in any order, and gets
/// its space's overloads. A CUDA translation unit instantiates the cuda space only, a host one the
/// host space only (a host translation unit never sees a kernel, nor nvcc Thrust's TBB system).
#pragma once

#ifdef __CUDACC__
#include "embcache/cuda/algorithms.cuh"
#include "embcache/cuda/embedding_cache_ref.cuh"
#else
#include "embcache/detail/host_algorithms.hpp"
#endif
