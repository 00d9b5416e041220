// The dense network in the host space (OpenBLAS through CBLAS), its options check and its
// serialized form.
#include "embcache/trainer/dense_network.hpp"

#include <cblas.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/durable_file.hpp"
#include "embcache/trainer/dense_backend.hpp"
#include "embcache/trainer/detail/dense_network.inl"

namespace embcache {
namespace {

constexpr char dense_blob_magic[8] = {'E', 'M', 'B', 'D', 'N', 'N', '0', '1'};
constexpr std::uint32_t blob_version = 1;

template <class T>
void put(std::vector<std::uint8_t>& out, const T& v) {
  const std::size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void put_floats(std::vector<std::uint8_t>& out, const std::vector<float>& v) {
  const std::size_t at = out.size();
  out.resize(at + v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(out.data() + at, v.data(), v.size() * sizeof(float));
}

// Bounds-checked reader over a blob whose checksum was already verified.
struct blob_reader {
  const std::uint8_t* p;
  std::size_t left;
  template <class T>
  bool get(T& v) {
    if (left < sizeof(T)) return false;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    left -= sizeof(T);
    return true;
  }
  bool get_floats(std::vector<float>& v, std::size_t n) {
    if (left / sizeof(float) < n) return false;
    v.resize(n);
    std::memcpy(v.data(), p, n * sizeof(float));
    p += n * sizeof(float);
    left -= n * sizeof(float);
    return true;
  }
};

std::string shape_string(std::uint64_t input, const std::vector<std::uint64_t>& hidden) {
  std::ostringstream s;
  s << input;
  for (std::uint64_t h : hidden) s << "-" << h;
  s << "-1";
  return s.str();
}

}  // namespace

status check_options(const dense_network_options& o) {
  if (o.input_dim == 0)
    return status::invalid_argument("dense_network_options.input_dim is 0, expected > 0");
  for (std::size_t i = 0; i < o.hidden.size(); ++i)
    if (o.hidden[i] == 0)
      return status::invalid_argument("dense_network_options.hidden[" + std::to_string(i) +
                                      "] is 0, expected > 0");
  if (!(o.dropout >= 0.0f && o.dropout < 1.0f))
    return status::invalid_argument("dense_network_options.dropout is " +
                                    std::to_string(o.dropout) + ", expected in [0, 1)");
  if (!(o.adam.learning_rate > 0.0f))
    return status::invalid_argument("dense_network_options.adam.learning_rate is " +
                                    std::to_string(o.adam.learning_rate) + ", expected > 0");
  if (!(o.adam.beta1 >= 0.0f && o.adam.beta1 < 1.0f))
    return status::invalid_argument("dense_network_options.adam.beta1 is " +
                                    std::to_string(o.adam.beta1) + ", expected in [0, 1)");
  if (!(o.adam.beta2 >= 0.0f && o.adam.beta2 < 1.0f))
    return status::invalid_argument("dense_network_options.adam.beta2 is " +
                                    std::to_string(o.adam.beta2) + ", expected in [0, 1)");
  if (!(o.adam.epsilon > 0.0f))
    return status::invalid_argument("dense_network_options.adam.epsilon is " +
                                    std::to_string(o.adam.epsilon) + ", expected > 0");
  return status::ok_status();
}

int set_host_blas_threads(int threads) {
  if (threads > 0) openblas_set_num_threads(threads);
  return openblas_get_num_threads();
}

bool dropout_keep(std::uint64_t seed, std::uint64_t step, std::size_t layer, std::uint64_t index,
                  float rate) noexcept {
  const std::uint32_t threshold = detail::dropout_threshold(rate);
  return threshold == 0 ||
         detail::dropout_keep_hashed(detail::dropout_base(seed, step, layer), index, threshold);
}

namespace detail {

std::shared_ptr<void> blas_create(const host_space&) { return nullptr; }

void gemm_row_major(const host_space&, void*, bool trans_a, bool trans_b, std::size_t m,
                    std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                    const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// Blob: magic, version, hidden count, input_dim, hidden widths, Adam step, parameter count,
// parameters, Adam m, Adam v, then xxHash64 (seed 0) of everything before it. Little-endian.
std::vector<std::uint8_t> dense_blob(const dense_network_options& o, std::uint64_t step,
                                     const std::vector<float>& params, const std::vector<float>& m,
                                     const std::vector<float>& v) {
  std::vector<std::uint8_t> out;
  out.reserve(64 + 8 * o.hidden.size() + 12 * params.size());
  out.resize(8);
  std::memcpy(out.data(), dense_blob_magic, 8);
  put(out, blob_version);
  put(out, static_cast<std::uint32_t>(o.hidden.size()));
  put(out, static_cast<std::uint64_t>(o.input_dim));
  for (std::size_t h : o.hidden) put(out, static_cast<std::uint64_t>(h));
  put(out, step);
  put(out, static_cast<std::uint64_t>(params.size()));
  put_floats(out, params);
  put_floats(out, m);
  put_floats(out, v);
  put(out, static_cast<std::uint64_t>(XXH64(out.data(), out.size(), 0)));
  return out;
}

status parse_dense_blob(const dense_network_options& o, std::size_t num_parameters,
                        const std::uint8_t* data, std::size_t size, std::uint64_t& step,
                        std::vector<float>& params, std::vector<float>& m, std::vector<float>& v) {
  if (size < 8 + 8 || std::memcmp(data, dense_blob_magic, 8) != 0)
    return status::corruption("dense network blob: missing magic EMBDNN01 (" +
                              std::to_string(size) + " bytes)");
  std::uint64_t stored = 0;
  std::memcpy(&stored, data + size - 8, 8);
  if (XXH64(data, size - 8, 0) != stored)
    return status::corruption("dense network blob: checksum mismatch over " + std::to_string(size) +
                              " bytes (truncated or corrupted)");
  blob_reader r{data + 8, size - 16};
  std::uint32_t version = 0, hidden_count = 0;
  std::uint64_t input = 0, count = 0;
  if (!r.get(version) || !r.get(hidden_count) || !r.get(input))
    return status::corruption("dense network blob: header truncated");
  if (version != blob_version)
    return status::corruption("dense network blob: version " + std::to_string(version) +
                              ", expected " + std::to_string(blob_version));
  std::vector<std::uint64_t> hidden(hidden_count);
  for (auto& h : hidden)
    if (!r.get(h)) return status::corruption("dense network blob: layer widths truncated");
  std::vector<std::uint64_t> expected_hidden(o.hidden.begin(), o.hidden.end());
  if (input != o.input_dim || hidden != expected_hidden)
    return status::invalid_argument("dense network blob: shape " + shape_string(input, hidden) +
                                    ", expected " + shape_string(o.input_dim, expected_hidden));
  if (!r.get(step) || !r.get(count))
    return status::corruption("dense network blob: header truncated");
  if (count != num_parameters)
    return status::corruption("dense network blob: " + std::to_string(count) +
                              " parameters, expected " + std::to_string(num_parameters));
  if (!r.get_floats(params, count) || !r.get_floats(m, count) || !r.get_floats(v, count))
    return status::corruption("dense network blob: parameter arrays truncated");
  if (r.left != 0)
    return status::corruption("dense network blob: " + std::to_string(r.left) +
                              " unexpected trailing bytes");
  return status::ok_status();
}

status write_dense_file(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  return write_file_durably(path, bytes.data(), bytes.size());
}

status read_dense_file(const std::string& path, std::vector<std::uint8_t>& bytes) {
  auto read = read_file_bytes(path);
  if (!read.ok()) return read.get_status();
  bytes.assign(read.value().begin(), read.value().end());
  return status::ok_status();
}

}  // namespace detail

template class dense_network<host_space>;

}  // namespace embcache
