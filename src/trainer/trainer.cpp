// The reference Wide&Deep trainer's training loop: building the parts, passes over shards
// (batches, progress lines, per-step metrics), evaluation and the incremental export after each
// pass. The tables are reached through the embedding path (embedding_path.hpp), the saves are
// in trainer_checkpoint.cpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>

#include "common/durable_file.hpp"
#include "embcache/criteo.hpp"
#include "embcache/detail/hash.hpp"
#include "embcache/detail/progress.hpp"
#include "embcache/shard.hpp"
#include "embcache/trainer/criteo_model.hpp"
#include "embcache/trainer/metrics.hpp"
#include "reporting.hpp"
#include "trainer_impl.hpp"

namespace embcache {
namespace {

using json = nlohmann::json;
using clock_type = trainer::impl::clock_type;
using detail::create_folder;
using detail::step_label;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Samples of every shard of `passes`, from their headers; 0 (unknown) when one cannot be read
// (the pass that reads it reports why).
std::uint64_t samples_of_passes(const std::string& data_dir,
                                const std::vector<trainer_pass_config>& passes) {
  std::uint64_t total = 0;
  for (const auto& pass : passes)
    for (const auto& shard : pass.shards) {
      auto h = read_shard_header(resolve_data_path(data_dir, shard));
      if (!h.ok()) return 0;
      total += h.value().rows;
    }
  return total;
}

}  // namespace

std::string detail::step_label(std::uint64_t pass, std::uint64_t global_step,
                               std::uint64_t pass_step) {
  return "pass " + std::to_string(pass) + " step " + std::to_string(global_step) + " (step " +
         std::to_string(pass_step) + " of the pass)";
}

trainer::impl::impl() : log([](const std::string& s) { std::cout << s << std::endl; }) {}

status trainer::impl::diverge(const std::string& where, const std::string& what) {
  notes.diverged = status::invalid_argument(
      where + ": training diverged: " + what +
      "; the run stops here, saving and exporting nothing (lower the learning rates, check the "
      "data for non-finite features)");
  return notes.diverged;
}

// The memory estimate first: a clear error instead of an allocation that cannot succeed. Caches
// in the cuda space are not host memory: the cuda path checks them against the device's.
status trainer::impl::build() {
  auto on_cuda = detail::embedding_device_of(config, comm != nullptr, nullptr);
  if (!on_cuda.ok()) return on_cuda.get_status();
  memory_budget budget;
  budget.host_bytes = physical_memory_bytes();
  budget.caches_on_device = on_cuda.value();
  EMBCACHE_RETURN_IF_ERROR(check_memory(config, budget));
  // Under a budget, memory freed by the run's large buffers goes back to the system rather than
  // staying in the allocator's heaps, past what the plan counts (docs/trainer.md).
  if (config.memory_budget_bytes != 0) keep_allocator_within_budget();
  // Each part names what it allocates when memory runs out (detail::allocating); "config.tables"
  // is the embedding path's, outside its named parts.
  auto p =
      detail::allocating("config.tables", [&]() -> result<std::unique_ptr<detail::embedding_path>> {
        space.max_threads = config.threads;
        roles = detail::roles_of(config);
        num_wide_slots = model_wide_slots(config.num_slots, config.crossed);
        return detail::make_embedding_path(config, space, comm, &notes.embedding_note);
      });
  if (!p.ok()) return p.get_status();
  path = std::move(p).value();
  return detail::allocating("config.model: the dense network", [&]() -> status {
    const wide_deep_options mo =
        criteo_model_shape(config.model, config.crossed, config.tables[roles.deep].dim,
                           config.num_dense, config.num_slots);
    // Shape errors are the model's, not the device's.
    if (const status ms = check_options(mlp_options(mo)); !ms.ok())
      return status(ms.code(), "config.model: " + ms.message());
    if (config.blas_threads > 0) set_host_blas_threads(config.blas_threads);
    auto m = make_dense_backend(config.dense_device, mo, space, &notes.dense_note,
                                "config.dense_device");
    if (!m.ok()) return m.get_status();
    model = std::move(m).value();
    pooled_on_device = path->pools_on_device() && model->takes_device_inputs();
    return {};
  });
}

void trainer::impl::fill_keys(const shard_batch& b, std::size_t first, std::size_t count) {
  const std::size_t n = std::min(count, b.size - first), ws = num_wide_slots;
  scratch.wide_keys.resize(n * ws);
  fill_wide_keys(b, first, n, config.crossed, scratch.wide_keys.data());
  const std::size_t need = n * std::max(ws, config.num_slots) + 1;
  // One-hot bags: the offsets are 0, 1, 2, ... for every batch.
  while (scratch.offsets.size() < need)
    scratch.offsets.push_back(std::int64_t(scratch.offsets.size()));
}

status trainer::impl::train_step(const shard_batch& b, std::uint64_t pass, std::uint64_t pass_step,
                                 double* loss) {
  if (comm != nullptr) return train_step_sharded(b, pass, pass_step, loss);
  const std::size_t n = b.size, ws = num_wide_slots, ds = config.num_slots;
  const std::size_t dim = config.tables[roles.deep].dim;
  fill_keys(b);
  const detail::batch_keys keys{n,  scratch.wide_keys.data(), ws, b.keys.data(),
                                ds, scratch.offsets.data()};
  EMBCACHE_RETURN_IF_ERROR(path->begin_step());
  // The pooled embeddings and their gradients: the path's device arrays when the tables and the
  // dense network are both on the device, else the loop's host arrays.
  detail::space_pooled p;
  if (pooled_on_device) {
    auto pooled = path->forward_in_space(keys);
    if (!pooled.ok()) return pooled.get_status();
    p = pooled.value();
  } else {
    scratch.in_wide.resize(n * ws);
    scratch.in_deep.resize(n * ds * dim);
    scratch.d_wide.resize(n * ws);
    scratch.d_deep.resize(n * ds * dim);
    EMBCACHE_RETURN_IF_ERROR(path->forward(keys, scratch.in_wide.data(), scratch.in_deep.data()));
    p = {scratch.in_wide.data(), scratch.in_deep.data(), scratch.d_wide.data(),
         scratch.d_deep.data()};
  }
  const wide_deep_batch batch{n, p.wide, p.deep, b.dense.data(), b.labels.data()};
  *loss = pooled_on_device
              ? model->forward_backward_on_device(batch, progress.step, p.d_wide, p.d_deep)
              : model->forward_backward(batch, progress.step, p.d_wide, p.d_deep);
  // Stop before this step changes a row or a weight: the first non-finite value ends the run.
  if (!std::isfinite(*loss))
    return diverge(step_label(pass, progress.step + 1, pass_step),
                   std::string("the batch loss is ") + (std::isnan(*loss) ? "NaN" : "infinite"));
  std::size_t bad_gradients = 0;
  if (pooled_on_device) {
    auto c = path->non_finite_gradients_in_space();
    if (!c.ok()) return c.get_status();
    bad_gradients = c.value();
  } else {
    bad_gradients = count_non_finite(p.d_wide, n * ws) + count_non_finite(p.d_deep, n * ds * dim);
  }
  if (bad_gradients)
    return diverge(step_label(pass, progress.step + 1, pass_step),
                   std::to_string(bad_gradients) + " gradients of the embeddings are not finite");
  ++progress.step;
  // No non-finite row may reach a store, an export or a save.
  detail::non_finite_rows bad;
  EMBCACHE_RETURN_IF_ERROR(pooled_on_device
                               ? path->backward_in_space(progress.step, &bad)
                               : path->backward(p.d_wide, p.d_deep, progress.step, &bad));
  if (bad.rows)
    return diverge(step_label(pass, progress.step, pass_step),
                   std::to_string(bad.rows) + " rows of table " + bad.table +
                       " are not finite after its optimizer step");
  model->apply_dense_update();
  return {};
}

trainer::trainer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
trainer::~trainer() = default;

result<std::unique_ptr<trainer>> trainer::create_with(const trainer_config& given,
                                                      communicator* comm) {
  EMBCACHE_RETURN_IF_ERROR(validate(given));
  auto resolved = resolve_trainer_config(given);  // dataset passes, capacity "auto"
  if (!resolved.ok()) return resolved.get_status();
  trainer_config& config = resolved.value();
  // A rank's cache holds its part of each keyset, about 1/N of it: "auto" sizes it so, with room
  // for the spread of a hash partition.
  if (comm != nullptr && comm->size() > 1)
    for (std::size_t t = 0; t < config.tables.size(); ++t)
      if (std::uint64_t slots = 0;
          given.tables[t].capacity_auto && table_slots(config.tables[t].capacity, 0, &slots))
        config.tables[t].capacity = std::min<std::size_t>(config.tables[t].capacity,
                                                          slots / std::size_t(comm->size()) + 64);
  auto p = std::make_unique<impl>();
  p->config = config;
  p->comm = comm;
  if (comm != nullptr) {
    EMBCACHE_RETURN_IF_ERROR(detail::check_sharded_config(config, *comm));
    p->blocks = blocks_of_rank(config.num_blocks, comm->rank(), comm->size()).value();
    if (comm->rank() != 0) p->log = [](const std::string&) {};  // rank 0 speaks for the run
  }
  status built = p->build();
  if (comm != nullptr) built = agree(*comm, built, "trainer::create");
  EMBCACHE_RETURN_IF_ERROR(built);
  std::unique_ptr<trainer> t(new trainer(std::move(p)));
  if (!config.resume_from.empty())
    EMBCACHE_RETURN_IF_ERROR(t->load(config.resume_from).with_context("config.resume_from"));
  if (!config.start_from_hugectr.empty()) {
    if (comm != nullptr && comm->size() > 1)
      return status::invalid_argument(
          "config.start_from_hugectr: a sharded run starts from the save of a sharded run "
          "(resume_from); load the HugeCTR folder in one process and save it first");
    load_options lo;
    lo.allow_hugectr_folder = true;
    EMBCACHE_RETURN_IF_ERROR(t->impl_->path->load_sparse(config.start_from_hugectr, lo)
                                 .with_context("config.start_from_hugectr"));
  }
  return t;
}

result<std::unique_ptr<trainer>> trainer::create(const trainer_config& given) {
  if (given.world > 1)
    return status::invalid_argument("config.world: " + std::to_string(given.world) +
                                    " ranks need a launcher: run embcache-train under mpirun -np " +
                                    std::to_string(given.world) +
                                    ", or pass a communicator to trainer::create");
  return create_with(given, nullptr);
}

result<std::unique_ptr<trainer>> trainer::create(const trainer_config& given, communicator& comm) {
  return create_with(given, &comm);
}

std::uint64_t trainer::step() const noexcept { return impl_->progress.step; }
std::uint64_t trainer::passes_done() const noexcept { return impl_->progress.passes_done; }
const std::vector<pass_metrics>& trainer::history() const noexcept {
  return impl_->progress.history;
}
const trainer_config& trainer::config() const noexcept { return impl_->config; }
const char* trainer::embedding_device() const noexcept { return impl_->path->device(); }
const std::string& trainer::embedding_note() const noexcept { return impl_->notes.embedding_note; }
const cache_counters& trainer::counters() const { return impl_->path->counters(); }
training_cache<std::int64_t>& trainer::cache() {
  training_cache<std::int64_t>* c = impl_->path->host_cache();
  if (c == nullptr)
    throw error(status_code::unsupported,
                "trainer::cache(): the embeddings are in the cuda space "
                "(config.embedding_device); use trainer::cuda_cache()");
  return *c;
}
training_cache<std::int64_t, cuda_space>& trainer::cuda_cache() {
  training_cache<std::int64_t, cuda_space>* c = impl_->path->cuda_cache();
  if (c == nullptr)
    throw error(status_code::unsupported,
                "trainer::cuda_cache(): the embeddings are on the host "
                "(config.embedding_device); use trainer::cache()");
  return *c;
}
dense_backend& trainer::model() noexcept { return *impl_->model; }
const std::string& trainer::dense_note() const noexcept { return impl_->notes.dense_note; }
void trainer::set_log(std::function<void(const std::string&)> log) { impl_->log = std::move(log); }

status trainer::run() {
  const auto& passes = impl_->config.passes;
  if (!impl_->notes.dense_note_logged) {
    impl_->log(impl_->notes.dense_note);
    impl_->log(impl_->notes.embedding_note);
    impl_->notes.dense_note_logged = true;
  }
  if (!impl_->notes.diverged.ok()) return impl_->notes.diverged;
  if (const std::string shared =
          detail::eval_shard_in_training(impl_->config, impl_->progress.passes_done);
      !shared.empty())
    impl_->log(shared);
  std::vector<std::unique_ptr<detail::file_lock>> folder_locks;  // one writer per save/export dir
  status s;
  // What the run is doing, for an exception that escapes it: "pass 3" or "save to DIR" (then with
  // the step), or its start (the folder locks, whose agreement is a collective, and the logs).
  std::string doing = "the start of the run";
  bool stepping = false, saving = false;
  try {
    EMBCACHE_RETURN_IF_ERROR(detail::lock_output_folders(*impl_, &folder_locks));
    if (impl_->leader() && !impl_->config.output_dir.empty() && impl_->config.resume_from.empty()) {
      EMBCACHE_RETURN_IF_ERROR(create_folder(impl_->config.output_dir, "config.output_dir"));
      EMBCACHE_RETURN_IF_ERROR(detail::start_metrics_files(impl_->config.output_dir));
    }
    impl_->progress.run_last_pass = impl_->progress.passes_done + passes.size();
    impl_->progress.run_total = samples_of_passes(impl_->config.data_dir, passes);
    impl_->progress.run_done = 0;
    impl_->progress.run_t0 = clock_type::now();
    stepping = true;
    for (std::size_t p = 0; p < passes.size() && s.ok(); ++p) {
      doing = "pass " + std::to_string(impl_->progress.passes_done + 1);
      saving = false;
      auto m = run_pass(passes[p], p + 1 < passes.size() ? &passes[p + 1] : nullptr);
      if (!m.ok()) {
        s = m.get_status();
      } else if (impl_->config.save_every_pass && !impl_->config.save_dir.empty() &&
                 p + 1 < passes.size()) {
        doing = "save to " + impl_->config.save_dir;
        saving = true;
        s = save(impl_->config.save_dir);
      }
    }
    if (s.ok() && !impl_->config.save_dir.empty()) {
      doing = "save to " + impl_->config.save_dir;
      saving = true;
      s = save(impl_->config.save_dir);
    }
  } catch (...) {
    s = detail::status_of_exception(
        std::current_exception(),
        !stepping ? doing
                  : doing + (saving ? " after step " : " step ") +
                        std::to_string(impl_->progress.step + (saving ? 0 : 1)));
  }
  impl_->progress.run_last_pass = impl_->progress.run_total =
      0;  // a run_pass() of its own has no run part
  return s;
}

status detail::status_of_exception(std::exception_ptr e, const std::string& where) {
  try {
    std::rethrow_exception(e);
  } catch (const std::bad_alloc&) {
    return status::capacity_exceeded(
        where +
        ": out of memory (std::bad_alloc); the run stops here, saving nothing more (lower the "
        "tables' capacity, batch_size or the model size, or free memory)");
  } catch (const error& x) {
    return status(x.code(), where + ": " + x.what());
  } catch (const std::exception& x) {
    return status::internal(where + ": unexpected exception: " + x.what());
  } catch (...) {
    return status::internal(where + ": unexpected exception of an unknown type");
  }
}

result<pass_metrics> trainer::run_pass(const trainer_pass_config& given,
                                       const trainer_pass_config* next) {
  impl& s = *impl_;
  if (!s.notes.diverged.ok()) return s.notes.diverged;
  const trainer_config& c = s.config;
  trainer_config one = c;  // a pass naming a dataset folder gets its shards
  one.passes = {given};
  auto expanded = resolve_trainer_config(one);
  if (!expanded.ok()) return expanded.get_status();
  const trainer_pass_config& pass = expanded.value().passes[0];
  std::vector<std::string> paths;
  for (const auto& p : pass.shards) paths.push_back(resolve_data_path(c.data_dir, p));
  pass_metrics m;
  m.pass = s.progress.passes_done + 1;
  shard_reader_options ro;
  ro.batch_size = c.batch_size;
  ro.shuffle = c.shuffle;
  ro.seed = detail::splitmix64_finalize(c.seed ^ m.pass);
  ro.num_dense = c.num_dense;
  ro.num_slots = c.num_slots;
  auto reader = shard_reader::open(paths, ro);
  if (!reader.ok()) return reader.get_status().with_context("pass " + std::to_string(m.pass));
  if (c.crossed && reader.value()->num_crossed() < criteo_cross_count)
    return status::invalid_argument(
        "config.crossed: the shards of pass " + std::to_string(m.pass) + " have " +
        std::to_string(reader.value()->num_crossed()) + " crossed keys, expected " +
        std::to_string(criteo_cross_count) + " (prepare them with crossing on)");
  const table_counters before = detail::sum_of_tables(s.path->counters().total);
  s.path->take_activity();  // the pass's own from here
  detail::path_activity interval, whole;
  std::size_t current = SIZE_MAX;
  shard_batch batch;
  double loss_sum = 0, interval_loss = 0;
  std::uint64_t interval_steps = 0, interval_samples = 0;
  const std::uint64_t pass_total = reader.value()->total_rows();
  const auto t0 = clock_type::now();
  auto ti = t0;
  std::string rate = "n/a";
  double rate_value = std::nan("");  // `rate` as a number, for metrics_steps.jsonl
  // Adds what the path did since it was last asked to the interval's and the pass's figures.
  const auto take_activity = [&] {
    const detail::path_activity a = s.path->take_activity();
    interval.hits += a.hits;
    interval.misses += a.misses;
    whole.blocked_seconds += a.blocked_seconds;
  };
  for (;;) {
    EMBCACHE_RETURN_IF_ERROR(reader.value()->next(batch));
    if (batch.size == 0) break;
    const std::size_t current_shard = batch.shard_index;
    if (batch.shard_index != current) {
      current = batch.shard_index;
      // The shard after this one, staged while this one trains (keyset mode with prefetch).
      std::string upcoming;
      if (current + 1 < paths.size())
        upcoming = paths[current + 1];
      else if (next != nullptr && !next->shards.empty())
        upcoming = resolve_data_path(c.data_dir, next->shards[0]);
      EMBCACHE_RETURN_IF_ERROR(s.path->begin_shard(paths[current], upcoming));
    }
    // A non-finite feature would turn the weights it meets into NaN, which a ReLU can hide from
    // the loss: refuse the batch instead.
    if (const std::size_t bad = count_non_finite(batch.dense.data(), batch.size * c.num_dense) +
                                count_non_finite(batch.labels.data(), batch.size))
      return status::invalid_argument(
          step_label(m.pass, s.progress.step + 1, m.steps + 1) + ": shard " + paths[current_shard] +
          ": the batch holds " + std::to_string(bad) +
          " non-finite dense features or labels; the run stops before training on it");
    double loss = 0;
    EMBCACHE_RETURN_IF_ERROR(s.train_step(batch, m.pass, m.steps + 1, &loss));
    take_activity();
    loss_sum += loss;
    interval_loss += loss;
    ++m.steps;
    ++interval_steps;
    m.samples += batch.size;
    interval_samples += batch.size;
    if (c.log_interval > 0 && interval_steps == c.log_interval) {
      const double secs = seconds_since(ti);
      const std::uint64_t lookups = interval.hits + interval.misses;
      // Keyset mode swaps once per shard: between swaps the line repeats the last swap's rate.
      if (lookups) {
        char r[32];
        rate_value = double(interval.hits) / double(lookups);
        std::snprintf(r, sizeof r, "%.4f", rate_value);
        rate = r;
      } else if (!s.path->has_cache()) {
        rate = "n/a (no cache)";
      }
      detail::training_progress p;
      p.pass = m.pass;
      p.passes = s.progress.run_last_pass;
      p.step = s.progress.step;
      p.pass_done = m.samples;
      p.pass_total = pass_total;
      p.pass_seconds = seconds_since(t0);
      p.run_done = s.progress.run_done + m.samples;
      p.run_total = s.progress.run_total;
      p.run_seconds = seconds_since(s.progress.run_t0);
      p.loss = interval_loss / double(interval_steps);
      p.hit_rate = rate;
      s.log(detail::training_progress_line(p));
      if (s.leader() && !c.output_dir.empty()) {
        detail::step_metrics sm;
        sm.step = s.progress.step;
        sm.pass = m.pass;
        sm.pass_position =
            double(m.pass - 1) + (pass_total ? double(m.samples) / double(pass_total) : 1.0);
        sm.samples = s.progress.samples + m.samples;
        sm.train_loss = p.loss;
        sm.samples_per_s = secs > 0 ? double(interval_samples) / secs : 0.0;
        sm.hit_rate = rate_value;  // the log line's value (the last swap's between swaps)
        EMBCACHE_RETURN_IF_ERROR(create_folder(c.output_dir, "config.output_dir"));
        EMBCACHE_RETURN_IF_ERROR(detail::append_step_metrics(c.output_dir, sm));
      }
      whole.hits += interval.hits;
      whole.misses += interval.misses;
      interval.hits = interval.misses = 0;
      interval_loss = 0;
      interval_steps = interval_samples = 0;
      ti = clock_type::now();
    }
  }
  m.seconds = seconds_since(t0);
  s.progress.run_done += m.samples;
  whole.hits += interval.hits;
  whole.misses += interval.misses;
  s.progress.samples += m.samples;
  m.train_loss = m.steps ? loss_sum / double(m.steps) : std::nan("");
  m.samples_per_s = m.seconds > 0 ? double(m.samples) / m.seconds : 0.0;
  const table_counters after = detail::sum_of_tables(s.path->counters().total);
  m.rows_in = after.misses - before.misses;
  m.rows_out = after.rows_pushed - before.rows_pushed;
  m.swap_seconds = whole.blocked_seconds;
  const std::uint64_t lookups = whole.hits + whole.misses;
  m.hit_rate = lookups ? double(whole.hits) / double(lookups) : std::nan("");
  // The last step's update is seen by no loss: check the dense state before anything reads,
  // exports or saves it.
  if (!detail::dense_blob_finite(s.model->save()))
    return s.diverge("pass " + std::to_string(m.pass) + " step " + std::to_string(s.progress.step) +
                         " (the pass's last step)",
                     "the dense weights or their Adam state are not finite");
  ++s.progress.passes_done;
  if (!c.eval_shard.empty()) {
    auto e = evaluate();
    if (!e.ok()) return e.get_status();
    m.eval_auc = e.value().auc;
    m.eval_logloss = e.value().logloss;
  } else {
    m.eval_auc = m.eval_logloss = std::nan("");
  }
  if (!c.export_dir.empty()) {
    auto ex = export_incremental();
    if (!ex.ok()) return ex.get_status();
    m.export_path = ex.value().first;
    m.rows_exported = ex.value().second;
  }
  s.progress.history.push_back(m);
  s.log(detail::pass_summary_line(m));
  if (s.leader() && !c.output_dir.empty()) {
    EMBCACHE_RETURN_IF_ERROR(create_folder(c.output_dir, "config.output_dir"));
    EMBCACHE_RETURN_IF_ERROR(detail::append_pass_metrics(c.output_dir, m));
  }
  return m;
}

status trainer::impl::predict_batch(const shard_batch& b, std::size_t n) {
  if (comm != nullptr) return predict_batch_sharded(b, n);
  const std::size_t ws = num_wide_slots, ds = config.num_slots;
  const std::size_t dim = config.tables[roles.deep].dim;
  fill_keys(b, 0, n);
  scratch.in_wide.assign(n * ws, 0.0f);
  scratch.in_deep.assign(n * ds * dim, 0.0f);
  for (const detail::table_read& p :
       {detail::table_read{roles.wide, scratch.wide_keys.data(), n * ws, 1, scratch.in_wide.data()},
        detail::table_read{roles.deep, b.keys.data(), n * ds, dim, scratch.in_deep.data()}})
    EMBCACHE_RETURN_IF_ERROR(read_embeddings(p));
  model->predict({n, scratch.in_wide.data(), scratch.in_deep.data(), b.dense.data(), nullptr},
                 scratch.logits);
  return {};
}

// One-hot slots: each pooled value is the key's row, or zeros for a key never trained.
status trainer::impl::read_embeddings(const detail::table_read& p) {
  const std::size_t width = path->row_width(p.table);
  scratch.rows_buf.resize(p.count * width);
  bool* found = scratch.found(p.count);
  EMBCACHE_RETURN_IF_ERROR(path->read(p.table, p.keys, p.count, scratch.rows_buf.data(), found));
  for (std::size_t i = 0; i < p.count; ++i)
    if (found[i])
      std::copy(scratch.rows_buf.begin() + i * width, scratch.rows_buf.begin() + i * width + p.dim,
                p.out + i * p.dim);
  return {};
}

result<eval_metrics> trainer::evaluate(const std::string& shard) {
  impl& s = *impl_;
  const trainer_config& c = s.config;
  const std::string path = resolve_data_path(c.data_dir, shard.empty() ? c.eval_shard : shard);
  if (path.empty()) return status::invalid_argument("config.eval_shard: no shard to evaluate on");
  shard_reader_options ro;
  ro.batch_size = c.batch_size;
  ro.read_ahead = false;
  ro.num_dense = c.num_dense;
  ro.num_slots = c.num_slots;
  auto reader = shard_reader::open({path}, ro);
  if (!reader.ok()) return reader.get_status().with_context("eval shard");
  if (c.crossed && reader.value()->num_crossed() < criteo_cross_count)
    return status::invalid_argument("config.eval_shard: " + path + " has no crossed keys");
  metric_accumulator acc;
  shard_batch b;
  std::uint64_t total = reader.value()->total_rows();
  if (c.eval_max_samples > 0) total = std::min<std::uint64_t>(total, c.eval_max_samples);
  detail::progress_meter meter(total);
  for (;;) {
    if (meter.due(acc.size()))
      s.log("evaluation on " + path + ": " + meter.count_text(acc.size(), "samples"));
    EMBCACHE_RETURN_IF_ERROR(reader.value()->next(b));
    if (b.size == 0) break;
    std::size_t n = b.size;
    if (c.eval_max_samples > 0) n = std::min<std::size_t>(n, c.eval_max_samples - acc.size());
    const std::string where = "pass " + std::to_string(s.progress.passes_done) + " step " +
                              std::to_string(s.progress.step) + ", evaluation on " + path;
    const std::string samples =
        "samples " + std::to_string(acc.size()) + ".." + std::to_string(acc.size() + n - 1);
    if (const std::size_t bad = count_non_finite(b.dense.data(), n * c.num_dense) +
                                count_non_finite(b.labels.data(), n))
      return status::invalid_argument(where + ": " + samples + " hold " + std::to_string(bad) +
                                      " non-finite dense features or labels");
    EMBCACHE_RETURN_IF_ERROR(s.predict_batch(b, n));
    if (const std::size_t bad = count_non_finite(s.scratch.logits.data(), n))
      return s.diverge(where, std::to_string(bad) + " of the " + std::to_string(n) + " logits of " +
                                  samples + " are not finite");
    acc.add(s.scratch.logits.data(), b.labels.data(), n);
    if (c.eval_max_samples > 0 && acc.size() >= c.eval_max_samples) break;
  }
  eval_metrics e;
  e.samples = acc.size();
  e.auc = acc.auc();
  e.logloss = acc.log_loss();
  // Finite logits give a finite log loss; AUC may be NaN only for a single class.
  if (e.samples > 0 && !std::isfinite(e.logloss))
    return s.diverge("pass " + std::to_string(s.progress.passes_done) + " step " +
                         std::to_string(s.progress.step) + ", evaluation on " + path,
                     "the log loss is not finite");
  return e;
}

result<std::pair<std::string, std::uint64_t>> trainer::export_incremental() {
  impl& s = *impl_;
  if (!s.notes.diverged.ok()) return s.notes.diverged;
  EMBCACHE_RETURN_IF_ERROR(create_folder(s.config.export_dir, "config.export_dir"));
  auto d = s.path->export_incremental_to(s.config.export_dir, s.config.export_with_state);
  if (!d.ok()) return d.get_status();
  return std::make_pair(d.value().path, d.value().rows);
}

}  // namespace embcache
