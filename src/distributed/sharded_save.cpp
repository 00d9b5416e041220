// Sharded saves: a part per rank through the store's own checkpoint, a manifest published last;
// loading a part back. Reading and checking the manifest: sharded_manifest.cpp.
#include "embcache/distributed/sharded_save.hpp"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "common/durable_file.hpp"
#include "distributed/sharded_manifest_format.hpp"
#include "embcache/distributed/ownership.hpp"
#include "embcache/host_store.hpp"
#include "embcache/keyset.hpp"
#include "format/checked_io.hpp"
#include "format/model_folder.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;

// The highest generation folder in `dir` (0 when none): a new save takes the next one, so it
// never writes into a folder a published manifest names.
std::uint64_t last_generation(const std::string& dir) {
  std::uint64_t last = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() < 5 || name.compare(0, 4, "gen-") != 0) continue;
    std::uint64_t g = 0;
    bool digits = true;
    for (std::size_t i = 4; i < name.size() && digits; ++i) {
      digits = name[i] >= '0' && name[i] <= '9' && g < (UINT64_MAX - 9) / 10;
      g = g * 10 + static_cast<std::uint64_t>(name[i] - '0');
    }
    if (digits) last = std::max(last, g);
  }
  return last;
}

// The lifetime state every rank saves: rank 0 gets every rank's expiry clock (`clocks`, in rank
// order), and the ranks check that they hold the same admission words. Collective.
status gather_lifetime(communicator& comm, const sharded_lifetime& mine, const std::string& who,
                       std::vector<expiry_clock>* clocks) {
  constexpr std::size_t fields = 6;
  const auto world = static_cast<std::size_t>(comm.size());
  const std::uint64_t own[fields] = {
      mine.admission.size(),
      XXH64(mine.admission.data(), mine.admission.size() * sizeof(std::uint32_t), 0),
      mine.has_expiry ? mine.expiry.boundaries + 1 : 0,
      mine.expiry.versions.size(),
      mine.expiry.steps,
      mine.expiry.step_versions.size()};
  std::vector<std::uint64_t> all(fields * world);
  EMBCACHE_RETURN_IF_ERROR(comm.all_gather(own, sizeof own, all.data()).with_context(who));
  const auto at = [&](std::size_t r, std::size_t f) { return all[fields * r + f]; };
  for (std::size_t r = 1; r < world; ++r) {
    if (at(r, 0) != at(0, 0) || at(r, 1) != at(0, 1))
      return status::internal(who + ": rank " + std::to_string(r) + "'s admission counts (" +
                              std::to_string(at(r, 0)) + " words) differ from rank 0's (" +
                              std::to_string(at(0, 0)) + " words); every rank counts every key");
    // Every rank begins every shard and every step: the clocks differ in their values only.
    const auto clock = [&](std::size_t q) {
      return at(q, 2) == 0
                 ? std::string("none")
                 : std::to_string(at(q, 2) - 1) + " boundaries, " + std::to_string(at(q, 3)) +
                       " pass versions, " + std::to_string(at(q, 4)) + " steps, " +
                       std::to_string(at(q, 5)) + " step versions";
    };
    for (std::size_t f = 2; f < fields; ++f)
      if (at(r, f) != at(0, f))
        return status::internal(who + ": rank " + std::to_string(r) + "'s expiry clock (" +
                                clock(r) + ") differs from rank 0's (" + clock(0) + ")");
  }
  // Each rank's values, in rank order: the pass versions, then the step versions.
  const std::size_t k = static_cast<std::size_t>(at(0, 3)), s = static_cast<std::size_t>(at(0, 5));
  std::vector<std::uint64_t> values(k + s), gathered((k + s) * world);
  std::copy(mine.expiry.versions.begin(), mine.expiry.versions.end(), values.begin());
  std::copy(mine.expiry.step_versions.begin(), mine.expiry.step_versions.end(),
            values.begin() + static_cast<std::ptrdiff_t>(k));
  if (k + s != 0)
    EMBCACHE_RETURN_IF_ERROR(
        comm.all_gather(values.data(), (k + s) * sizeof(std::uint64_t), gathered.data())
            .with_context(who));
  clocks->assign(world, expiry_clock{});
  if (at(0, 2) == 0) return {};
  for (std::size_t r = 0; r < world; ++r) {
    expiry_clock& c = (*clocks)[r];
    const auto first = gathered.begin() + static_cast<std::ptrdiff_t>(r * (k + s));
    c.boundaries = at(r, 2) - 1;
    c.versions.assign(first, first + static_cast<std::ptrdiff_t>(k));
    c.steps = at(r, 4);
    c.step_versions.assign(first + static_cast<std::ptrdiff_t>(k),
                           first + static_cast<std::ptrdiff_t>(k + s));
  }
  return {};
}

status write_manifest(const std::string& dir, const nlohmann::json& m) {
  // The rename inside is the moment the new save replaces the old one.
  return detail::write_text_durably(dir + "/manifest.json", m.dump(2) + "\n");
}

}  // namespace

std::string sharded_generation_name(std::uint64_t generation) {
  char name[32];
  std::snprintf(name, sizeof(name), "gen-%06llu", static_cast<unsigned long long>(generation));
  return name;
}

std::string sharded_part_path(std::uint64_t generation, int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "/rank-%05d", rank);
  return sharded_generation_name(generation) + name;
}

template <class Key>
part_opener<Key> host_store_part_opener() {
  return [](const std::string& part_dir, const std::string& table,
            std::size_t row_width) -> result<std::unique_ptr<param_store<Key>>> {
    host_store_options o;
    o.table_name = table;
    o.row_width = row_width;
    auto store = host_store<Key>::open(part_dir, o);
    if (!store.ok()) return store.get_status();
    return std::unique_ptr<param_store<Key>>(std::move(store).value());
  };
}

template <class Key>
status save_sharded(communicator& comm, param_store<Key>& shard, const std::string& dir_in,
                    const sharded_save_info& info, const sharded_lifetime* lifetime) {
  const std::string dir = detail::strip_slashes(dir_in);
  const int rank = comm.rank(), world = comm.size();
  const std::string who = "save_sharded of '" + dir + "' on rank " + std::to_string(rank);

  // Rank 0 picks the generation; everyone learns it.
  std::uint64_t generation = 0;
  status local;
  if (!info.run_id.empty() && !detail::is_run_id(info.run_id))
    local = status::invalid_argument(who + ": run_id '" + info.run_id +
                                     "' is not 32 lowercase hex digits");
  if (local.ok() && rank == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) local = detail::errno_status(who + ": cannot create folder", dir, ec.value());
    generation = last_generation(dir) + 1;
  }
  EMBCACHE_RETURN_IF_ERROR(agree(comm, local, "save_sharded of '" + dir + "'"));
  EMBCACHE_RETURN_IF_ERROR(comm.broadcast(&generation, sizeof(generation), 0).with_context(who));
  std::vector<expiry_clock> clocks;
  if (lifetime) {
    local = gather_lifetime(comm, *lifetime, who, &clocks);
    EMBCACHE_RETURN_IF_ERROR(agree(comm, local, "save_sharded of '" + dir + "'"));
  }
  const bool with_expiry = lifetime && lifetime->has_expiry;

  // Every rank writes its part with the store's own checkpoint.
  const std::string part = sharded_part_path(generation, rank);
  {
    std::error_code ec;
    fs::create_directories(dir + "/" + sharded_generation_name(generation), ec);
    if (ec)
      local = detail::errno_status(who + ": cannot create folder",
                                   dir + "/" + sharded_generation_name(generation), ec.value());
    if (local.ok() && shard.table_name() != info.table_name)
      local = status::invalid_argument(who + ": the store holds table '" + shard.table_name() +
                                       "', the save is of '" + info.table_name + "'");
    if (local.ok()) local = shard.checkpoint(dir + "/" + part).with_context(who);
  }
  EMBCACHE_RETURN_IF_ERROR(agree(comm, local, "save_sharded of '" + dir + "'"));
  std::vector<std::uint64_t> rows(static_cast<std::size_t>(world));
  const std::uint64_t mine = shard.size();
  EMBCACHE_RETURN_IF_ERROR(comm.all_gather(&mine, sizeof(mine), rows.data()).with_context(who));

  // Every part is complete: rank 0 publishes the save, then drops the other generations.
  if (rank == 0) {
    // The admission counts, once (every rank holds the same), inside the generation folder.
    nlohmann::json admission;
    if (lifetime && !lifetime->admission.empty()) {
      detail::durable_file_writer a;
      const std::string path = detail::sharded_admission_path(generation);
      local = a.open(dir + "/" + path, detail::file_placement::in_staged_folder);
      if (local.ok())
        local =
            a.write(lifetime->admission.data(), lifetime->admission.size() * sizeof(std::uint32_t));
      if (local.ok()) local = a.commit();
      local = local.with_context(who);
      admission = {{"path", path}, {"bytes", a.bytes()}, {"xxh64", detail::hex64(a.digest())}};
    }
    nlohmann::json m;
    m["format"] = detail::sharded_manifest_format;
    m["format_version"] = detail::sharded_manifest_format_version;
    m["table_name"] = info.table_name;
    m["key_type"] = key_type_name<Key>();
    m["dim"] = info.dim;
    m["row_width"] = info.row_width;
    m["optimizer"] = info.optimizer;
    m["step"] = info.step;
    m["num_blocks"] = info.num_blocks;
    if (!info.run_id.empty()) m["run_id"] = info.run_id;
    if (info.applied_delta != 0) m["applied_delta"] = info.applied_delta;
    m["world_size"] = world;
    m["owner_function"] = owner_function_name;
    m["generation"] = generation;
    m["parts"] = nlohmann::json::array();
    for (int r = 0; r < world; ++r) {
      nlohmann::json part = {{"rank", r},
                             {"path", sharded_part_path(generation, r)},
                             {"rows", rows[static_cast<std::size_t>(r)]}};
      if (with_expiry) {
        const expiry_clock& c = clocks[static_cast<std::size_t>(r)];
        part["expiry"] = {{"boundaries", c.boundaries}, {"pass_versions", c.versions}};
        if (c.steps != 0) {  // ttl_steps on: the step clock, the same steps on every rank
          part["expiry"]["steps"] = c.steps;
          part["expiry"]["step_versions"] = c.step_versions;
        }
      }
      m["parts"].push_back(std::move(part));
    }
    if (!admission.is_null()) m["admission"] = admission;
    if (local.ok()) local = detail::sync_folder(dir + "/" + sharded_generation_name(generation));
    if (local.ok()) local = detail::sync_folder(dir);
    if (local.ok()) local = write_manifest(dir, m).with_context(who);
    if (local.ok()) {
      const std::string keep = sharded_generation_name(generation);
      std::error_code ec;
      for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.compare(0, 4, "gen-") == 0 && name != keep) {
          std::error_code rm;
          fs::remove_all(it->path(), rm);  // a leftover costs space, never correctness
        }
      }
    }
  }
  return agree(comm, local, "save_sharded of '" + dir + "'");
}

template <class Key>
result<sharded_manifest> load_sharded_part(const std::string& dir_in, int rank, int world,
                                           param_store<Key>& target,
                                           const part_opener<Key>& open_in) {
  const std::string dir = detail::strip_slashes(dir_in);
  const std::string who = "load_sharded_part of '" + dir + "' for rank " + std::to_string(rank) +
                          " of " + std::to_string(world);
  if (world < 1 || rank < 0 || rank >= world)
    return status::invalid_argument(who + ": rank outside the world");
  auto parsed = read_sharded_manifest(dir);
  if (!parsed.ok()) return parsed.get_status();
  sharded_manifest m = std::move(parsed).value();
  if (m.key_type != key_type_of<Key>())
    return status::invalid_argument(who + ": the save holds " + to_string(m.key_type) +
                                    " keys (field 'key_type'), the store " + key_type_name<Key>() +
                                    " keys");
  if (m.info.table_name != target.table_name())
    return status::not_found(who + ": the save holds table '" + m.info.table_name + "', not '" +
                             target.table_name() + "'");
  if (m.info.row_width != target.row_width())
    return status::invalid_argument(who + ": the save holds rows of " +
                                    std::to_string(m.info.row_width) + " floats, the store " +
                                    std::to_string(target.row_width()));
  if (target.size() != 0)
    return status::invalid_argument(who + ": the target store already holds " +
                                    std::to_string(target.size()) + " rows");
  const part_opener<Key> open = open_in ? open_in : host_store_part_opener<Key>();
  const std::size_t width = m.info.row_width;
  std::vector<Key> keep_keys;
  std::vector<float> keep_rows;
  std::vector<std::uint64_t> keep_versions;
  // On another number of ranks, versions become age classes (the header says why).
  const bool reclass = m.world_size != world && m.parts[0].has_expiry;
  std::vector<std::uint64_t> pass;  // part r's clock values (pass and step versions), ascending
  for (int r = 0; r < m.world_size; ++r) {
    if (reclass) {
      const expiry_clock& c = m.parts[static_cast<std::size_t>(r)].expiry;
      pass = c.versions;
      pass.insert(pass.end(), c.step_versions.begin(), c.step_versions.end());
      std::sort(pass.begin(), pass.end());
    }
    // With the save's own world size, part r holds exactly rank r's keys.
    if (m.world_size == world && r != rank) continue;
    const std::string part_dir = dir + "/" + m.parts[static_cast<std::size_t>(r)].path;
    auto part = open(part_dir, m.info.table_name, width);
    if (!part.ok()) return part.get_status().with_context(who);
    param_store<Key>& src = *part.value();
    if (src.size() != m.parts[static_cast<std::size_t>(r)].rows)
      return status::corruption(who + ": '" + part_dir + "' holds " + std::to_string(src.size()) +
                                " rows, the manifest's parts[" + std::to_string(r) +
                                "].rows says " +
                                std::to_string(m.parts[static_cast<std::size_t>(r)].rows));
    EMBCACHE_RETURN_IF_ERROR(src.for_each(std::size_t{1} << 16,
                                          [&](const Key* k, const float* rows,
                                              const std::uint64_t* v, std::size_t n) -> status {
                                            keep_keys.clear();
                                            keep_rows.clear();
                                            keep_versions.clear();
                                            for (std::size_t i = 0; i < n; ++i) {
                                              if (owner_of(k[i], world) != rank) continue;
                                              keep_keys.push_back(k[i]);
                                              keep_rows.insert(keep_rows.end(), rows + i * width,
                                                               rows + (i + 1) * width);
                                              keep_versions.push_back(
                                                  reclass
                                                      ? 1 + static_cast<std::uint64_t>(
                                                                std::lower_bound(pass.begin(),
                                                                                 pass.end(), v[i]) -
                                                                pass.begin())
                                                      : v[i]);
                                            }
                                            return target.push(keep_keys.data(), keep_keys.size(),
                                                               keep_rows.data(),
                                                               keep_versions.data());
                                          })
                                 .with_context(who + ": reading '" + part_dir + "'"));
  }
  return m;
}

template <class Key>
result<sharded_manifest> load_sharded(communicator& comm, const std::string& dir,
                                      param_store<Key>& target, const part_opener<Key>& open) {
  auto loaded = load_sharded_part(dir, comm.rank(), comm.size(), target, open);
  EMBCACHE_RETURN_IF_ERROR(agree(comm, loaded.get_status(), "load_sharded of '" + dir + "'"));
  // Every row of the save must land on exactly one rank: a key in two parts, or in a part whose
  // rank does not own it, shows up here.
  std::uint64_t total = target.size();
  EMBCACHE_RETURN_IF_ERROR(comm.all_reduce_sum(&total, 1).with_context("load_sharded"));
  status local;
  if (total != loaded.value().total_rows)
    local = status::corruption("load_sharded of '" + dir + "': the ranks loaded " +
                               std::to_string(total) + " rows, the manifest's parts hold " +
                               std::to_string(loaded.value().total_rows));
  EMBCACHE_RETURN_IF_ERROR(agree(comm, local, "load_sharded of '" + dir + "'"));
  return loaded;
}

#define EMBCACHE_SHARDED_SAVE(Key)                                                        \
  template part_opener<Key> host_store_part_opener<Key>();                                \
  template status save_sharded<Key>(communicator&, param_store<Key>&, const std::string&, \
                                    const sharded_save_info&, const sharded_lifetime*);   \
  template result<sharded_manifest> load_sharded_part<Key>(                               \
      const std::string&, int, int, param_store<Key>&, const part_opener<Key>&);          \
  template result<sharded_manifest> load_sharded<Key>(communicator&, const std::string&,  \
                                                      param_store<Key>&, const part_opener<Key>&);
EMBCACHE_SHARDED_SAVE(std::int64_t)
EMBCACHE_SHARDED_SAVE(std::uint32_t)
#undef EMBCACHE_SHARDED_SAVE

}  // namespace embcache
