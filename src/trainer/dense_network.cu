// The dense network and the Wide&Deep glue in the cuda space: GEMMs through cuBLAS on the space's
// stream, the element-wise steps as kernels over the portable functors.
#include <cublas_v2.h>

#include <limits>
#include <string>

#include "embcache/cuda/algorithms.cuh"
#include "embcache/trainer/detail/dense_network.inl"
#include "embcache/trainer/detail/wide_deep.inl"

namespace embcache {
namespace detail {
namespace {

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw error(status_code::internal,
                std::string("cuBLAS ") + what + " failed with status " + std::to_string(int(s)));
}

struct cublas_deleter {
  void operator()(void* h) const noexcept { cublasDestroy(static_cast<cublasHandle_t>(h)); }
};

}  // namespace

std::shared_ptr<void> blas_create(const cuda_space& space) {
  cublasHandle_t h = nullptr;
  cublas_check(cublasCreate(&h), "cublasCreate");
  std::shared_ptr<void> owned(h, cublas_deleter{});
  cublas_check(cublasSetStream(h, space.stream), "cublasSetStream");
  // Pedantic math: no TF32 tensor-core rounding, so results stay comparable with the host space.
  cublas_check(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
  return owned;
}

// cuBLAS is column-major; a row-major matrix is its transpose in column-major, so the row-major
// C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T.
void gemm_row_major(const cuda_space& space, void* blas, bool trans_a, bool trans_b, std::size_t m,
                    std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                    const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  // cuBLAS takes int dimensions; a batch or layer beyond that would wrap silently.
  for (std::size_t d : {m, n, k, lda, ldb, ldc})
    if (d > std::size_t(std::numeric_limits<int>::max()))
      throw error(status_code::invalid_argument,
                  "cublasSgemm: dimension " + std::to_string(d) + " exceeds the int range");
  auto h = static_cast<cublasHandle_t>(blas);
  cublas_check(cublasSetStream(h, space.stream), "cublasSetStream");
  cublas_check(
      cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                  int(n), int(m), int(k), &alpha, b, int(ldb), a, int(lda), &beta, c, int(ldc)),
      "cublasSgemm");
}

void for_each_dense(const cuda_space& space, std::size_t n, const relu_dropout_forward& f) {
  for_each_index(space, n, f);
}
void for_each_dense(const cuda_space& space, std::size_t n, const relu_dropout_backward& f) {
  for_each_index(space, n, f);
}
void for_each_dense(const cuda_space& space, std::size_t n, const dense_adam_step& f) {
  for_each_index(space, n, f);
}
void for_each_dense(const cuda_space& space, std::size_t n, const fill_value& f) {
  for_each_index(space, n, f);
}

}  // namespace detail

template class dense_network<cuda_space>;
template class wide_deep_model<cuda_space>;

}  // namespace embcache
