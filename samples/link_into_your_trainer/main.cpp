// Your own training loop with embcache's training cache in front of a host store: a logistic
// model over hashed feature keys, one dim-4 table with lazy Adam, trained pass by pass. Each
// pass: the keyset (the pass's unique keys) is made resident, the next pass's is prefetched,
// the loop looks rows up by slot, updates them in place and marks them updated; after each pass
// the rows changed are exported, and the model is saved at the end. The staged rows move into the
// cache by index at each pass's start (training_cache_options::move_staged_rows, the host space's
// default), so the loop finds the row a slot holds through slot_rows (embcache/slot_rows.hpp) in
// the cache's row_pool(), not at slot * row_width.
//
// Usage: my_trainer [OUT_DIR]   (default ./my_trainer_out; it is replaced)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <embcache/embcache.hpp>
#include <embcache/slot_rows.hpp>
#include <embcache/training_cache.hpp>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

using namespace embcache;

int main(int argc, char** argv) {
  const std::string usage = "usage: my_trainer [OUT_DIR]  (default ./my_trainer_out; replaced)\n";
  std::string out = "my_trainer_out";
  if (argc > 2 || (argc == 2 && argv[1][0] == '-' && std::string(argv[1]) != "--help")) {
    std::fputs(usage.c_str(), stderr);
    return 2;
  }
  if (argc == 2 && std::string(argv[1]) == "--help") {
    std::fputs(usage.c_str(), stdout);
    return 0;
  }
  if (argc == 2) out = argv[1];
  constexpr std::size_t dim = 4, keys_per_sample = 8, samples = 2000, passes = 3;
  table_options<std::int64_t> t;
  t.name = "features";
  t.dim = dim;
  t.optimizer.kind = optimizer_kind::adam;
  t.optimizer.learning_rate = 0.01f;
  t.capacity = 1024;  // one pass's keys; the table grows beyond it in the store
  training_cache<std::int64_t> cache(training_cache_options{}, {t});
  slot_rows<std::int64_t> rows_of;  // the row each slot holds

  // Pass p uses keys from its own range (plus a shared head): the table outgrows the cache.
  std::mt19937_64 rng(42);
  auto make_pass = [&](std::size_t p) {
    std::vector<std::int64_t> keys(samples * keys_per_sample);
    for (auto& k : keys)
      k = (rng() % 4 == 0) ? std::int64_t(rng() % 64) : std::int64_t(1000 * (p + 1) + rng() % 900);
    return keys;
  };
  std::vector<std::vector<std::int64_t>> data;
  for (std::size_t p = 0; p < passes; ++p) data.push_back(make_pass(p));
  auto keyset = [](std::vector<std::int64_t> k) {
    std::sort(k.begin(), k.end());
    k.erase(std::unique(k.begin(), k.end()), k.end());
    return std::vector<std::vector<std::int64_t>>{k};
  };
  std::filesystem::remove_all(out);

  std::vector<std::int64_t> slots(keys_per_sample);
  std::uint64_t step = 0, exported = 0;
  for (std::size_t p = 0; p < passes; ++p) {
    if (status s = cache.begin_pass(keyset(data[p])); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.to_string().c_str());
      return 1;
    }
    if (p + 1 < passes) cache.prefetch(keyset(data[p + 1])).throw_if_error();
    auto& c = cache.cache(0);
    double loss = 0;
    for (std::size_t i = 0; i < samples; ++i) {
      const std::int64_t* keys = data[p].data() + i * keys_per_sample;
      c.lookup_slots(keys, keys_per_sample, slots.data()).throw_if_error();
      // The label: whether the sample's first key is even; the logit sums every embedding.
      const float y = keys[0] % 2 == 0 ? 1.0f : 0.0f;
      double z = 0;
      const std::int64_t* rows = rows_of.of(c, slots.data(), slots.size(), host_space{});
      for (std::size_t i = 0; i < slots.size(); ++i)
        for (std::size_t d = 0; d < dim; ++d) z += c.row_pool()[rows[i] * c.row_width() + d];
      const double prob = 1.0 / (1.0 + std::exp(-z));
      loss += -(y * std::log(prob + 1e-9) + (1 - y) * std::log(1 - prob + 1e-9));
      const float g = float(prob - y);
      std::vector<std::int64_t> unique(slots);
      std::sort(unique.begin(), unique.end());
      unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
      std::vector<float> grads(unique.size() * dim);
      for (std::size_t u = 0; u < unique.size(); ++u) {
        const auto n = std::count(slots.begin(), slots.end(), unique[u]);
        for (std::size_t d = 0; d < dim; ++d) grads[u * dim + d] = g * float(n);
      }
      apply_optimizer(host_space{}, t.optimizer, c.row_pool(), c.row_width(), dim,
                      rows_of.of(c, unique.data(), unique.size(), host_space{}), grads.data(),
                      unique.size(), ++step);
      c.mark_updated(unique.data(), unique.size());  // marks go by slot
    }
    auto delta = cache.export_incremental_to(out + "/exports");
    if (!delta.ok()) {
      std::fprintf(stderr, "%s\n", delta.get_status().to_string().c_str());
      return 1;
    }
    const auto d = cache.export_incremental();  // nothing changed since: empty
    exported += d.value()[0].keys.size();
    std::printf("pass %zu: mean loss %.4f, resident %zu rows, store %zu rows, export %s\n", p,
                loss / samples, c.size(), cache.store(0).size(), delta.value().c_str());
  }
  if (status s = cache.save(out + "/model"); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  std::printf("link ok: %zu rows saved to %s/model, %llu rows in the empty re-export\n",
              cache.store(0).size(), out.c_str(), (unsigned long long)exported);
  return 0;
}
