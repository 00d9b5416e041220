// The trainer's checkpoints: save() stages the whole save (sparse tables, dense.bin,
// trainer.json) in a sibling folder, fsyncs it and publishes it in place of the previous one;
// load() reads the published save, or the previous one when a publish was cut short.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/durable_file.hpp"
#include "format/checked_io.hpp"
#include "format/model_folder.hpp"
#include "embcache/detail/progress.hpp"
#include "reporting.hpp"
#include "trainer_impl.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using clock_type = trainer::impl::clock_type;

// The file that marks a complete save (written last into the staged folder).
constexpr const char* state_file = "trainer.json";

// One file of the staged save: fsynced here, its folder entry by publish_folder().
status write_staged_file(const std::string& path, const void* data, std::size_t n) {
  detail::durable_file_writer w;
  EMBCACHE_RETURN_IF_ERROR(w.open(path, detail::file_placement::in_staged_folder));
  EMBCACHE_RETURN_IF_ERROR(w.write(data, n));
  return w.commit();
}

// The trainer's state beside the tables and the dense blob.
json state_json(const trainer::impl& s) {
  json history = json::array();
  for (const auto& m : s.progress.history) history.push_back(m);
  return {{"format", "embcache-trainer"},
          {"format_version", 1},
          {"mode", to_string(s.config.mode)},
          {"step", s.progress.step},
          {"passes_done", s.progress.passes_done},
          {"samples", s.progress.samples},
          {"seed", s.config.seed},
          {"crossed", s.config.crossed},
          {"world", s.comm ? s.comm->size() : 1},
          {"num_blocks", s.comm ? json(s.config.num_blocks) : json(nullptr)},
          {"history", history},
          {"counters", s.path->counters()},
          {"config", json(s.config)}};
}

// The export point of a save's sparse part (its manifest's run identity, applied_delta and table
// versions), which trainer.json records beside dense.bin; null for a sparse part without one
// manifest (a sharded save).
result<json> sparse_point(const std::string& sparse) {
  std::error_code ec;
  if (!fs::exists(sparse + "/manifest.json", ec)) return json(nullptr);
  auto m = detail::read_folder_manifest(sparse, detail::folder_kind::model);
  if (!m.ok()) return m.get_status();
  json versions = json::object();
  for (const auto& t : m.value().tables) versions[t.name] = t.version;
  return json{
      {"run_id", m.value().run_id}, {"applied_delta", m.value().sequence}, {"versions", versions}};
}

// Reads trainer.json's counters and history, and the bytes of dense.bin, of the save in `dir`.
status read_state(trainer::impl& s, const std::string& dir, std::uint64_t& step,
                  std::uint64_t& passes, std::uint64_t& samples,
                  std::vector<pass_metrics>& history, std::vector<char>& dense_bytes);

// A sharded run's ranks agree on an outcome (every rank fails when one does); one process's is
// its own.
status agreed(trainer::impl& s, const status& local, const std::string& what) {
  return s.comm != nullptr ? agree(*s.comm, local, what) : local;
}

// Writes the whole save into the staged folder `staged`.
status write_save(trainer::impl& s, const std::string& staged, const std::string& dir,
                  const std::vector<std::uint8_t>& dense) {
  // A line by the progress rules (every 10%, at least 2 s apart) as the tables are written.
  std::optional<detail::progress_meter> meter;
  const auto on_progress = [&](std::uint64_t done, std::uint64_t total) {
    if (!meter) meter.emplace(total);
    if (done > 0 && meter->due(done))
      s.log("save to " + dir + ": " + meter->count_text(done, "rows"));
  };
  EMBCACHE_RETURN_IF_ERROR(s.path->save_sparse(staged + "/sparse", on_progress));
  status written;
  if (s.leader()) {  // the files of the whole run: one writer
    written = write_staged_file(staged + "/dense.bin", dense.data(), dense.size());
    json state = state_json(s);
    auto sparse = sparse_point(staged + "/sparse");
    if (!sparse.ok()) written = sparse.get_status();
    if (written.ok() && !sparse.value().is_null()) state["sparse"] = sparse.value();
    const std::string text = state.dump(2) + "\n";
    if (written.ok())
      written = write_staged_file(staged + "/" + state_file, text.data(), text.size());
  }
  return agreed(s, written, "trainer::save");
}

}  // namespace

status detail::lock_output_folders(const trainer::impl& s,
                                   std::vector<std::unique_ptr<file_lock>>* held) {
  status local;
  if (s.leader()) {
    std::vector<std::pair<std::string, std::string>> folders;  // (folder, its config field)
    for (const auto& [dir, field] : {std::pair{s.config.save_dir, "config.save_dir"},
                                     std::pair{s.config.export_dir, "config.export_dir"}}) {
      const std::string d = strip_slashes(dir);
      if (d.empty() ||
          std::any_of(folders.begin(), folders.end(), [&](const auto& f) { return f.first == d; }))
        continue;
      folders.emplace_back(d, field);
    }
    for (const auto& [dir, field] : folders) {
      // Beside the folder, not in it: a save replaces its folder whole.
      const std::string parent = parent_dir(dir);
      std::error_code ec;
      fs::create_directories(parent, ec);
      held->push_back(std::make_unique<file_lock>());
      local = held->back()->try_lock(parent + "/." + fs::path(dir).filename().string() + ".lock",
                                     std::string(field) + " '" + dir + "'");
      if (!local.ok()) break;
    }
  }
  status out = s.comm != nullptr ? agree(*s.comm, local, "trainer::run") : local;
  if (!out.ok()) held->clear();
  return out;
}

// Layout in docs/model.md. The blob is the device-independent picture of the dense state, so
// this works whichever device the network runs on. A blob that does not parse counts as not
// finite.
bool detail::dense_blob_finite(const std::vector<std::uint8_t>& blob) {
  auto u64 = [&](std::size_t at, std::uint64_t& v) {
    if (at + 8 > blob.size()) return false;
    std::memcpy(&v, blob.data() + at, 8);
    return true;
  };
  auto floats = [&](std::size_t at, std::uint64_t n) {
    if (n > (blob.size() - std::min(at, blob.size())) / 4) return false;
    for (std::uint64_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, blob.data() + at + 4 * i, 4);
      if (!std::isfinite(f)) return false;
    }
    return true;
  };
  // Wide&Deep: magic 8, bias / m / v 12, MLP blob size 8, MLP blob, checksum 8.
  std::uint64_t mlp_size = 0;
  if (!floats(8, 3) || !u64(20, mlp_size) || mlp_size > blob.size() - 28) return false;
  // MLP: magic 8, version 4, hidden count 4, input_dim 8, widths 8 H, Adam step 8, parameter
  // count P 8, parameters / m / v 3 x 4 P, checksum 8.
  const std::size_t mlp = 28;
  std::uint32_t hidden = 0;
  if (mlp_size < 24) return false;
  std::memcpy(&hidden, blob.data() + mlp + 12, 4);
  const std::size_t count_at = mlp + 24 + 8 * std::size_t(hidden) + 8;
  std::uint64_t params = 0;
  if (!u64(count_at, params) || params > mlp_size / 12) return false;
  return floats(count_at + 8, 3 * params);
}

status trainer::save(const std::string& dir) {
  impl& s = *impl_;
  if (!s.notes.diverged.ok()) return s.notes.diverged;
  const auto t0 = clock_type::now();
  const std::vector<std::uint8_t> dense = s.model->save();
  if (!detail::dense_blob_finite(dense))
    return s.diverge("save to " + dir + " after step " + std::to_string(s.progress.step),
                     "the dense weights or their Adam state are not finite");
  // The previous save stays whole until the new one is complete and durable.
  // Sharded: rank 0 prepares and publishes the staged folder, every rank writes its parts.
  const std::string staged = detail::staging_folder_of(dir);
  std::error_code ec;
  status ready;
  if (s.leader()) {
    // Only a folder of that name is ours to remove: a file named like it is refused, kept.
    ready = detail::remove_staging_folder(staged);
    if (ready.ok()) fs::create_directories(staged, ec);
    if (ec) ready = status::io_error(staged + ": cannot create (" + ec.message() + ")");
  }
  EMBCACHE_RETURN_IF_ERROR(agreed(s, ready, "trainer::save"));
  status written = write_save(s, staged, dir, dense);
  if (written.ok() && s.leader()) written = detail::publish_folder(staged, dir);
  written = agreed(s, written, "trainer::save");
  if (!written.ok()) {
    if (s.leader()) fs::remove_all(staged, ec);  // a partial save, or the previous one
    return written;
  }
  s.log(detail::save_summary_line(dir,
                                  std::chrono::duration<double>(clock_type::now() - t0).count()));
  return {};
}

status trainer::load(const std::string& dir_in) {
  impl& s = *impl_;
  const std::string dir = detail::published_folder(dir_in, state_file);
  std::uint64_t step = 0, passes = 0, samples = 0;
  std::vector<pass_metrics> history;
  std::vector<char> dense;
  // Every rank reads the run's files; they agree before the collective part.
  status read = read_state(s, dir, step, passes, samples, history, dense);
  std::error_code ec;
  if (read.code() == status_code::not_found && !fs::exists(dir + "/" + state_file, ec) &&
      (fs::exists(dir + "/deep/key", ec) || fs::exists(dir + "/key", ec)))
    read = status::invalid_argument(
        "'" + dir + "' has no " + state_file +
        ": it is a HugeCTR sparse model folder, not a trainer save; a run starts from one with "
        "config.start_from_hugectr (the dense network then starts fresh)");
  EMBCACHE_RETURN_IF_ERROR(agreed(s, read, "trainer::load"));
  EMBCACHE_RETURN_IF_ERROR(s.path->load_sparse(dir + "/sparse", load_options{}));
  status loaded =
      s.model->load(reinterpret_cast<const std::uint8_t*>(dense.data()), dense.size())
          .with_context(dir + "/dense.bin");
  EMBCACHE_RETURN_IF_ERROR(agreed(s, loaded, "trainer::load"));
  s.progress.step = step;
  s.progress.passes_done = passes;
  s.progress.samples = samples;
  s.progress.history = std::move(history);
  s.path->set_step(step);
  return {};
}

namespace {

status read_state(trainer::impl& s, const std::string& dir, std::uint64_t& step,
                  std::uint64_t& passes, std::uint64_t& samples,
                  std::vector<pass_metrics>& history, std::vector<char>& dense_bytes) {
  const std::string state_path = dir + "/" + state_file;
  auto text = detail::read_file_bytes(state_path);
  if (!text.ok()) return text.get_status();
  try {
    const json state = json::parse(text.value().begin(), text.value().end());
    if (state.at("format") != "embcache-trainer" || state.at("format_version") != 1)
      return status::invalid_argument(state_path + ": not an embcache-trainer save of version 1");
    if (state.at("crossed").get<bool>() != s.config.crossed)
      return status::invalid_argument(state_path + ": saved with crossed " +
                                      state.at("crossed").dump() + ", config.crossed differs");
    step = state.at("step").get<std::uint64_t>();
    passes = state.at("passes_done").get<std::uint64_t>();
    samples = state.at("samples").get<std::uint64_t>();
    for (const auto& h : state.at("history")) history.push_back(detail::pass_metrics_from_json(h));
    // dense.bin belongs to the sparse part saved with it; one rewritten since (embcache-apply on
    // the save) would resume pass-k dense weights with the embeddings of another point.
    if (state.contains("sparse")) {
      auto now = sparse_point(dir + "/sparse");
      if (!now.ok()) return now.get_status();
      if (!now.value().is_null() && now.value() != state.at("sparse"))
        return status::invalid_argument(
            "'" + dir + "/sparse' is not the sparse part 'dense.bin' was saved with: " +
            state_path + " records " + state.at("sparse").dump() + ", '" + dir +
            "/sparse/manifest.json' says " + now.value().dump() +
            " (deltas applied to the save?); resume from a save taken at one point");
    }
  } catch (const std::exception& e) {
    return status::corruption(state_path + ": " + e.what());
  }
  auto dense = detail::read_file_bytes(dir + "/dense.bin");
  if (!dense.ok()) return dense.get_status();
  dense_bytes = std::move(dense).value();
  return {};
}

}  // namespace

}  // namespace embcache
