// The trainer as one rank of a sharded, data-parallel run: every rank reads every batch, trains
// on its blocks of it (distributed/ownership.hpp) and sums the dense gradients over every block
// in block order (distributed/dense_all_reduce.hpp); the tables are sharded (sharded_path.cpp).
// Whatever the number of ranks, each block is computed the same way and every sum is taken in
// the same order, so the model is the same bits.
#include <cmath>
#include <string>

#include "embcache/criteo.hpp"
#include "embcache/distributed/dense_all_reduce.hpp"
#include "trainer_impl.hpp"

namespace embcache {

status detail::check_sharded_config(const trainer_config& config, const communicator& comm) {
  const int world = comm.size();
  if (config.world != 0 && config.world != world)
    return status::invalid_argument("config.world: " + std::to_string(config.world) +
                                    " ranks, but the launcher started " + std::to_string(world));
  if (config.mode == trainer_mode::on_demand)
    return status::invalid_argument(std::string("config.mode: \"") + to_string(config.mode) +
                                    "\" on " + std::to_string(world) +
                                    " ranks: a sharded run trains in mode \"keyset\" or "
                                    "\"host_hybrid\"");
  if (config.num_blocks % static_cast<std::size_t>(world) != 0)
    return status::invalid_argument("config.num_blocks: " + std::to_string(config.num_blocks) +
                                    " blocks do not split over " + std::to_string(world) +
                                    " ranks (must be a multiple of the number of ranks)");
  return {};
}

status trainer::impl::train_step_sharded(const shard_batch& b, std::uint64_t pass,
                                         std::uint64_t pass_step, double* loss) {
  const std::size_t n = b.size, ws = num_wide_slots, ds = config.num_slots;
  const std::size_t dim = config.tables[roles.deep].dim;
  const std::size_t num_blocks = config.num_blocks;
  const sample_range mine = block_samples(num_blocks, n, blocks.first, blocks.count);
  const std::size_t m = mine.size();
  fill_keys(b, mine.begin, m);
  scratch.in_wide.resize(m * ws);
  scratch.in_deep.resize(m * ds * dim);
  scratch.d_wide.assign(m * ws, 0.0f);
  scratch.d_deep.assign(m * ds * dim, 0.0f);
  const detail::batch_keys keys{m,  scratch.wide_keys.data(), ws, b.keys.data() + mine.begin * ds,
                                ds, scratch.offsets.data(),   n};
  // Expiry's ttl_steps: every rank begins every step, so its step clock counts the global steps.
  EMBCACHE_RETURN_IF_ERROR(path->begin_step());
  EMBCACHE_RETURN_IF_ERROR(path->forward(keys, scratch.in_wide.data(), scratch.in_deep.data()));

  // Each block's dense gradient, as its share of the global batch's mean loss. The dropout
  // masks of block g at step t are those of dropout step t * num_blocks + g (t with one block).
  const std::size_t ng = model->num_gradients();
  scratch.dense_partials.assign(blocks.count * ng, 0.0f);
  scratch.block_losses.assign(blocks.count, 0.0);
  for (std::size_t j = 0; j < blocks.count; ++j) {
    const sample_range r = block_samples(num_blocks, n, blocks.first + j);
    if (r.size() == 0) continue;  // a short batch leaves some blocks empty: zero gradient
    const std::size_t at = r.begin - mine.begin;
    wide_deep_batch wb{r.size(), scratch.in_wide.data() + at * ws,
                       scratch.in_deep.data() + at * ds * dim,
                       b.dense.data() + r.begin * config.num_dense, b.labels.data() + r.begin};
    wb.mean_over = n;
    scratch.block_losses[j] = model->forward_backward(
        wb, progress.step * num_blocks + blocks.first + j, scratch.d_wide.data() + at * ws,
        scratch.d_deep.data() + at * ds * dim);
    model->get_gradients(scratch.dense_partials.data() + j * ng);
  }
  // The batch's loss: the blocks' shares added in block order, on every rank.
  std::vector<double> all_losses(num_blocks);
  EMBCACHE_RETURN_IF_ERROR(comm->all_gather(scratch.block_losses.data(),
                                            blocks.count * sizeof(double), all_losses.data()));
  double sum = 0;
  for (const double l : all_losses) sum += l;
  *loss = sum;
  // Stop before this step changes a row or a weight, on every rank together.
  if (!std::isfinite(*loss))
    return diverge(detail::step_label(pass, progress.step + 1, pass_step),
                   std::string("the batch loss is ") + (std::isnan(*loss) ? "NaN" : "infinite"));
  std::uint64_t bad_gradients = count_non_finite(scratch.d_wide.data(), m * ws) +
                                count_non_finite(scratch.d_deep.data(), m * ds * dim);
  EMBCACHE_RETURN_IF_ERROR(comm->all_reduce_sum(&bad_gradients, 1));
  if (bad_gradients)
    return diverge(detail::step_label(pass, progress.step + 1, pass_step),
                   std::to_string(bad_gradients) + " gradients of the embeddings are not finite");
  scratch.dense_sum.resize(ng);
  EMBCACHE_RETURN_IF_ERROR(all_reduce_blocks(*comm, scratch.dense_partials.data(), blocks.count, ng,
                                             scratch.dense_sum.data()));
  ++progress.step;
  detail::non_finite_rows bad;
  EMBCACHE_RETURN_IF_ERROR(
      path->backward(scratch.d_wide.data(), scratch.d_deep.data(), progress.step, &bad));
  model->set_gradients(scratch.dense_sum.data());
  model->apply_dense_update();
  return {};
}

status trainer::impl::predict_batch_sharded(const shard_batch& b, std::size_t n) {
  const std::size_t ws = num_wide_slots, ds = config.num_slots;
  const std::size_t dim = config.tables[roles.deep].dim;
  const std::size_t num_blocks = config.num_blocks;
  const sample_range mine = block_samples(num_blocks, n, blocks.first, blocks.count);
  const std::size_t m = mine.size();
  fill_keys(b, mine.begin, m);
  scratch.in_wide.assign(m * ws, 0.0f);
  scratch.in_deep.assign(m * ds * dim, 0.0f);
  // Collective reads: every rank asks for the keys of its samples (maybe none).
  for (const detail::table_read& p :
       {detail::table_read{roles.wide, scratch.wide_keys.data(), m * ws, 1, scratch.in_wide.data()},
        detail::table_read{roles.deep, b.keys.data() + mine.begin * ds, m * ds, dim,
                           scratch.in_deep.data()}})
    EMBCACHE_RETURN_IF_ERROR(read_embeddings(p));
  // Block by block, as training computes them, so that a logit does not depend on the ranks.
  std::vector<float> local(m), block;
  for (std::size_t j = 0; j < blocks.count; ++j) {
    const sample_range r = block_samples(num_blocks, n, blocks.first + j);
    if (r.size() == 0) continue;
    const std::size_t at = r.begin - mine.begin;
    model->predict(
        {r.size(), scratch.in_wide.data() + at * ws, scratch.in_deep.data() + at * ds * dim,
         b.dense.data() + r.begin * config.num_dense, nullptr},
        block);
    std::copy(block.begin(), block.end(), local.begin() + at);
  }
  // Every rank gets every logit, in sample order (rank order is sample order).
  const auto world = static_cast<std::size_t>(comm->size());
  std::vector<float> send;
  send.reserve(world * m);
  for (std::size_t p = 0; p < world; ++p) send.insert(send.end(), local.begin(), local.end());
  std::vector<std::size_t> counts(world, m), recv_counts;
  EMBCACHE_RETURN_IF_ERROR(exchange(*comm, send, counts, scratch.logits, recv_counts));
  if (scratch.logits.size() != n)
    return status::internal("evaluation on rank " + std::to_string(comm->rank()) + ": " +
                            std::to_string(scratch.logits.size()) + " logits gathered for " +
                            std::to_string(n) + " samples");
  return {};
}

}  // namespace embcache
