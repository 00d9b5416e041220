// Open-addressing set (and counter) of int64 keys for the data part: one probe array, linear
// probing, 0 stored out of line. Far lighter than std::unordered_set for tens of millions of
// keys, which the per-slot statistics and the rare-value filter need.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace embcache::detail {

template <bool Counts>
class flat_key_table {
 public:
  explicit flat_key_table(std::size_t initial_capacity = 1024) {
    std::size_t cap = 16;
    while (cap < initial_capacity * 2) cap *= 2;
    keys_.assign(cap, 0);
    if (Counts) counts_.assign(cap, 0);
  }

  /// Inserts `key` (or bumps its count); returns true when it was new.
  bool add(std::int64_t key) {
    if (key == 0) {
      bool fresh = !has_zero_;
      has_zero_ = true;
      if (Counts && zero_count_ < UINT32_MAX) ++zero_count_;
      return fresh;
    }
    if ((size_ + 1) * 4 > keys_.size() * 3) grow();
    std::size_t i = slot_of(key);
    while (true) {
      if (keys_[i] == key) {
        if (Counts && counts_[i] < UINT32_MAX) ++counts_[i];
        return false;
      }
      if (keys_[i] == 0) {
        keys_[i] = key;
        if (Counts) counts_[i] = 1;
        ++size_;
        return true;
      }
      i = (i + 1) & (keys_.size() - 1);
    }
  }

  bool contains(std::int64_t key) const { return count(key) > 0; }

  /// Occurrences of `key` (for a set: 1 when present).
  std::uint32_t count(std::int64_t key) const {
    if (key == 0) return has_zero_ ? (Counts ? zero_count_ : 1) : 0;
    std::size_t i = slot_of(key);
    while (true) {
      if (keys_[i] == key) return Counts ? counts_[i] : 1;
      if (keys_[i] == 0) return 0;
      i = (i + 1) & (keys_.size() - 1);
    }
  }

  std::size_t size() const noexcept { return size_ + (has_zero_ ? 1 : 0); }

  /// Calls fn(key, count) for every key, in no particular order.
  template <class Fn>
  void for_each(Fn&& fn) const {
    if (has_zero_) fn(std::int64_t{0}, Counts ? zero_count_ : 1u);
    for (std::size_t i = 0; i < keys_.size(); ++i) {
      if (keys_[i] != 0) fn(keys_[i], Counts ? counts_[i] : 1u);
    }
  }

  void clear() {
    std::fill(keys_.begin(), keys_.end(), 0);
    if (Counts) std::fill(counts_.begin(), counts_.end(), 0);
    size_ = 0;
    has_zero_ = false;
    zero_count_ = 0;
  }

 private:
  std::size_t slot_of(std::int64_t key) const noexcept {
    // Keys are hashes already, but their top bits hold a slot tag and tests use small
    // integers: mix before masking.
    std::uint64_t x = static_cast<std::uint64_t>(key);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return static_cast<std::size_t>(x) & (keys_.size() - 1);
  }

  void grow() {
    std::vector<std::int64_t> old_keys(keys_.size() * 2, 0);
    std::vector<std::uint32_t> old_counts;
    old_keys.swap(keys_);
    if (Counts) {
      old_counts.assign(keys_.size(), 0);
      old_counts.swap(counts_);
    }
    for (std::size_t j = 0; j < old_keys.size(); ++j) {
      if (old_keys[j] == 0) continue;
      std::size_t i = slot_of(old_keys[j]);
      while (keys_[i] != 0) i = (i + 1) & (keys_.size() - 1);
      keys_[i] = old_keys[j];
      if (Counts) counts_[i] = old_counts[j];
    }
  }

  std::vector<std::int64_t> keys_;
  std::vector<std::uint32_t> counts_;
  std::size_t size_ = 0;
  bool has_zero_ = false;
  std::uint32_t zero_count_ = 0;
};

using flat_key_set = flat_key_table<false>;
using flat_key_counter = flat_key_table<true>;

}  // namespace embcache::detail
