/// @file trainer/detail/dense_kernels.hpp
/// @brief Element-wise steps of the dense network, written once for both spaces, and the BLAS
/// entry points each space implements.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "embcache/detail/config.hpp"
#include "embcache/detail/hash.hpp"
#include "embcache/space.hpp"

namespace embcache::detail {

/// The per-(seed, step, layer) base of the dropout hash.
inline std::uint64_t dropout_base(std::uint64_t seed, std::uint64_t step,
                                  std::size_t layer) noexcept {
  return splitmix64_finalize(
      splitmix64_finalize(splitmix64_finalize(seed ^ 0x64726f706f7574ull) ^ step) ^
      std::uint64_t(layer));
}

/// The keep threshold of a drop rate: an element is kept when its 24-bit hash is >= it.
inline std::uint32_t dropout_threshold(float rate) noexcept {
  return static_cast<std::uint32_t>(std::lround(double(rate) * double(1u << 24)));
}

/// Whether element `index` is kept under `base` and `threshold`.
EMBCACHE_HD inline bool dropout_keep_hashed(std::uint64_t base, std::uint64_t index,
                                            std::uint32_t threshold) noexcept {
  return std::uint32_t(splitmix64_finalize(base ^ (index * 0xd6e8feb86659fd93ull)) >> 40) >=
         threshold;
}

/// The Wide&Deep logit of sample b: logits[b] = float(mlp[b] + bias + the sample's `w` wide
/// slots), summed in double in slot order (in place when logits == mlp).
struct wide_logit {
  const float* mlp;
  const float* wide;  // B * w
  std::size_t w;
  float bias;
  float* logits;
  EMBCACHE_HD void operator()(std::size_t b) const {
    double sum = double(mlp[b]) + double(bias);
    for (std::size_t s = 0; s < w; ++s) sum += double(wide[b * w + s]);
    logits[b] = float(sum);
  }
};

/// d_wide[i] := d_logits[i / w]: every wide slot of a sample gets the sample's logit gradient.
struct spread_wide_gradient {
  const float* d_logits;
  std::size_t w;
  float* d_wide;  // B * w
  EMBCACHE_HD void operator()(std::size_t i) const { d_wide[i] = d_logits[i / w]; }
};

/// z := keep(i) && z > 0 ? z * scale : 0 (ReLU then inverted dropout); without dropout
/// (threshold 0) it is a plain ReLU times scale (1).
struct relu_dropout_forward {
  float* z;
  std::uint64_t base;
  std::uint32_t threshold;
  float scale;
  EMBCACHE_HD void operator()(std::size_t i) const {
    const float v = z[i];
    const bool keep = threshold == 0 || dropout_keep_hashed(base, i, threshold);
    z[i] = (keep && v > 0.0f) ? v * scale : 0.0f;
  }
};

/// dh := h > 0 ? dh * scale : 0. The forward output is positive exactly where ReLU passed and
/// dropout kept, so the mask needs no recomputation.
struct relu_dropout_backward {
  const float* h;
  float* dh;
  float scale;
  EMBCACHE_HD void operator()(std::size_t i) const { dh[i] = h[i] > 0.0f ? dh[i] * scale : 0.0f; }
};

/// One Adam step per element, computed in double and stored as float (as the sparse Adam does).
struct dense_adam_step {
  float* w;
  const float* g;
  float* m;
  float* v;
  double lr, beta1, beta2, epsilon;
  double correction1, correction2;  // 1 / (1 - beta^t)
  EMBCACHE_HD void operator()(std::size_t i) const {
    const double gi = g[i];
    const double mi = beta1 * double(m[i]) + (1.0 - beta1) * gi;
    const double vi = beta2 * double(v[i]) + (1.0 - beta2) * gi * gi;
    m[i] = float(mi);
    v[i] = float(vi);
    w[i] = float(double(w[i]) - lr * (mi * correction1) / (sqrt(vi * correction2) + epsilon));
  }
};

/// p[i] = value.
struct fill_value {
  float* p;
  float value;
  EMBCACHE_HD void operator()(std::size_t i) const { p[i] = value; }
};

// Each space implements these (host: src/trainer/dense_network.cpp, OpenBLAS; cuda:
// src/trainer/dense_network.cu, cuBLAS). Matrices are row-major; `blas` is the space's handle.
std::shared_ptr<void> blas_create(const host_space& space);
void gemm_row_major(const host_space& space, void* blas, bool trans_a, bool trans_b, std::size_t m,
                    std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                    const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc);
template <class F>
void for_each_dense(const host_space&, std::size_t n, const F& f) {
  for (std::size_t i = 0; i < n; ++i) f(i);
}

std::shared_ptr<void> blas_create(const cuda_space& space);
void gemm_row_major(const cuda_space& space, void* blas, bool trans_a, bool trans_b, std::size_t m,
                    std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                    const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc);
void for_each_dense(const cuda_space& space, std::size_t n, const relu_dropout_forward& f);
void for_each_dense(const cuda_space& space, std::size_t n, const relu_dropout_backward& f);
void for_each_dense(const cuda_space& space, std::size_t n, const dense_adam_step& f);
void for_each_dense(const cuda_space& space, std::size_t n, const fill_value& f);

}  // namespace embcache::detail
