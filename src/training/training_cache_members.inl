// The public members of training_cache<Key, Space> (include/embcache/training_cache.hpp): the
// constructor, which resolves each table's options into its table_state, and thin entry points
// into the core's operations, defined in the other files of src/training.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>

#include "embcache/host_store.hpp"
#include "embcache/training_cache.hpp"
#include "training/training_cache_core.hpp"

namespace embcache {

namespace detail {
// Runs the body of a public call that returns a status (or a result): an exception escaping it (a
// CUDA failure, which the space code throws by design, or a failed allocation) becomes the status
// it stands for, named after the call, never an exception out of the call. Misuse is checked
// before, outside the body, and still throws.
template <class F>
auto public_call(const char* call, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::exception& e) {
    return status_of(e).with_context(std::string("training_cache::") + call);
  }
}

// move_staged_rows: the spare rows of a table's cache, its share of staging_bytes (tables in
// order, as prefetch() shares the staging), at most twice its capacity (a keyset's rows moved in
// and as many leavers moved out); `*left` the bytes still unshared.
inline std::size_t spare_rows_of(bool moved, std::size_t capacity, std::size_t row_bytes,
                                 std::size_t* left) {
  if (!moved) return 0;
  const std::size_t rows =
      std::min(capacity > SIZE_MAX / 2 ? capacity : 2 * capacity, *left / row_bytes);
  *left -= rows * row_bytes;
  return rows;
}
}  // namespace detail

template <class Key, class Space>
training_cache<Key, Space>::training_cache(training_cache_options options,
                                           std::vector<table_options<Key>> tables, Space space)
    : core_(std::make_unique<detail::training_cache_core<Key, Space>>()) {
  core_->options = options;
  if constexpr (is_cuda_space_v<Space>) {
    if (!cuda_device_available()) {
      throw error(status_code::unsupported, "training_cache: the cuda space needs a CUDA device");
    }
    core_->device = detail::cuda_current_device();
  }
  if (tables.empty()) throw error(status_code::invalid_argument, "training_cache: no tables");
  std::unordered_set<std::string> names;
  std::size_t unshared = options.staging_bytes;  // move_staged_rows: spare rows still to share
  for (std::size_t t = 0; t < tables.size(); ++t) {
    auto& o = tables[t];
    const std::string who = "training_cache: table " + std::to_string(t) + " '" + o.name + "'";
    if (o.name.empty() || !names.insert(o.name).second) {
      throw error(status_code::invalid_argument, who + ": empty or repeated name");
    }
    if (o.dim == 0 || o.capacity == 0) {
      throw error(status_code::invalid_argument, who + ": dim and capacity must be >= 1");
    }
    check_options(o.optimizer).with_context(who).throw_if_error();
    if (!(o.expiry.min_l2_norm >= 0) || !std::isfinite(o.expiry.min_l2_norm)) {
      throw error(status_code::invalid_argument,
                  who + ": expiry.min_l2_norm must be a finite number >= 0");
    }
    if (o.expiry.ttl_steps > max_ttl_steps) {
      throw error(status_code::invalid_argument,
                  who + ": expiry.ttl_steps " + std::to_string(o.expiry.ttl_steps) +
                      " is above max_ttl_steps (" + std::to_string(max_ttl_steps) + ")");
    }
    detail::table_state<Key, Space> tb;
    tb.index = t;
    tb.state_width = state_width(o.optimizer.kind, o.dim);
    tb.row_width = o.dim + tb.state_width;
    cache_options co;
    std::uint64_t asked = 0;
    if (!table_slots(o.capacity, o.slots, &asked))
      throw error(status_code::invalid_argument,
                  who + ": capacity " + std::to_string(o.capacity) + " is too large");
    co.slots = static_cast<std::size_t>(asked);
    co.dim = o.dim;
    co.state_width = tb.state_width;
    co.init = o.init;
    co.init.seed = detail::fold_seed(o.init.seed, t);
    co.init.state_value = initial_state_value(o.optimizer);
    co.scores = o.scores;
    co.spare_rows =
        detail::spare_rows_of(resolved_move_staged_rows<Space>(options), o.capacity, tb.row_width * sizeof(float), &unshared);
    tb.cache = std::make_unique<cache_type>(co, space);
    if (co.spare_rows > 0) {
      std::vector<std::int64_t> free(co.spare_rows);
      for (std::size_t r = 0; r < free.size(); ++r)
        free[r] = static_cast<std::int64_t>(tb.cache->slots() + r);
      tb.free_rows = buffer<std::int64_t, Space>(free.size(), space);
      tb.free_rows.copy_from_host(free.data(), free.size());
    }
    tb.bridge = detail::device_cache_bridge<Key, Space>(tb.cache.get());
    const std::size_t slots = tb.cache->slots();
    // Default: the slack of the default slots (capacity / 8 above capacity, 90% of capacity * 5 /
    // 4), never more than 90% of the slots (a user who asked for more slots for short probing
    // keeps them short).
    tb.max_resident = o.max_resident
                          ? o.max_resident
                          : std::max(o.capacity, std::min(slots / 10 * 9, o.capacity / 8 * 9));
    if (tb.max_resident < o.capacity || tb.max_resident > slots) {
      throw error(status_code::invalid_argument,
                  who + ": max_resident " + std::to_string(tb.max_resident) +
                      " must lie between the capacity " + std::to_string(o.capacity) +
                      " and the table's slots " + std::to_string(slots));
    }
    if (o.store) {
      if (o.store->row_width() != tb.row_width) {
        throw error(status_code::invalid_argument,
                    who + ": store row width " + std::to_string(o.store->row_width()) +
                        " differs from dim + state width " + std::to_string(tb.row_width));
      }
      tb.sync.store = o.store;
    } else {
      host_store_options ho;
      ho.table_name = o.name;
      ho.row_width = tb.row_width;
      tb.sync.store = std::make_shared<host_store<Key>>(ho);
    }
    // Versions of rows already in the store stay below every version the cache hands out.
    tb.cache->advance_version(tb.sync.store->max_version());
    tb.exports.last_version = tb.sync.store->max_version();
    check_admission_options(o.admission, who + ": admission").throw_if_error();
    tb.admission = admission_sketch(o.admission);
    tb.opt = std::move(o);
    core_->tables.push_back(std::move(tb));
    core_->counters.tables.push_back(core_->tables.back().opt.name);
  }
  core_->counters.last.resize(tables.size());
  core_->counters.total.resize(tables.size());
}

template <class Key, class Space>
training_cache<Key, Space>::~training_cache() {
  if (core_) {
    core_->worker.join();
    core_->flusher.join();
  }
}

template <class Key, class Space>
std::size_t training_cache<Key, Space>::num_tables() const noexcept {
  return core_->tables.size();
}

template <class Key, class Space>
result<std::size_t> training_cache<Key, Space>::table_index(const std::string& name) const {
  for (std::size_t t = 0; t < core_->tables.size(); ++t) {
    if (core_->tables[t].opt.name == name) return t;
  }
  return status::not_found("no table named '" + name + "'");
}

template <class Key, class Space>
const table_options<Key>& training_cache<Key, Space>::table(std::size_t t) const {
  return core_->tables.at(t).opt;
}
template <class Key, class Space>
std::size_t training_cache<Key, Space>::row_width(std::size_t t) const {
  return core_->tables.at(t).row_width;
}
template <class Key, class Space>
typename training_cache<Key, Space>::cache_type& training_cache<Key, Space>::cache(std::size_t t) {
  return *core_->tables.at(t).cache;
}
template <class Key, class Space>
param_store<Key>& training_cache<Key, Space>::store(std::size_t t) {
  auto& tb = core_->tables.at(t);
  core_->wait_worker();  // its early evictions push to the store
  // A failed push keeps its rows pending; the next call returning a status reports it. So does
  // a push that throws, here or in the flusher (whose failure is left for that call to report):
  // nothing escapes a call that cannot return a status.
  if (!core_->flusher.failed()) {
    (void)detail::public_call("store", [&] { return core_->finish_write_behind(); });
  }
  return *tb.sync.store;
}
template <class Key, class Space>
const cache_counters& training_cache<Key, Space>::counters() const noexcept {
  return core_->counters;
}
template <class Key, class Space>
const training_cache_options& training_cache<Key, Space>::options() const noexcept {
  return core_->options;
}
template <class Key, class Space>
const std::string& training_cache<Key, Space>::run_id() const noexcept {
  return core_->run_id;
}
template <class Key, class Space>
status training_cache<Key, Space>::set_run_id(const std::string& id) {
  if (!detail::is_run_id(id))
    return status::invalid_argument("training_cache::set_run_id: '" + id +
                                    "' is not a run identity (32 lowercase hex digits)");
  core_->run_id = id;
  return {};
}

template <class Key, class Space>
status training_cache<Key, Space>::begin_pass(const std::vector<std::vector<Key>>& keysets) {
  if (core_->options.mode != cache_mode::keyset) {
    throw error(status_code::invalid_argument, "begin_pass needs cache_mode::keyset");
  }
  return detail::public_call("begin_pass", [&] { return core_->begin_pass(keysets); });
}

template <class Key, class Space>
status training_cache<Key, Space>::begin_pass_in_stores(
    const std::vector<std::vector<Key>>& keysets, std::vector<std::vector<Key>>* refused_out) {
  if (core_->options.mode != cache_mode::keyset) {
    throw error(status_code::invalid_argument, "begin_pass_in_stores needs cache_mode::keyset");
  }
  if (refused_out == nullptr) {
    throw error(status_code::invalid_argument, "begin_pass_in_stores: refused_out is null");
  }
  return detail::public_call("begin_pass_in_stores",
                             [&] { return core_->begin_pass_in_stores(keysets, refused_out); });
}

namespace detail {
// One keyset per file, in the given format; the first read error is returned.
template <class Key>
status read_keysets(const std::vector<std::string>& paths, keyset_format fmt,
                    std::vector<std::vector<Key>>* out) {
  out->clear();
  for (const auto& p : paths) {
    auto ks = read_keyset<Key>(p, fmt);
    if (!ks.ok()) return ks.get_status();
    out->push_back(std::move(ks).value());
  }
  return {};
}
}  // namespace detail

template <class Key, class Space>
status training_cache<Key, Space>::begin_pass_files(const std::vector<std::string>& paths) {
  std::vector<std::vector<Key>> ks;
  EMBCACHE_RETURN_IF_ERROR(detail::public_call(
      "begin_pass_files", [&] { return detail::read_keysets(paths, core_->options.keyset_fmt, &ks); }));
  return begin_pass(ks);
}

template <class Key, class Space>
status training_cache<Key, Space>::prefetch(const std::vector<std::vector<Key>>& keysets) {
  return detail::public_call("prefetch", [&] { return core_->prefetch(keysets); });
}

template <class Key, class Space>
status training_cache<Key, Space>::prefetch_files(const std::vector<std::string>& paths) {
  std::vector<std::vector<Key>> ks;
  EMBCACHE_RETURN_IF_ERROR(detail::public_call(
      "prefetch_files", [&] { return detail::read_keysets(paths, core_->options.keyset_fmt, &ks); }));
  return prefetch(ks);
}

template <class Key, class Space>
bool training_cache<Key, Space>::prefetch_pending() const noexcept {
  return core_->staged_valid;
}

template <class Key, class Space>
status training_cache<Key, Space>::lookup(std::size_t t, const Key* keys, std::size_t n,
                                          std::int64_t* slots_out) {
  if (core_->options.mode != cache_mode::on_demand) {
    throw error(status_code::invalid_argument, "lookup needs cache_mode::on_demand");
  }
  auto& tb = core_->tables.at(t);
  return detail::public_call("lookup", [&]() -> status {
    EMBCACHE_RETURN_IF_ERROR(core_->finish_write_behind());
    std::lock_guard<std::mutex> lock(*tb.sync.install_mutex);
    ++tb.book.residency;
    return core_->lookup(tb, keys, n, slots_out);
  });
}

template <class Key, class Space>
status training_cache<Key, Space>::count_sightings(std::size_t t, const Key* keys, std::size_t n) {
  auto& tb = core_->tables.at(t);
  return detail::public_call("count_sightings",
                             [&] { return core_->count_sightings(tb, keys, n); });
}

template <class Key, class Space>
status training_cache<Key, Space>::assign(std::size_t t, const Key* keys, std::size_t n,
                                          const float* rows) {
  auto& tb = core_->tables.at(t);
  return detail::public_call("assign", [&]() -> status {
    std::lock_guard<std::mutex> lock(*tb.sync.install_mutex);
    std::vector<std::int64_t> slots(n);
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.lookup_slots(keys, n, slots.data()));
    for (std::size_t i = 0; i < n; ++i) {
      if (slots[i] < 0) {
        return status::not_found("assign: key " + std::to_string(keys[i]) +
                                 " is not resident in table '" + tb.opt.name + "'");
      }
    }
    return tb.bridge.assign_slots(slots.data(), n, rows);
  });
}

template <class Key, class Space>
status training_cache<Key, Space>::read(std::size_t t, const Key* keys, std::size_t n,
                                        float* rows_out, bool* found_out) {
  auto& tb = core_->tables.at(t);
  return detail::public_call("read", [&]() -> status {
    // Slots found here must not change owner before they are read.
    std::lock_guard<std::mutex> lock(*tb.sync.install_mutex);
    std::vector<std::int64_t> slots(n);
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.lookup_slots(keys, n, slots.data()));
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.read_slots(slots.data(), n, rows_out));
    bool all_resident = true;
    for (std::size_t i = 0; i < n && all_resident; ++i) all_resident = slots[i] >= 0;
    // A row that left at the last boundary may still be on its way to the store.
    if (!all_resident) EMBCACHE_RETURN_IF_ERROR(core_->finish_write_behind());
    std::vector<Key> rest;
    std::vector<std::size_t> at;
    for (std::size_t i = 0; i < n; ++i) {
      if (found_out) found_out[i] = slots[i] >= 0;
      if (slots[i] < 0) {
        rest.push_back(keys[i]);
        at.push_back(i);
      }
    }
    if (rest.empty()) return {};
    const std::size_t w = tb.row_width;
    std::vector<float> r(rest.size() * w);
    std::unique_ptr<bool[]> f(new bool[rest.size()]);
    EMBCACHE_RETURN_IF_ERROR(core_->pull(tb, rest.data(), rest.size(), r.data(), f.get(), nullptr));
    for (std::size_t i = 0; i < rest.size(); ++i) {
      if (f[i]) std::memcpy(rows_out + at[i] * w, r.data() + i * w, w * sizeof(float));
      if (found_out) found_out[at[i]] = f[i];
    }
    return {};
  });
}

template <class Key, class Space>
status training_cache<Key, Space>::erase(std::size_t t, const Key* keys, std::size_t n) {
  auto& tb = core_->tables.at(t);
  return detail::public_call("erase", [&]() -> status {
    std::lock_guard<std::mutex> lock(*tb.sync.install_mutex);
    // A pending write-behind of these keys must not land after the erase and revive them.
    EMBCACHE_RETURN_IF_ERROR(core_->finish_write_behind());
    ++tb.book.residency;
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.erase(keys, n));
    {
      std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
      if (tb.sync.log_writes) tb.sync.writes_log.insert(tb.sync.writes_log.end(), keys, keys + n);
      EMBCACHE_RETURN_IF_ERROR(tb.sync.store->erase(keys, n));
    }
    tb.exports.erased.insert(tb.exports.erased.end(), keys, keys + n);
    return {};
  });
}

template <class Key, class Space>
void training_cache<Key, Space>::begin_step() {
  for (auto& tb : core_->tables) {
    const std::uint64_t ttl = tb.opt.expiry.ttl_steps;
    if (ttl == 0) continue;
    // The prefetch worker installs rows (and moves the clock) under this lock.
    std::lock_guard<std::mutex> lock(*tb.sync.install_mutex);
    if (tb.cache->size() == 0) {
      // A table kept in its store (host-hybrid): its rows carry the store's versions.
      std::lock_guard<std::mutex> store_lock(*tb.sync.store_mutex);
      tb.cache->advance_version(tb.sync.store->max_version());
    }
    expiry_clock& c = tb.expiry;
    ++c.steps;
    c.step_versions.push_back(tb.cache->version());
    // Trimmed to the last ttl values when twice that many: amortized O(1) a step.
    if (c.step_versions.size() >= 2 * ttl) detail::trim_step_versions(c, ttl);
  }
}

template <class Key, class Space>
status training_cache<Key, Space>::expire() {
  if (core_->options.mode != cache_mode::on_demand) {
    throw error(status_code::invalid_argument,
                "expire needs cache_mode::on_demand (begin_pass is the boundary in keyset mode)");
  }
  return detail::public_call("expire", [&] { return core_->expire_all(); });
}

template <class Key, class Space>
status training_cache<Key, Space>::end_training() {
  return detail::public_call("end_training", [&]() -> status {
    auto& im = *core_;
    // No early eviction of the worker may push after the flush.
    im.wait_worker();
    EMBCACHE_RETURN_IF_ERROR(im.finish_write_behind());
    for (auto& tb : im.tables) {
      im.counters.total[tb.index] += tb.worker_counters;
      tb.worker_counters = {};
      std::vector<Key> rk;
      std::vector<std::uint64_t> rv;
      EMBCACHE_RETURN_IF_ERROR(im.residents(tb, &rk, &rv));
      EMBCACHE_RETURN_IF_ERROR(im.write_back(tb, rk, false, im.counters.total[tb.index]));
      std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
      EMBCACHE_RETURN_IF_ERROR(tb.sync.store->flush());
    }
    return {};
  });
}

template <class Key, class Space>
result<std::vector<table_delta<Key>>> training_cache<Key, Space>::export_incremental(
    bool with_state) {
  return detail::public_call(
      "export_incremental", [&]() -> result<std::vector<table_delta<Key>>> {
        std::vector<detail::export_mark> marks;
        auto out = core_->collect_deltas(with_state, &marks);
        if (out.ok()) core_->commit_deltas(marks);
        return out;
      });
}

template <class Key, class Space>
result<std::string> training_cache<Key, Space>::export_incremental_to(const std::string& dir,
                                                                      bool with_state,
                                                                      std::uint64_t number) {
  return detail::public_call("export_incremental_to",
                             [&] { return core_->export_to_folder(dir, with_state, number); });
}

template <class Key, class Space>
status training_cache<Key, Space>::save(const std::string& dir, const save_progress& on_progress) {
  core_->wait_worker();  // the store must not change between the write-back and the save
  EMBCACHE_RETURN_IF_ERROR(end_training());
  return detail::public_call("save", [&] { return core_->save(dir, on_progress); });
}

template <class Key, class Space>
status training_cache<Key, Space>::load(const std::string& dir, const load_options& options) {
  return detail::public_call("load", [&] { return core_->load(dir, options); });
}

template <class Key, class Space>
status training_cache<Key, Space>::adopt_stores() {
  return core_->adopt_stores();
}

template <class Key, class Space>
status training_cache<Key, Space>::adopt_store_writes() {
  return detail::public_call("adopt_store_writes", [&] { return core_->adopt_store_writes(); });
}

template <class Key, class Space>
std::vector<std::uint32_t> training_cache<Key, Space>::admission_state(std::size_t t) const {
  return core_->tables.at(t).admission.to_words();
}

template <class Key, class Space>
void training_cache<Key, Space>::default_row(std::size_t t, std::uint64_t slot, float* out) const {
  const table_options<Key>& o = core_->tables.at(t).opt;
  if (!o.admission.enabled() || o.admission.default_row == embcache::refused_row::zeros) {
    std::fill(out, out + o.dim, 0.0f);
    return;
  }
  initializer_options init = o.init;
  init.seed = detail::fold_seed(o.init.seed, t);
  slot_default_row(init, slot, o.dim, out);
}

template <class Key, class Space>
expiry_clock training_cache<Key, Space>::expiry_state(std::size_t t) const {
  const auto& tb = core_->tables.at(t);
  expiry_clock c = tb.expiry;
  detail::trim_step_versions(c, tb.opt.expiry.ttl_steps);
  return c;
}

template <class Key, class Space>
status training_cache<Key, Space>::restore_lifetime(std::size_t t,
                                                    const std::vector<std::uint32_t>& admission,
                                                    const expiry_clock& clock,
                                                    const std::string& origin) {
  return detail::public_call("restore_lifetime", [&]() -> status {
    if (t >= core_->tables.size()) {
      return status::invalid_argument("restore_lifetime: table " + std::to_string(t) + " of " +
                                      std::to_string(core_->tables.size()));
    }
    auto& tb = core_->tables[t];
    const bool counts = tb.admission.enabled() && !admission.empty();
    if (counts) {
      EMBCACHE_RETURN_IF_ERROR(tb.admission.check_words(admission.data(), admission.size(), origin)
                                   .with_context("restore_lifetime"));
    }
    const bool expires = tb.opt.expiry.enabled();
    if (expires && (clock.versions.size() > clock.boundaries ||
                    !std::is_sorted(clock.versions.begin(), clock.versions.end()))) {
      return status::invalid_argument("restore_lifetime: the expiry clock of table '" +
                                      tb.opt.name + "' from '" + origin + "' has " +
                                      std::to_string(clock.versions.size()) +
                                      " pass versions for " + std::to_string(clock.boundaries) +
                                      " boundaries (expected at most one per boundary, "
                                      "non-decreasing)");
    }
    if (expires && (clock.step_versions.size() > clock.steps ||
                    !std::is_sorted(clock.step_versions.begin(), clock.step_versions.end()))) {
      return status::invalid_argument("restore_lifetime: the expiry clock of table '" +
                                      tb.opt.name + "' from '" + origin + "' has " +
                                      std::to_string(clock.step_versions.size()) +
                                      " step versions for " + std::to_string(clock.steps) +
                                      " steps (expected at most one per step, non-decreasing)");
    }
    core_->wait_worker();  // a running prefetch reads the sketch
    core_->drop_staging();
    tb.admission.clear();
    if (counts) {
      EMBCACHE_RETURN_IF_ERROR(tb.admission.from_words(admission.data(), admission.size(), origin)
                                   .with_context("restore_lifetime"));
    }
    tb.expiry = expires ? clock : expiry_clock{};
    if (expires && !clock.versions.empty()) tb.cache->advance_version(clock.versions.back());
    if (expires && !clock.step_versions.empty())
      tb.cache->advance_version(clock.step_versions.back());
    return {};
  });
}

template <class Key, class Space>
status training_cache<Key, Space>::set_slot_ids(std::size_t t, const Key* keys,
                                                const std::uint64_t* slot_ids, std::size_t n) {
  return detail::public_call("set_slot_ids", [&]() -> status {
    if (t >= core_->tables.size()) {
      return status::invalid_argument("set_slot_ids: table " + std::to_string(t) + " of " +
                                      std::to_string(core_->tables.size()));
    }
    auto& ids = core_->tables[t].slot_ids;
    for (std::size_t i = 0; i < n; ++i) ids[keys[i]] = slot_ids[i];
    return {};
  });
}

template <class Key, class Space>
result<std::uint64_t> training_cache<Key, Space>::slot_id(std::size_t t, Key key) const {
  if (t >= core_->tables.size()) {
    return status::not_found("slot_id: table " + std::to_string(t) + " of " +
                             std::to_string(core_->tables.size()));
  }
  const auto& tb = core_->tables[t];
  const auto it = tb.slot_ids.find(key);
  if (it != tb.slot_ids.end()) return it->second;
  if (tb.opt.slot_of) return tb.opt.slot_of(key);
  return status::not_found("slot_id: key " + std::to_string(key) + " of table '" + tb.opt.name +
                           "' has no slot id");
}

}  // namespace embcache
