/// @file detail/config.hpp
/// @brief Portability macros shared by host and device code.
#pragma once

#if defined(__CUDACC__)
/// Marks a function that runs both on the host and on the device.
#define EMBCACHE_HD __host__ __device__
#define EMBCACHE_DEVICE __device__
#else
#define EMBCACHE_HD
#define EMBCACHE_DEVICE
#endif

#if defined(__CUDA_ARCH__)
#define EMBCACHE_ON_DEVICE 1
#else
#define EMBCACHE_ON_DEVICE 0
#endif
