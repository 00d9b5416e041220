// bench_distributed: one sharded lookup + update step (forward, backward, sparse optimizer in the
// owners' host stores) per iteration, on however many ranks mpirun starts, with the same per-rank
// batch at every world size; beside it, in the same binary, the baseline: host_hybrid_table on
// rank 0's batch alone (the same step with no sharding and no exchange).
//
//   run_bench_distributed.sh [args]   # runs it on 1 and 2 ranks and prints the ratio
//   mpirun -np 2 bench_distributed [--batch=2048] [--slots=26] [--dim=16] [--blocks=2]
//                                  [--threads=1]
//
// Google Benchmark runs on rank 0 only: before each iteration rank 0 broadcasts "step" (or, at
// the end, "stop") and every rank then takes part in the step, so the other ranks serve the
// exchanges without running benchmarks of their own. items_per_second counts the samples of the
// global batch (world * batch). Counters, per step, at rank 0 (ranks are symmetric):
//   bytes_sent, bytes_received  bytes rank 0 exchanged with other ranks (keys, rows, gradients)
//   min_bytes                   unique keys of the rank's batch * dim * 4: the embeddings it reads
//   unique_keys, remote_keys    keys of rank 0's batch, and those another rank owns
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "embcache/detail/hash.hpp"
#include "embcache/distributed/mpi_communicator.hpp"
#include "embcache/distributed/sharded_table.hpp"
#include "embcache/host_hybrid.hpp"
#include "embcache/host_store.hpp"

namespace {

using embcache::status;

struct config {
  std::size_t batch = 2048;  // samples per rank per step
  std::size_t slots = 26;    // one-hot slots per sample (Criteo's categorical features)
  std::size_t dim = 16;
  std::size_t blocks = 2;    // blocks of the global batch: 1 and 2 ranks both divide it
  std::size_t batches = 16;  // distinct batches cycled through
  std::size_t threads = 1;   // threads per rank: one core each, as ranks on separate hosts have
};

config g_cfg;
constexpr std::int64_t cmd_stop = 0, cmd_step = 1;

void check(const status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench_distributed: %s\n", s.to_string().c_str());
    std::exit(1);
  }
}

// One rank's batches: slot j draws from a vocabulary of 2^20 ids with a power-law skew (the id is
// floor(2^20 * u^4) for a uniform u), so a few ids are hot, as in click logs.
struct batches {
  std::vector<std::vector<std::int64_t>> keys;
  std::vector<std::int64_t> offsets;

  batches(const config& c, int rank) : offsets(c.batch * c.slots + 1) {
    for (std::size_t i = 0; i < offsets.size(); ++i) offsets[i] = static_cast<std::int64_t>(i);
    keys.resize(c.batches);
    for (std::size_t b = 0; b < c.batches; ++b) {
      keys[b].resize(c.batch * c.slots);
      for (std::size_t i = 0; i < keys[b].size(); ++i) {
        const std::uint64_t h = embcache::detail::hash_words(rank + 1, b, i);
        const double u = static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
        const auto id = static_cast<std::int64_t>(std::ldexp(std::pow(u, 4.0), 20));
        keys[b][i] = static_cast<std::int64_t>(i % c.slots) << 32 | id;
      }
    }
  }
  embcache::key_batch<std::int64_t> view(std::size_t step, const config& c) const {
    const auto& k = keys[step % keys.size()];
    return {c.batch, c.slots, offsets.data(), k.data(), k.size()};
  }
};

embcache::sharded_table_options table_options(const config& c) {
  embcache::sharded_table_options o;
  o.table.dim = c.dim;
  o.table.optimizer.kind = embcache::optimizer_kind::adagrad;
  o.table.optimizer.learning_rate = 0.01f;
  o.table.max_threads = static_cast<int>(c.threads);
  o.num_blocks = c.blocks;
  return o;
}

embcache::host_store_options store_options(const config& c) {
  embcache::host_store_options s;
  s.table_name = "bench";
  s.row_width = 2 * c.dim;  // adagrad: embedding + accumulator
  s.space.max_threads = static_cast<int>(c.threads);
  return s;
}

// Everything a rank steps with.
struct rank_state {
  embcache::host_store<std::int64_t> store{store_options(g_cfg)};
  embcache::sharded_table<std::int64_t> table;
  batches data;
  std::vector<float> out, d_out;
  std::size_t step = 0;

  explicit rank_state(embcache::communicator& comm)
      : table(comm, store, table_options(g_cfg)),
        data(g_cfg, comm.rank()),
        out(g_cfg.batch * g_cfg.slots * g_cfg.dim),
        d_out(out.size(), 0.001f) {}

  void one_step() {
    check(table.forward(data.view(step, g_cfg), out.data()));
    check(table.backward(d_out.data()));
    ++step;
  }
};

embcache::mpi_communicator* g_comm = nullptr;
rank_state* g_state = nullptr;

void command(std::int64_t cmd) { check(g_comm->broadcast(&cmd, sizeof(cmd), 0)); }

void bm_distributed_step(benchmark::State& state) {
  rank_state& s = *g_state;
  double sent = 0, received = 0, min_bytes = 0, unique = 0, remote = 0;
  for (auto _ : state) {
    command(cmd_step);
    s.one_step();
    const auto& st = s.table.last_stats();
    sent += static_cast<double>(st.bytes_sent);
    received += static_cast<double>(st.bytes_received);
    min_bytes += static_cast<double>(st.min_bytes);
    unique += static_cast<double>(st.unique_keys);
    remote += static_cast<double>(st.remote_keys);
  }
  const double n = static_cast<double>(state.iterations());
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(g_cfg.batch) *
                          g_comm->size());
  state.counters["bytes_sent"] = sent / n;
  state.counters["bytes_received"] = received / n;
  state.counters["min_bytes"] = min_bytes / n;
  state.counters["unique_keys"] = unique / n;
  state.counters["remote_keys"] = remote / n;
  state.counters["store_rows"] = static_cast<double>(s.store.size());
}

// The baseline: the host-hybrid step on rank 0's batches, alone (the other ranks wait).
void bm_baseline_host_hybrid(benchmark::State& state) {
  embcache::host_store<std::int64_t> store(store_options(g_cfg));
  embcache::host_hybrid_table<std::int64_t> table(store, table_options(g_cfg).table);
  const batches data(g_cfg, 0);
  std::vector<float> out(g_cfg.batch * g_cfg.slots * g_cfg.dim), d_out(out.size(), 0.001f);
  std::size_t step = 0;
  for (std::size_t w = 0; w < g_cfg.batches; ++w, ++step) {  // same warm-up as the sharded table
    check(table.forward(data.view(step, g_cfg), out.data()));
    check(table.backward(d_out.data()));
  }
  for (auto _ : state) {
    check(table.forward(data.view(step, g_cfg), out.data()));
    check(table.backward(d_out.data()));
    ++step;
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(g_cfg.batch));
}

bool take(const char* arg, const char* name, std::size_t* out) {
  const std::size_t len = std::strlen(name);
  if (std::strncmp(arg, name, len) != 0) return false;
  *out = static_cast<std::size_t>(std::strtoull(arg + len, nullptr, 10));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  embcache::mpi_session session(&argc, &argv);
  embcache::mpi_communicator comm;
  g_comm = &comm;
  // Our flags out, Google Benchmark's through.
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (!take(argv[i], "--batch=", &g_cfg.batch) && !take(argv[i], "--slots=", &g_cfg.slots) &&
        !take(argv[i], "--dim=", &g_cfg.dim) && !take(argv[i], "--blocks=", &g_cfg.blocks) &&
        !take(argv[i], "--threads=", &g_cfg.threads))
      rest.push_back(argv[i]);
  }
  rank_state state(comm);
  g_state = &state;
  // Warm up every rank's store with each batch once, so timed steps meet mostly known keys.
  for (std::size_t w = 0; w < g_cfg.batches; ++w) state.one_step();

  if (comm.rank() == 0) {
    int n = static_cast<int>(rest.size());
    benchmark::Initialize(&n, rest.data());
    const std::string params =
        "/batch:" + std::to_string(g_cfg.batch) + "/slots:" + std::to_string(g_cfg.slots) +
        "/dim:" + std::to_string(g_cfg.dim) + "/blocks:" + std::to_string(g_cfg.blocks);
    benchmark::RegisterBenchmark(
        ("distributed_step/ranks:" + std::to_string(comm.size()) + params).c_str(),
        bm_distributed_step)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("baseline_step/host_hybrid" + params).c_str(),
                                 bm_baseline_host_hybrid)
        ->UseRealTime();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    command(cmd_stop);
  } else {
    for (;;) {
      std::int64_t cmd = cmd_stop;
      check(comm.broadcast(&cmd, sizeof(cmd), 0));
      if (cmd != cmd_step) break;
      state.one_step();
    }
  }
  return 0;
}
