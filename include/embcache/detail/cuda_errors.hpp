/// @file detail/cuda_errors.hpp
/// @brief How a failed CUDA call maps to a status code. Portable (no CUDA headers), so the
/// mapping is pinned by host tests; cuda/algorithms.cuh checks the constants against the runtime.
#pragma once

#include "embcache/status.hpp"

namespace embcache::detail {

/// The value of cudaErrorMemoryAllocation (cuda_runtime_api.h; stable since CUDA 1.0).
inline constexpr int cuda_error_memory_allocation = 2;

/// The status code of a failed CUDA runtime call `error` (a cudaError_t): out_of_device_memory
/// for cudaErrorMemoryAllocation, internal for anything else.
constexpr status_code status_code_of_cuda_error(int error) noexcept {
  return error == cuda_error_memory_allocation ? status_code::out_of_device_memory
                                               : status_code::internal;
}

/// The status code of a failed pinned host allocation (cudaMallocHost) `error`:
/// out_of_host_memory for cudaErrorMemoryAllocation (the host's memory, not the device's, ran
/// out), internal for anything else.
constexpr status_code status_code_of_pinned_cuda_error(int error) noexcept {
  return error == cuda_error_memory_allocation ? status_code::out_of_host_memory
                                               : status_code::internal;
}

}  // namespace embcache::detail
