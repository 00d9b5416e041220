// The configuration a run uses: dataset passes expanded into their shards and capacities "auto"
// computed from the datasets' manifest.json.
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "embcache/shard.hpp"
#include "embcache/trainer/trainer.hpp"
#include "trainer_impl.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;

// The manifests read so far, by folder (each is read once per resolution).
class manifests {
 public:
  const result<dataset_summary>& of(const std::string& folder) {
    auto it = cache_.find(folder);
    if (it == cache_.end()) it = cache_.emplace(folder, read_dataset_manifest(folder)).first;
    return it->second;
  }

 private:
  std::map<std::string, result<dataset_summary>> cache_;
};

std::string table_at(std::size_t t) { return "config.tables[" + std::to_string(t) + "].capacity"; }

// The keyset size of `table` for one shard: slot keys (deep), plus crossed keys for the wide
// table when `crossed` (trainer.cpp forms the wide keyset by merging the two).
result<std::uint64_t> keyset_size(const trainer_config& c, std::size_t t, const std::string& shard,
                                  manifests& known) {
  const std::string at = table_at(t);
  const fs::path path(resolve_data_path(c.data_dir, shard));
  const std::string folder = path.parent_path().empty() ? "." : path.parent_path().string();
  const result<dataset_summary>& m = known.of(folder);
  if (!m.ok()) {
    return m.get_status().with_context(at + ": \"auto\" reads the keyset sizes of shard '" +
                                       path.string() + "' from its folder's manifest.json");
  }
  const std::string manifest = (fs::path(folder) / "manifest.json").string();
  const auto& shards = m.value().shards;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (fs::path(shards[i].shard).filename() != path.filename()) continue;
    if (!shards[i].has_key_counts) {
      return status::invalid_argument(
          at + ": \"auto\" needs field shards[" + std::to_string(i) + "].keys of '" + manifest +
          "', which has no keyset sizes (a dataset written before they were recorded: prepare it "
          "again, or give the capacity as a number)");
    }
    std::uint64_t n = shards[i].keys;
    if (c.tables[t].name == "wide" && c.crossed &&
        __builtin_add_overflow(n, shards[i].crossed_keys, &n)) {
      return status::invalid_argument(at + ": the keyset sizes of shard '" + path.string() +
                                      "' add up to more than 2^64");
    }
    return n;
  }
  return status::invalid_argument(at + ": \"auto\" needs the keyset size of shard '" +
                                  path.string() + "', which '" + manifest + "' does not list");
}

// The rows table `t`'s log store may come to hold (tables[i].store_rows 0): per dataset folder of
// the passes' shards, its unique keys when its manifest counted them, else the sum of those
// shards' keyset sizes; at most 2^40. 0 when a folder has neither.
std::uint64_t log_rows_of(const trainer_config& c, std::size_t t, manifests& known) {
  constexpr std::uint64_t most = std::uint64_t{1} << 40;
  const bool wide_crossed = c.tables[t].name == "wide" && c.crossed;
  std::set<std::string> counted;
  std::uint64_t rows = 0;
  const auto add = [&](std::uint64_t n) { rows = std::min(most, rows + std::min(most, n)); };
  for (const trainer_pass_config& pass : c.passes) {
    for (const std::string& shard : pass.shards) {
      const fs::path path(resolve_data_path(c.data_dir, shard));
      const std::string folder = path.parent_path().empty() ? "." : path.parent_path().string();
      const result<dataset_summary>& m = known.of(folder);
      if (!m.ok()) return 0;
      if (m.value().has_unique_stats) {
        if (!counted.insert(folder).second) continue;
        for (const std::uint64_t n : m.value().unique_keys) add(n);
        if (wide_crossed) add(m.value().unique_crossed_keys);
        continue;
      }
      auto n = keyset_size(c, t, shard, known);
      if (!n.ok()) return 0;
      add(n.value());
    }
  }
  return rows;
}

}  // namespace

std::string resolve_data_path(const std::string& data_dir, const std::string& path) {
  if (data_dir.empty() || path.empty() || path[0] == '/') return path;
  return data_dir + "/" + path;
}

result<trainer_config> resolve_trainer_config(const trainer_config& given) {
  EMBCACHE_RETURN_IF_ERROR(validate(given));
  trainer_config c = given;
  manifests known;
  // The samples' shape: the first dataset's schema, every other dataset must share it; without a
  // dataset, the first training shard's header when it can be read (the reader reports the rest).
  std::string shape_from;
  for (std::size_t p = 0; p < c.passes.size(); ++p) {
    trainer_pass_config& pass = c.passes[p];
    if (pass.dataset.empty()) continue;
    const std::string at = "config.passes[" + std::to_string(p) + "].dataset";
    const std::string folder = resolve_data_path(c.data_dir, pass.dataset);
    const result<dataset_summary>& m = known.of(folder);
    if (!m.ok()) return m.get_status().with_context(at);
    if (m.value().shards.empty()) {
      return status::invalid_argument(at + ": dataset '" + folder + "' holds no shards");
    }
    const dataset_schema& schema = m.value().schema;
    if (shape_from.empty()) {
      shape_from = folder;
      c.num_dense = schema.num_dense();
      c.num_slots = schema.num_categorical();
    } else if (c.num_dense != schema.num_dense() || c.num_slots != schema.num_categorical()) {
      return status::invalid_argument(
          at + ": dataset '" + folder + "' has " + std::to_string(schema.num_dense()) +
          " dense and " + std::to_string(schema.num_categorical()) +
          " categorical fields, dataset '" + shape_from + "' " + std::to_string(c.num_dense) +
          " and " + std::to_string(c.num_slots) + "; a run trains one schema");
    }
    // Paths as the dataset was named: relative to data_dir when it is.
    for (const shard_files& f : m.value().shards)
      pass.shards.push_back((fs::path(pass.dataset) / fs::path(f.shard).filename()).string());
    pass.dataset.clear();
  }
  if (shape_from.empty() && !c.passes.empty() && !c.passes[0].shards.empty()) {
    auto h = read_shard_header(resolve_data_path(c.data_dir, c.passes[0].shards[0]));
    if (h.ok()) {
      c.num_dense = h.value().num_dense;
      c.num_slots = h.value().num_slots;
    }
  }
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    trainer_table_config& tc = c.tables[t];
    if (!tc.capacity_auto) continue;
    std::uint64_t largest = 1;
    for (const trainer_pass_config& pass : c.passes) {
      for (const std::string& shard : pass.shards) {
        auto n = keyset_size(c, t, shard, known);
        if (!n.ok()) return n.get_status();
        largest = std::max(largest, n.value());
      }
    }
    tc.capacity = largest;
    tc.capacity_auto = false;
  }
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    if (c.tables[t].store == "log" && c.tables[t].store_rows == 0)
      c.tables[t].store_rows = log_rows_of(c, t, known);
  }
  EMBCACHE_RETURN_IF_ERROR(validate(c));
  return c;
}

namespace detail {

// A warning when the evaluation shard is also one of the run's training shards (the same file):
// the eval metrics then measure data the model trained on. "" when it is not.
std::string eval_shard_in_training(const trainer_config& c, std::uint64_t passes_done) {
  if (c.eval_shard.empty()) return {};
  std::error_code ec;
  const auto same_file = [&](const std::string& path) {
    const fs::path p = fs::weakly_canonical(resolve_data_path(c.data_dir, path), ec);
    return ec ? fs::path(resolve_data_path(c.data_dir, path)).lexically_normal() : p;
  };
  const fs::path eval = same_file(c.eval_shard);
  for (std::size_t p = 0; p < c.passes.size(); ++p)
    for (const auto& shard : c.passes[p].shards)
      if (same_file(shard) == eval)
        return "warning: config.eval_shard " + eval.string() +
               " is also a training shard of pass " + std::to_string(passes_done + p + 1) +
               ": the evaluation measures samples the model trained on";
  return {};
}

}  // namespace detail

}  // namespace embcache
