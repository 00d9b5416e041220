// A table sharded by key owner: the requester's dedup/pool and the owner's host-hybrid rows.
#include "embcache/distributed/sharded_table.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "embcache/detail/host_algorithms.hpp"
#include "embcache/detail/sparse_ops.inl"

namespace embcache {
namespace {

// The batch's shape, and its samples against those of the rank's blocks.
template <class Key>
status check_sharded_batch(const key_batch<Key>& batch, std::size_t blocks,
                           std::size_t expected_samples) {
  const std::size_t bags = batch.num_bags();
  if (expected_samples == SIZE_MAX && batch.batch_size % blocks != 0)
    return status::invalid_argument("batch of " + std::to_string(batch.batch_size) +
                                    " samples does not split into this rank's " +
                                    std::to_string(blocks) + " blocks of equal size");
  if (expected_samples != SIZE_MAX && batch.batch_size != expected_samples)
    return status::invalid_argument("batch of " + std::to_string(batch.batch_size) +
                                    " samples, but this rank's blocks of the global batch hold " +
                                    std::to_string(expected_samples));
  if (bags == 0) {
    if (batch.num_keys != 0)
      return status::invalid_argument("batch without bags has " + std::to_string(batch.num_keys) +
                                      " keys");
    return {};
  }
  if (batch.offsets == nullptr) return status::invalid_argument("batch has no offsets");
  if (batch.offsets[0] != 0)
    return status::invalid_argument("batch offsets[0] is " + std::to_string(batch.offsets[0]) +
                                    ", expected 0");
  for (std::size_t b = 0; b < bags; ++b)
    if (batch.offsets[b + 1] < batch.offsets[b])
      return status::invalid_argument("batch offsets decrease at bag " + std::to_string(b));
  if (static_cast<std::size_t>(batch.offsets[bags]) != batch.num_keys)
    return status::invalid_argument("batch offsets end at " + std::to_string(batch.offsets[bags]) +
                                    ", expected num_keys " + std::to_string(batch.num_keys));
  if (batch.num_keys > 0 && batch.keys == nullptr)
    return status::invalid_argument("batch of " + std::to_string(batch.num_keys) +
                                    " occurrences has no keys");
  return {};
}

// Bytes of an exchange that cross to other ranks (what a rank sends to itself stays local).
std::uint64_t remote_bytes(const std::vector<std::size_t>& counts, int self, std::size_t elem) {
  std::uint64_t total = 0;
  for (std::size_t p = 0; p < counts.size(); ++p)
    if (static_cast<int>(p) != self) total += counts[p] * elem;
  return total;
}

}  // namespace

namespace {

// The default owner rows: host_hybrid_table on the rank's store, one bag per key (a bag of one
// key pools its row unchanged and passes its gradient through unchanged: 0 + g).
template <class Key>
class store_owner_rows final : public owner_rows<Key> {
 public:
  store_owner_rows(param_store<Key>& store, const host_hybrid_options& options,
                   embedding_initializer<Key> init)
      : store_(store), table_(store, options, std::move(init)) {}
  status read(const Key* keys, std::size_t n, float* rows, bool* found) override {
    return store_.pull(keys, n, rows, found);
  }
  status lookup(const Key* keys, std::size_t n, float* out) override {
    offsets_.resize(n + 1);
    for (std::size_t i = 0; i <= n; ++i) offsets_[i] = static_cast<std::int64_t>(i);
    return table_.forward({n, 1, offsets_.data(), keys, n}, out);
  }
  status update(const float* grads, std::uint64_t step) override {
    table_.set_step(step - 1);  // the table's next step is step
    return table_.backward(grads);
  }

 private:
  param_store<Key>& store_;
  host_hybrid_table<Key> table_;
  std::vector<std::int64_t> offsets_;
};

}  // namespace

template <class Key>
sharded_table<Key>::sharded_table(communicator& comm, param_store<Key>& shard,
                                  const sharded_table_options& options,
                                  embedding_initializer<Key> init)
    : sharded_table(comm, shard, options,
                    std::make_unique<store_owner_rows<Key>>(shard, options.table,
                                                            std::move(init))) {}

template <class Key>
sharded_table<Key>::sharded_table(communicator& comm, param_store<Key>& shard,
                                  const sharded_table_options& options,
                                  std::unique_ptr<owner_rows<Key>> rows)
    : comm_(comm), shard_(shard), options_(options), rows_(std::move(rows)) {
  blocks_ = blocks_of_rank(options.num_blocks, comm.rank(), comm.size())
                .value();  // throws invalid_argument naming the counts
}

template <class Key>
status sharded_table<Key>::forward(const key_batch<Key>& batch, float* out,
                                  std::size_t global_batch) {
  pending_ = false;
  stats_ = {};
  const std::string who = "sharded_table::forward on rank " + std::to_string(comm_.rank());
  // The samples of each of the rank's blocks, relative to its first.
  block_start_.assign(blocks_.count + 1, 0);
  std::size_t expected = SIZE_MAX;
  if (global_batch != 0) {
    const sample_range mine =
        block_samples(options_.num_blocks, global_batch, blocks_.first, blocks_.count);
    expected = mine.size();
    for (std::size_t j = 0; j <= blocks_.count; ++j)
      block_start_[j] =
          block_samples(options_.num_blocks, global_batch, blocks_.first + j).begin - mine.begin;
  } else if (blocks_.count > 0) {
    const std::size_t per = batch.batch_size / blocks_.count;
    for (std::size_t j = 0; j <= blocks_.count; ++j) block_start_[j] = j * per;
  }
  EMBCACHE_RETURN_IF_ERROR(
      agree(comm_, check_sharded_batch(batch, blocks_.count, expected).with_context(who),
            "sharded_table::forward"));
  EMBCACHE_RETURN_IF_ERROR(forward_impl(batch, out));
  pending_ = true;
  return {};
}

template <class Key>
result<std::size_t> sharded_table<Key>::send_to_owners(const Key* keys, std::size_t n,
                                                       std::vector<Key>& recv_keys,
                                                       std::vector<std::size_t>& counts,
                                                       std::vector<std::size_t>& recv_counts) {
  const host_space space{options_.table.max_threads};
  const int world = comm_.size();
  // Unique keys (ascending) and the unique index of every occurrence.
  inverse_.resize(n);
  std::vector<Key> unique;
  const std::size_t m = grouping_.group(space, keys, n, unique, inverse_.data());

  // Group the unique keys by owner (a stable counting sort keeps them ascending in each group).
  std::vector<int> owner(m);
  counts.assign(static_cast<std::size_t>(world), 0);
  for (std::size_t u = 0; u < m; ++u) {
    owner[u] = owner_of(unique[u], world);
    ++counts[static_cast<std::size_t>(owner[u])];
  }
  owner_start_.assign(static_cast<std::size_t>(world) + 1, 0);
  for (int p = 0; p < world; ++p) owner_start_[p + 1] = owner_start_[p] + counts[p];
  std::vector<std::size_t> fill(owner_start_.begin(), owner_start_.end() - 1);
  std::vector<std::int64_t> slot_of(m);
  sent_keys_.resize(m);
  for (std::size_t u = 0; u < m; ++u) {
    const std::size_t s = fill[static_cast<std::size_t>(owner[u])]++;
    sent_keys_[s] = unique[u];
    slot_of[u] = static_cast<std::int64_t>(s);
  }
  occurrence_rows_.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    occurrence_rows_[i] = slot_of[static_cast<std::size_t>(inverse_[i])];
  EMBCACHE_RETURN_IF_ERROR(exchange(comm_, sent_keys_, counts, recv_keys, recv_counts));
  return m;
}

template <class Key>
status sharded_table<Key>::forward_impl(const key_batch<Key>& batch, float* out) {
  const host_space space{options_.table.max_threads};
  const int world = comm_.size();
  const std::size_t dim = options_.table.dim;
  const std::size_t n = batch.num_keys;
  const std::size_t bags = batch.num_bags();
  batch_size_ = batch.batch_size;
  num_slots_ = batch.num_slots;
  offsets_.assign(batch.offsets, batch.offsets + (bags > 0 ? bags + 1 : 0));

  // Keys to their owners.
  std::vector<Key> recv_keys;
  std::vector<std::size_t> counts, recv_counts;
  auto sent = send_to_owners(batch.keys, n, recv_keys, counts, recv_counts);
  if (!sent.ok()) return sent.get_status();
  const std::size_t m = sent.value();
  stats_.unique_keys = m;
  stats_.remote_keys = m - counts[static_cast<std::size_t>(comm_.rank())];
  stats_.min_bytes = std::uint64_t{m} * dim * sizeof(float);
  stats_.bytes_sent += remote_bytes(counts, comm_.rank(), sizeof(Key)) + 8u * (world - 1);
  stats_.bytes_received += remote_bytes(recv_counts, comm_.rank(), sizeof(Key)) + 8u * (world - 1);

  // The owner's side: the keys every rank asked for, once each, looked up through the
  // host-hybrid table (which initializes the missing ones).
  const std::size_t r = recv_keys.size();
  std::vector<std::int64_t> own_index(r);
  const std::size_t k = grouping_.group(space, recv_keys.data(), r, own_keys_, own_index.data());
  stats_.owned_keys = k;
  std::vector<float> own_rows(k * dim);
  EMBCACHE_RETURN_IF_ERROR(
      agree(comm_,
            rows_->lookup(own_keys_.data(), k, own_rows.data())
                .with_context("sharded_table::forward on rank " + std::to_string(comm_.rank())),
            "sharded_table::forward"));

  // Embeddings back to the ranks that asked, in the order they asked.
  std::vector<float> send_rows(r * dim);
  for (std::size_t j = 0; j < r; ++j)
    std::memcpy(send_rows.data() + j * dim,
                own_rows.data() + static_cast<std::size_t>(own_index[j]) * dim,
                dim * sizeof(float));
  std::vector<std::size_t> row_counts(recv_counts), back_counts;
  for (auto& c : row_counts) c *= dim;
  EMBCACHE_RETURN_IF_ERROR(exchange(comm_, send_rows, row_counts, recv_rows_, back_counts));
  stats_.bytes_sent += remote_bytes(row_counts, comm_.rank(), sizeof(float)) + 8u * (world - 1);
  stats_.bytes_received +=
      remote_bytes(back_counts, comm_.rank(), sizeof(float)) + 8u * (world - 1);
  for (int p = 0; p < world; ++p)
    if (back_counts[p] != counts[p] * dim)
      return status::internal("sharded_table::forward on rank " + std::to_string(comm_.rank()) +
                              ": rank " + std::to_string(p) + " sent " +
                              std::to_string(back_counts[p]) + " floats for " +
                              std::to_string(counts[p]) + " keys of dim " + std::to_string(dim));

  // Pool this rank's bags from the embeddings that arrived.
  if (bags > 0) {
    const slot_batch local{batch_size_, num_slots_, offsets_.data(), occurrence_rows_.data(), n};
    lookup_combine(space, recv_rows_.data(), dim, dim, local, options_.table.comb, out);
  }
  return {};
}

template <class Key>
status sharded_table<Key>::backward(const float* d_out) {
  if (!pending_)
    throw error(status_code::invalid_argument,
                "sharded_table::backward on rank " + std::to_string(comm_.rank()) +
                    " without a forward() since the last backward()");
  pending_ = false;
  return backward_impl(d_out);
}

template <class Key>
status sharded_table<Key>::backward_impl(const float* d_out) {
  const host_space space{options_.table.max_threads};
  const int world = comm_.size();
  const std::size_t dim = options_.table.dim;
  const std::size_t record = sizeof(Key) + dim * sizeof(float);

  // Per block, in block order: one partial per key of the block, summed over the block's
  // occurrences in batch order. Each owner's records are kept block by block, so an owner that
  // reads its senders in rank order meets a key's partials in global block order.
  std::vector<std::vector<unsigned char>> to_owner(static_cast<std::size_t>(world));
  std::vector<std::int64_t> block_offsets;
  for (std::size_t j = 0; j < blocks_.count; ++j) {
    const std::size_t samples = block_start_[j + 1] - block_start_[j];
    const std::size_t block_bags = samples * num_slots_;
    if (block_bags == 0) continue;
    block_offsets.resize(block_bags + 1);
    const std::size_t b0 = block_start_[j] * num_slots_;
    const std::int64_t base = offsets_[b0];
    for (std::size_t b = 0; b <= block_bags; ++b) block_offsets[b] = offsets_[b0 + b] - base;
    const std::size_t occ = static_cast<std::size_t>(block_offsets[block_bags]);
    const slot_batch block{samples, num_slots_, block_offsets.data(),
                           occurrence_rows_.data() + base, occ};
    aggregate_gradients(space, block, options_.table.comb, d_out + b0 * dim, dim, grads_);
    std::size_t p = 0;
    for (std::size_t i = 0; i < grads_.size; ++i) {
      const auto s = static_cast<std::size_t>(grads_.rows.data()[i]);
      while (s >= owner_start_[p + 1]) ++p;
      auto& buf = to_owner[p];
      const std::size_t at = buf.size();
      buf.resize(at + record);
      std::memcpy(buf.data() + at, &sent_keys_[s], sizeof(Key));
      std::memcpy(buf.data() + at + sizeof(Key), grads_.values.data() + i * dim,
                  dim * sizeof(float));
    }
    stats_.gradient_records += grads_.size;
  }
  std::vector<unsigned char> send;
  std::vector<std::size_t> counts(static_cast<std::size_t>(world));
  for (int p = 0; p < world; ++p) {
    counts[p] = to_owner[p].size();
    send.insert(send.end(), to_owner[p].begin(), to_owner[p].end());
  }
  std::vector<unsigned char> recv;
  std::vector<std::size_t> recv_counts;
  EMBCACHE_RETURN_IF_ERROR(exchange(comm_, send, counts, recv, recv_counts));
  stats_.bytes_sent += remote_bytes(counts, comm_.rank(), 1) + 8u * (world - 1);
  stats_.bytes_received += remote_bytes(recv_counts, comm_.rank(), 1) + 8u * (world - 1);

  // The owner's canonical sum: every key starts at 0 and adds its partials in arrival order,
  // which is rank order, then block order within a rank: global block order.
  status local;
  std::vector<float> partial(dim);
  own_grads_.assign(own_keys_.size() * dim, 0.0f);
  if (recv.size() % record != 0)
    local = status::internal("received " + std::to_string(recv.size()) +
                             " bytes of gradient records of " + std::to_string(record) + " bytes");
  for (std::size_t at = 0; local.ok() && at < recv.size(); at += record) {
    Key key;
    std::memcpy(&key, recv.data() + at, sizeof(Key));
    const auto it = std::lower_bound(own_keys_.begin(), own_keys_.end(), key);
    if (it == own_keys_.end() || *it != key) {
      local = status::internal("a gradient arrived for key " + std::to_string(key) +
                               " that no rank looked up in this step");
      break;
    }
    float* g = own_grads_.data() + static_cast<std::size_t>(it - own_keys_.begin()) * dim;
    // Records are packed, so the floats are copied out before they are read.
    std::memcpy(partial.data(), recv.data() + at + sizeof(Key), dim * sizeof(float));
    for (std::size_t d = 0; d < dim; ++d) g[d] += partial[d];
  }
  // The owner's rows of own_keys_ (from the forward) take their summed gradients.
  if (local.ok()) local = rows_->update(own_grads_.data(), step_ + 1);
  EMBCACHE_RETURN_IF_ERROR(agree(
      comm_, local.with_context("sharded_table::backward on rank " + std::to_string(comm_.rank())),
      "sharded_table::backward"));
  ++step_;
  return {};
}

template <class Key>
status sharded_table<Key>::read(const Key* keys, std::size_t n, float* rows, bool* found) {
  const status local = n > 0 && (keys == nullptr || rows == nullptr || found == nullptr)
                           ? status::invalid_argument("a read of " + std::to_string(n) +
                                                      " keys without keys, rows or flags")
                           : status{};
  const std::string who = "sharded_table::read on rank " + std::to_string(comm_.rank());
  EMBCACHE_RETURN_IF_ERROR(agree(comm_, local.with_context(who), "sharded_table::read"));
  return read_impl(keys, n, rows, found);
}

template <class Key>
status sharded_table<Key>::read_impl(const Key* keys, std::size_t n, float* rows, bool* found) {
  const std::size_t width = shard_.row_width();
  std::vector<Key> recv_keys;
  std::vector<std::size_t> counts, recv_counts;
  auto sent = send_to_owners(keys, n, recv_keys, counts, recv_counts);
  if (!sent.ok()) return sent.get_status();
  // The owner's side: a flag, then the row, per key asked for (in the order asked).
  const std::size_t r = recv_keys.size();
  const std::size_t record = width + 1;
  std::vector<float> pulled(r * width);
  std::unique_ptr<bool[]> have(new bool[r > 0 ? r : 1]);
  status local = r > 0 ? rows_->read(recv_keys.data(), r, pulled.data(), have.get()) : status{};
  std::vector<float> send_rows(local.ok() ? r * record : 0);
  for (std::size_t j = 0; local.ok() && j < r; ++j) {
    send_rows[j * record] = have[j] ? 1.0f : 0.0f;
    std::memcpy(send_rows.data() + j * record + 1, pulled.data() + j * width,
                width * sizeof(float));
  }
  EMBCACHE_RETURN_IF_ERROR(agree(
      comm_, local.with_context("sharded_table::read on rank " + std::to_string(comm_.rank())),
      "sharded_table::read"));
  std::vector<std::size_t> row_counts(recv_counts), back_counts;
  for (auto& c : row_counts) c *= record;
  std::vector<float> back;
  EMBCACHE_RETURN_IF_ERROR(exchange(comm_, send_rows, row_counts, back, back_counts));
  if (back.size() != sent.value() * record)
    return status::internal("sharded_table::read on rank " + std::to_string(comm_.rank()) +
                            ": " + std::to_string(back.size()) + " floats came back for " +
                            std::to_string(sent.value()) + " keys of row width " +
                            std::to_string(width));
  for (std::size_t i = 0; i < n; ++i) {
    const float* rec = back.data() + static_cast<std::size_t>(occurrence_rows_[i]) * record;
    found[i] = rec[0] != 0.0f;
    if (found[i])
      std::memcpy(rows + i * width, rec + 1, width * sizeof(float));
    else
      std::fill(rows + i * width, rows + (i + 1) * width, 0.0f);
  }
  return {};
}

template <class Key>
status sharded_table<Key>::save(const std::string& dir, const std::string& run_id,
                                std::uint64_t applied_delta,
                                const sharded_lifetime* lifetime) {
  sharded_save_info info;
  info.table_name = shard_.table_name();
  info.dim = options_.table.dim;
  info.row_width = shard_.row_width();
  info.optimizer = to_string(options_.table.optimizer.kind);
  info.step = step();
  info.num_blocks = options_.num_blocks;
  info.run_id = run_id;
  info.applied_delta = applied_delta;
  return save_sharded(comm_, shard_, dir, info, lifetime);
}

template <class Key>
status sharded_table<Key>::load(const std::string& dir, const part_opener<Key>& open,
                                std::string* run_id_out, sharded_manifest* manifest_out) {
  auto manifest = read_sharded_manifest(dir);
  status local = manifest.get_status();
  if (local.ok()) {
    const sharded_save_info& info = manifest.value().info;
    const std::string kind = to_string(options_.table.optimizer.kind);
    if (info.dim != options_.table.dim || info.optimizer != kind)
      local = status::invalid_argument("sharded_table::load of '" + dir + "': the save holds " +
                                       info.optimizer + " rows of dim " + std::to_string(info.dim) +
                                       ", this table is " + kind + " of dim " +
                                       std::to_string(options_.table.dim));
  }
  EMBCACHE_RETURN_IF_ERROR(agree(comm_, local, "sharded_table::load"));
  auto loaded = load_sharded(comm_, dir, shard_, open);
  if (!loaded.ok()) return loaded.get_status();
  set_step(loaded.value().info.step);
  if (run_id_out) *run_id_out = loaded.value().info.run_id;
  if (manifest_out) *manifest_out = std::move(loaded).value();
  return {};
}

template class sharded_table<std::int64_t>;
template class sharded_table<std::uint32_t>;

}  // namespace embcache
