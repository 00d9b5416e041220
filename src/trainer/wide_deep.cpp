// Wide&Deep glue in the host space: loss, blob framing and the instantiation.
#include "embcache/trainer/wide_deep.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstring>

#include "embcache/detail/host_algorithms.hpp"
#include "embcache/trainer/detail/wide_deep.inl"
#include "embcache/trainer/metrics.hpp"

namespace embcache {
namespace {
constexpr char wide_deep_magic[8] = {'E', 'M', 'B', 'W', 'D', 'L', '0', '1'};
}  // namespace

dense_network_options mlp_options(const wide_deep_options& o) {
  dense_network_options m;
  m.input_dim = o.num_deep_slots * o.deep_dim + o.num_dense;
  m.hidden = o.hidden;
  m.dropout = o.dropout;
  m.seed = o.seed;
  m.adam = o.adam;
  return m;
}

namespace detail {

double bce_loss_and_gradient(const float* logits, const float* labels, std::size_t n,
                             std::size_t mean_over, float* d_logits) {
  if (n == 0) return 0.0;
  double sum = 0;
  const double inv = 1.0 / double(mean_over);
  for (std::size_t i = 0; i < n; ++i) {
    sum += bce_with_logits(logits[i], labels[i]);
    d_logits[i] = float((sigmoid(logits[i]) - double(labels[i])) * inv);
  }
  return sum * inv;
}

// Blob: magic, bias, bias Adam m, bias Adam v, MLP blob size, MLP blob, xxHash64 of the rest.
std::vector<std::uint8_t> wide_deep_blob(const float bias_state[3],
                                         const std::vector<std::uint8_t>& mlp_blob) {
  std::vector<std::uint8_t> out(8 + 12 + 8);
  std::memcpy(out.data(), wide_deep_magic, 8);
  std::memcpy(out.data() + 8, bias_state, 12);
  const std::uint64_t size = mlp_blob.size();
  std::memcpy(out.data() + 20, &size, 8);
  out.resize(28 + mlp_blob.size());
  if (!mlp_blob.empty()) std::memcpy(out.data() + 28, mlp_blob.data(), mlp_blob.size());
  const std::uint64_t h = XXH64(out.data(), out.size(), 0);
  out.resize(out.size() + 8);
  std::memcpy(out.data() + out.size() - 8, &h, 8);
  return out;
}

status parse_wide_deep_blob(const std::uint8_t* data, std::size_t size, float bias_state[3],
                            const std::uint8_t*& mlp_blob, std::size_t& mlp_size) {
  if (size < 36 || std::memcmp(data, wide_deep_magic, 8) != 0)
    return status::corruption("wide&deep blob: missing magic EMBWDL01 (" + std::to_string(size) +
                              " bytes)");
  std::uint64_t stored = 0;
  std::memcpy(&stored, data + size - 8, 8);
  if (XXH64(data, size - 8, 0) != stored)
    return status::corruption("wide&deep blob: checksum mismatch over " + std::to_string(size) +
                              " bytes (truncated or corrupted)");
  std::uint64_t n = 0;
  std::memcpy(bias_state, data + 8, 12);
  std::memcpy(&n, data + 20, 8);
  if (n != size - 36)
    return status::corruption("wide&deep blob: dense network of " + std::to_string(n) + " bytes, " +
                              std::to_string(size - 36) + " present");
  mlp_blob = data + 28;
  mlp_size = static_cast<std::size_t>(n);
  return status::ok_status();
}

}  // namespace detail

template class wide_deep_model<host_space>;

}  // namespace embcache
