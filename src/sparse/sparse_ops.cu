// cuda-space instantiations of the sparse ops and optimizers.
// The portable definitions bring the cuda primitives themselves (detail/space_algorithms.hpp).
#include "embcache/detail/optimizers.inl"
#include "embcache/detail/sparse_ops.inl"

namespace embcache {

template void lookup_combine<cuda_space>(const cuda_space&, const float*, std::size_t, std::size_t,
                                         const slot_batch&, combiner, float*, const float*);
template void aggregate_gradients<cuda_space>(const cuda_space&, const slot_batch&, combiner,
                                              const float*, std::size_t,
                                              sparse_gradients<cuda_space>&);
template void apply_optimizer<cuda_space>(const cuda_space&, const optimizer_options&, float*,
                                          std::size_t, std::size_t, const std::int64_t*,
                                          const float*, std::size_t, std::uint64_t, std::int8_t*);

}  // namespace embcache
