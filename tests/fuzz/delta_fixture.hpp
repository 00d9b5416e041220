// A small valid delta folder for the delta_folder target: table "emb" of save_fixture.hpp (AdaGrad,
// dim 4), rows trained and exported, then three rows changed and one key erased, exported with
// optimizer state as delta-000002. Deterministic, so the seed corpus matches it.
#pragma once

#include <string>

#include "save_fixture.hpp"

namespace embcache::fuzz {

/// Writes `dir`/delta-000001 and `dir`/delta-000002; returns the path of the second.
inline std::string write_delta_fixture(const std::string& dir) {
  auto tc = save_fixture_cache();
  const std::vector<std::int64_t> keys = {-7, 0, 3, 12, 1000, std::int64_t{1} << 40};
  tc->begin_pass({keys}).throw_if_error();
  const std::size_t w = tc->row_width(0);
  std::vector<float> rows(keys.size() * w);
  tc->read(0, keys.data(), keys.size(), rows.data(), nullptr).throw_if_error();
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = rows[i] * 0.5f + float(i) * 0.125f;
  tc->assign(0, keys.data(), keys.size(), rows.data()).throw_if_error();
  tc->export_incremental_to(dir, true).value();
  for (std::size_t i = 0; i < 3 * w; ++i) rows[i] += 1.0f;
  tc->assign(0, keys.data(), 3, rows.data()).throw_if_error();
  tc->erase(0, &keys[3], 1).throw_if_error();
  return tc->export_incremental_to(dir, true).value();
}

}  // namespace embcache::fuzz
