// The keysets of a keyset-mode path: read from the files beside each shard (in the layout its
// dataset's manifest.json names), cut to what this process holds, and swapped into the training
// cache once per shard with the next shard's staged meanwhile.
#include <algorithm>
#include <filesystem>
#include <iterator>

#include "embcache/keyset.hpp"
#include "embcache/shard.hpp"
#include "embedding_path.hpp"

namespace embcache::detail {
namespace {

namespace fs = std::filesystem;

// `X.bin` -> `X<suffix>`; other names get the suffix appended.
std::string beside(const std::string& shard, const std::string& suffix) {
  const std::string ext = ".bin";
  if (shard.size() > ext.size() && shard.compare(shard.size() - ext.size(), ext.size(), ext) == 0)
    return shard.substr(0, shard.size() - ext.size()) + suffix;
  return shard + suffix;
}

}  // namespace

keyset_swapper::keyset_swapper(const trainer_config& config, table_roles roles, keyset_filter keep)
    : config_(config), roles_(roles), keep_(std::move(keep)) {}

result<std::vector<std::vector<trainer_key>>> keyset_swapper::take_keysets(
    const std::string& shard) {
  std::vector<std::vector<trainer_key>> keysets;
  if (prefetched_shard_ == shard) {
    keysets = std::move(prefetched_keysets_);
    others_ = std::move(prefetched_others_);
  } else {
    auto ks = keysets_of(shard, &others_);
    if (!ks.ok()) return ks.get_status();
    keysets = std::move(ks).value();
  }
  prefetched_shard_.clear();
  prefetched_keysets_.clear();
  prefetched_others_.clear();
  return keysets;
}

result<keyset_format> keyset_swapper::keyset_format_of(const std::string& shard) {
  std::string dir = fs::path(shard).parent_path().string();
  if (dir.empty()) dir = ".";
  if (auto it = formats_.find(dir); it != formats_.end()) return it->second;
  keyset_format f = keyset_format::embcache;
  std::error_code ec;
  if (fs::exists(dir + "/manifest.json", ec)) {
    auto m = read_dataset_manifest(dir);
    if (!m.ok()) return m.get_status().with_context("the dataset of " + shard);
    f = m.value().keyset;
  }
  formats_.emplace(dir, f);
  return f;
}

result<std::vector<std::vector<trainer_key>>> keyset_swapper::keysets_of(
    const std::string& shard, std::vector<std::vector<trainer_key>>* others) {
  auto fmt = keyset_format_of(shard);
  if (!fmt.ok()) return fmt.get_status();
  auto slot_keys = read_keyset<trainer_key>(beside(shard, ".keys"), fmt.value());
  if (!slot_keys.ok()) return slot_keys.get_status().with_context("keyset of " + shard);
  std::vector<std::vector<trainer_key>> ks(config_.tables.size());
  ks[roles_.deep] = slot_keys.value();
  if (config_.crossed) {
    auto crossed = read_keyset<trainer_key>(beside(shard, ".cross.keys"), fmt.value());
    if (!crossed.ok()) return crossed.get_status().with_context("crossed keyset of " + shard);
    ks[roles_.wide].resize(ks[roles_.deep].size() + crossed.value().size());
    std::merge(ks[roles_.deep].begin(), ks[roles_.deep].end(), crossed.value().begin(),
               crossed.value().end(), ks[roles_.wide].begin());
  } else {
    ks[roles_.wide] = ks[roles_.deep];
  }
  if (others) others->assign(ks.size(), {});
  if (keep_) {
    for (std::size_t t = 0; t < ks.size(); ++t) {
      std::vector<trainer_key> own = keep_(ks[t]);
      if (others && config_.tables[t].admission.enabled()) {
        std::vector<trainer_key> all = ks[t], mine = own;
        std::sort(all.begin(), all.end());
        std::sort(mine.begin(), mine.end());
        std::set_difference(all.begin(), all.end(), mine.begin(), mine.end(),
                            std::back_inserter((*others)[t]));
      }
      ks[t] = std::move(own);
    }
  }
  return ks;
}

}  // namespace embcache::detail
