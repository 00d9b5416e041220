// The trainer's configuration: errors name the field and the range, the dense device is chosen
// as asked, and a configuration too large for the machine's memory is a clear error.
#include <sys/resource.h>
#include <sys/wait.h>

#include "../common/address_space.hpp"
#include "../common/sanitizers.hpp"
#include "embcache/distributed/communicator.hpp"
#include "embedding_path.hpp"  // src/trainer: embedding_device_of
#include "trainer_impl.hpp"    // src/trainer: detail::eval_shard_in_training
#include "trainer_test_support.hpp"

namespace embcache::test {
namespace {

TEST(trainer_config, errors_name_the_field) {
  auto err = [](const json& j) {
    auto c = trainer_config_from_json(j);
    return c.ok() ? std::string("ok") : c.get_status().message();
  };
  const json base = {{"passes", {{"a.bin"}}}};
  EXPECT_EQ(err(base), "ok");
  json j = base;
  j["tables"] = {{{"name", "wide"}}, {{"name", "deep"}, {"capacity", 0}}};
  EXPECT_EQ(err(j), "config.tables[1].capacity: expected an integer in [1, 1099511627776], got 0");
  j = base;
  j["tables"] = {{{"name", "wide"}}, {{"name", "deep"}, {"capacity", "big"}}};
  EXPECT_EQ(err(j),
            "config.tables[1].capacity: expected an integer in [1, 1099511627776] or "
            "\"auto\", got \"big\"");
  j = base;
  j["tables"] = {{{"name", "wide"}}, {{"name", "deep"}, {"capacity", 100}, {"max_resident", 99}}};
  EXPECT_EQ(err(j), "config.tables[1].max_resident: must be 0 (default) or >= capacity");
  j = base;
  j["tables"] = {{{"name", "wide"}, {"capacity", 100}, {"slots", 120}, {"max_resident", 121}},
                 {{"name", "deep"}}};
  EXPECT_EQ(err(j), "config.tables[0].max_resident: must be <= slots");
  j = base;
  j["tables"] = {{{"name", "wide"}, {"capacity", 100}, {"slots", 90}}, {{"name", "deep"}}};
  EXPECT_EQ(err(j), "config.tables[0].slots: must be 0 (default) or >= capacity");
  j = base;
  j["move_staged_rows"] = true;
  EXPECT_EQ(err(j), "ok");
  j["prefetch"] = false;
  EXPECT_EQ(err(j),
            "config.move_staged_rows: moves the rows the prefetch stages, so it needs config.mode "
            "\"keyset\" with config.prefetch (got mode \"keyset\", prefetch false)");
  j["prefetch"] = true;
  j["mode"] = "on_demand";
  EXPECT_EQ(err(j),
            "config.move_staged_rows: moves the rows the prefetch stages, so it needs config.mode "
            "\"keyset\" with config.prefetch (got mode \"on_demand\", prefetch true)");
  j["move_staged_rows"] = false;  // false is taken in any mode
  EXPECT_EQ(err(j), "ok");
  j = base;
  j["move_staged_rows"] = 1;
  EXPECT_EQ(err(j), "config.move_staged_rows: wrong type (number)");
  j = base;
  j["batch_sise"] = 4;
  EXPECT_EQ(err(j), "config.batch_sise: unknown field");
  j = base;
  j["mode"] = "lazy";
  EXPECT_EQ(err(j), "config.mode: \"lazy\" is not a mode (keyset, on_demand, host_hybrid)");
  j = base;
  j["tables"] = {{{"name", "wide"}, {"optimizer", {{"kind", "ftrl"}, {"ftrl_l1", -1}}}},
                 {{"name", "deep"}}};
  EXPECT_EQ(err(j), "config.tables[0].optimizer.ftrl_l1: expected a finite number >= 0, got -1");
  EXPECT_EQ(err(json::object()), "config.passes: must hold at least 1 pass");
  j = base;
  j["tables"] = {{{"name", "wide"}, {"store", "rocksdb"}}, {{"name", "deep"}}};
  EXPECT_EQ(err(j), "config.tables[0].store_path: required with store \"rocksdb\"");
  j = base;
  j["model"] = {{"dropout", 1.5}};
  EXPECT_EQ(err(j), "config.model.dropout: expected a number in [0, 1), got 1.5");
  j = base;
  j["dense_device"] = "gpu";
  EXPECT_EQ(err(j), "config.dense_device: \"gpu\" is not a device (host, cuda, auto)");
  j = base;
  j["dense_device"] = 1;
  EXPECT_EQ(err(j), "config.dense_device: wrong type (number)");
  for (const char* d : {"host", "cuda", "auto"}) {
    j = base;
    j["dense_device"] = d;
    auto parsed = trainer_config_from_json(j);
    EMBCACHE_ASSERT_OK(parsed) << d;
    EXPECT_STREQ(to_string(parsed.value().dense_device), d);
    EXPECT_EQ(json(parsed.value()).at("dense_device"), d);
  }
  EXPECT_EQ(trainer_config{}.dense_device, device_choice::automatic);
  j = base;
  j["embedding_device"] = "gpu";
  EXPECT_EQ(err(j), "config.embedding_device: \"gpu\" is not a device (host, cuda, auto)");
  j = base;
  j["embedding_device"] = true;
  EXPECT_EQ(err(j), "config.embedding_device: wrong type (boolean)");
  for (const char* d : {"host", "cuda", "auto"}) {
    j = base;
    j["embedding_device"] = d;
    auto parsed = trainer_config_from_json(j);
    EMBCACHE_ASSERT_OK(parsed) << d;
    EXPECT_STREQ(to_string(parsed.value().embedding_device), d);
    EXPECT_EQ(json(parsed.value()).at("embedding_device"), d);
  }
  EXPECT_EQ(trainer_config{}.embedding_device, device_choice::automatic);
  // Host-hybrid is the mode whose embeddings stay on the host: "cuda" there is a contradiction.
  j = base;
  j["mode"] = "host_hybrid";
  j["embedding_device"] = "cuda";
  EXPECT_EQ(err(j),
            "config.embedding_device: \"cuda\" with config.mode \"host_hybrid\": host-hybrid keeps "
            "the embeddings and their sparse optimizers on the host (use \"host\" or \"auto\", or "
            "mode \"keyset\" or \"on_demand\")");
  j["embedding_device"] = "auto";
  EXPECT_EQ(err(j), "ok");
  // Its incremental exports are the cache's (host_hybrid_deltas_apply_to_its_final_save).
  j["export_dir"] = "deltas";
  EXPECT_EQ(err(j), "ok");
  j = base;
  j["blas_threads"] = -1;
  EXPECT_EQ(err(j), "config.blas_threads: expected an integer in [0, 4096], got -1");

  // Every field round-trips, and a table named "wide" starts from the wide defaults.
  j = base;
  j["tables"] = {
      {{"name", "wide"}},
      {{"name", "deep"}, {"dim", 8}, {"capacity", 3000}, {"slots", 5000}, {"max_resident", 4000}}};
  j["embedding_device"] = "host";
  auto c = trainer_config_from_json(j);
  EMBCACHE_ASSERT_OK(c);
  EXPECT_EQ(c.value().tables[1].slots, 5000u);
  EXPECT_EQ(c.value().tables[1].max_resident, 4000u);
  EXPECT_EQ(c.value().tables[0].dim, 1u);
  EXPECT_EQ(c.value().tables[0].optimizer.kind, optimizer_kind::ftrl);
  EXPECT_EQ(c.value().tables[1].dim, 8u);
  EXPECT_EQ(c.value().embedding_device, device_choice::host);
  const json full = c.value();
  auto again = trainer_config_from_json(full);
  EMBCACHE_ASSERT_OK(again);
  EXPECT_EQ(json(again.value()), full);
  // Floats are printed with the fewest digits that read back as the same float: no float noise
  // (0.8999999761581421) in printed or saved configurations, and the same bits after a reload.
  j = base;
  j["model"] = {{"dropout", 0.9}, {"learning_rate", 0.001}, {"beta2", 0.999}};
  j["tables"] = {{{"name", "wide"}},
                 {{"name", "deep"}, {"init_scale", 0.03}, {"optimizer", {{"learning_rate", 0.1}}}}};
  auto floats = trainer_config_from_json(j);
  EMBCACHE_ASSERT_OK(floats);
  const std::string text = json(floats.value()).dump();
  for (const char* want : {"\"dropout\":0.9,", "\"learning_rate\":0.001,", "\"beta2\":0.999,",
                           "\"init_scale\":0.03", "\"learning_rate\":0.1}"})
    EXPECT_NE(text.find(want), std::string::npos) << want << " in " << text;
  EXPECT_EQ(text.find("0000000"), std::string::npos) << text;
  EXPECT_EQ(text.find("9999999"), std::string::npos) << text;
  auto reread = trainer_config_from_json(json::parse(text));
  EMBCACHE_ASSERT_OK(reread);
  EXPECT_EQ(reread.value().model.dropout, 0.9f);
  EXPECT_EQ(reread.value().tables[1].init_scale, 0.03f);
  EXPECT_EQ(json(reread.value()), json(floats.value()));
}

// config.move_staged_rows: absent, a run moves its staged rows when its caches are on the host
// and copies them when they are on the device; set, it does what it says; only keyset mode with
// prefetch moves anything. The field round-trips absent, true and false.
TEST(trainer_config, move_staged_rows_defaults_to_where_the_caches_are_and_round_trips) {
  json j = json::parse(R"({"data_dir": "d", "passes": [["a.bin"]]})");
  auto c = trainer_config_from_json(j);
  EMBCACHE_ASSERT_OK(c);
  EXPECT_FALSE(c.value().move_staged_rows.has_value());
  EXPECT_FALSE(json(c.value()).contains("move_staged_rows"));
  EXPECT_TRUE(moves_staged_rows(c.value(), /*caches_on_device=*/false));
  EXPECT_FALSE(moves_staged_rows(c.value(), /*caches_on_device=*/true));
  for (const bool set : {true, false}) {
    j["move_staged_rows"] = set;
    auto s = trainer_config_from_json(j);
    EMBCACHE_ASSERT_OK(s);
    EXPECT_EQ(s.value().move_staged_rows, std::optional<bool>(set));
    EXPECT_EQ(json(s.value())["move_staged_rows"], set);
    EXPECT_EQ(moves_staged_rows(s.value(), false), set);
    EXPECT_EQ(moves_staged_rows(s.value(), true), set);
  }
  trainer_config other = c.value();
  other.prefetch = false;
  EXPECT_FALSE(moves_staged_rows(other, false));
  other = c.value();
  other.mode = trainer_mode::on_demand;
  EXPECT_FALSE(moves_staged_rows(other, false));
  other.mode = trainer_mode::host_hybrid;
  EXPECT_FALSE(moves_staged_rows(other, false));
}

// A stand-in for the cuda backend: the host model under another device name, counting its builds.
int fake_cuda_builds = 0;
std::unique_ptr<dense_backend> fake_cuda(const wide_deep_options& o) {
  ++fake_cuda_builds;
  return make_host_dense_backend(o);
}

// Restores the factory this binary started with (none: it never calls register_cuda_dense_backend).
struct factory_guard {
  ~factory_guard() { set_cuda_dense_backend_factory(nullptr); }
};

TEST(trainer_dense_device, cuda_is_a_clear_error_without_the_cuda_space) {
  ASSERT_EQ(cuda_dense_backend_factory(), nullptr);
  trainer_config c = small_config("dense_device");
  c.dense_device = device_choice::cuda;
  auto t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::unsupported);
  EXPECT_EQ(t.get_status().message(),
            "config.dense_device: \"cuda\" needs the cuda space, and this program was built "
            "without it (build embcache with CUDA, call register_cuda_dense_backend())");
  c.dense_device = static_cast<device_choice>(7);  // no enumerator: refused naming the field
  t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().message(), "config.dense_device: 7 is not a device (host, cuda, auto)");
}

TEST(trainer_dense_device, auto_and_host_say_where_the_network_runs) {
  ASSERT_EQ(cuda_dense_backend_factory(), nullptr);
  trainer_config c = small_config("dense_auto");
  c.passes = {{{shard(0)}}};
  c.save_dir.clear();
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  EXPECT_STREQ(t.value()->model().device(), "host");
  EXPECT_EQ(t.value()->dense_note(),
            "dense network on host (auto: this program has no cuda space)");
  std::vector<std::string> lines;
  t.value()->set_log([&](const std::string& l) { lines.push_back(l); });
  EMBCACHE_ASSERT_OK(t.value()->run());
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[0], "dense network on host (auto: this program has no cuda space)");
  c.dense_device = device_choice::host;
  t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  EXPECT_EQ(t.value()->dense_note(), "dense network on host");
}

TEST(trainer_dense_device, blas_threads_sets_openblas_and_zero_leaves_it) {
  const int before = set_host_blas_threads(0);
  ASSERT_GE(before, 1);
  trainer_config c = small_config("blas_threads");
  c.blas_threads = 0;
  EMBCACHE_ASSERT_OK(trainer::create(c));
  EXPECT_EQ(set_host_blas_threads(0), before);
  c.blas_threads = before + 1;
  EMBCACHE_ASSERT_OK(trainer::create(c));
  EXPECT_EQ(set_host_blas_threads(0), before + 1);
  set_host_blas_threads(before);
  EXPECT_EQ(set_host_blas_threads(0), before);
}

TEST(trainer_dense_device, auto_uses_the_registered_factory_only_with_a_device) {
  factory_guard guard;
  set_cuda_dense_backend_factory(&fake_cuda);
  fake_cuda_builds = 0;
  std::string note;
  const bool device = cuda_device_available();
  auto b =
      make_dense_backend(device_choice::automatic, wide_deep_options{}, host_space{}, &note, "f");
  EMBCACHE_ASSERT_OK(b);
  EXPECT_EQ(fake_cuda_builds, device ? 1 : 0);
  EXPECT_EQ(note, device ? "dense network on host (auto: CUDA device present)"
                         : "dense network on host (auto: no CUDA device)");
  auto c = make_dense_backend(device_choice::cuda, wide_deep_options{}, host_space{}, &note, "f");
  if (device) {
    EMBCACHE_ASSERT_OK(c);
    EXPECT_EQ(fake_cuda_builds, 2);
  } else {
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.get_status().message(), "f: \"cuda\" but no CUDA device is present");
  }
}

// `f` throws embcache::error with `code` and the message `what`.
template <class F>
void expect_error(F&& f, status_code code, const char* what) {
  try {
    f();
    ADD_FAILURE() << "nothing thrown, expected: " << what;
  } catch (const error& e) {
    EXPECT_EQ(e.code(), code);
    EXPECT_STREQ(e.what(), what);
  }
}

// The host network takes host arrays only: device inputs are refused, and the model is untouched.
TEST(trainer_dense_device, the_host_backend_refuses_device_inputs) {
  wide_deep_options o;
  o.num_wide_slots = 2;
  o.num_deep_slots = 2;
  o.deep_dim = 2;
  o.num_dense = 1;
  o.hidden = {4};
  auto b = make_host_dense_backend(o);
  EXPECT_FALSE(b->takes_device_inputs());
  const std::vector<std::uint8_t> before = b->save();
  const float wide[2] = {0.1f, 0.2f}, deep[4] = {0.1f, 0.2f, 0.3f, 0.4f}, dense[1] = {1.0f};
  const float labels[1] = {1.0f};
  float d_wide[2] = {}, d_deep[4] = {};
  const wide_deep_batch batch{1, wide, deep, dense, labels};
  expect_error([&] { (void)b->forward_backward_on_device(batch, 1, d_wide, d_deep); },
               status_code::unsupported,
               "dense_backend::forward_backward_on_device: the dense network on host takes host "
               "arrays (use forward_backward)");
  EXPECT_TRUE(b->save() == before);
  EXPECT_EQ(d_wide[0], 0.0f);
}

// --- where the embeddings live --------------------------------------------------------------

// "cuda" without the cuda path (a host-only build) or without a device is refused naming the
// field; a value no enumerator names too.
TEST(trainer_embedding_device, cuda_is_a_clear_error_without_the_cuda_space_or_a_device) {
  if (auto_embeddings_on_cuda()) GTEST_SKIP() << "a CUDA device is present (tests/cuda runs it)";
  trainer_config c = small_config("embedding_device");
  c.embedding_device = device_choice::cuda;
  auto t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::unsupported);
  EXPECT_EQ(t.get_status().message(),
            EMBCACHE_BUILT_WITH_CUDA
                ? "config.embedding_device: \"cuda\" but no CUDA device is present"
                : "config.embedding_device: \"cuda\" needs the cuda space, and this program was "
                  "built without it (build embcache with CUDA)");
  c.mode = trainer_mode::on_demand;
  t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::unsupported);
  c.embedding_device = static_cast<device_choice>(7);  // no enumerator: refused naming the field
  t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::invalid_argument);
  EXPECT_EQ(t.get_status().message(),
            "config.embedding_device: 7 is not a device (host, cuda, auto)");
}

TEST(trainer_embedding_device, auto_and_host_keep_the_embeddings_on_the_host_and_say_so) {
  trainer_config c = small_config("embedding_auto");
  c.passes = {{{shard(0)}}};
  c.save_dir.clear();
  // "auto" (the host here unless a cuda build runs on a machine with a device: then "host").
  const bool on_cuda = auto_embeddings_on_cuda();
  c.embedding_device = on_cuda ? device_choice::host : device_choice::automatic;
  const std::string note = on_cuda ? "embeddings on host" : auto_host_embeddings_note();
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  EXPECT_STREQ(t.value()->embedding_device(), "host");
  EXPECT_EQ(t.value()->embedding_note(), note);
  std::vector<std::string> lines;
  t.value()->set_log([&](const std::string& l) { lines.push_back(l); });
  EMBCACHE_ASSERT_OK(t.value()->run());
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines[0], "dense network on host (auto: this program has no cuda space)");
  EXPECT_EQ(lines[1], note);
  // The host cache is there; the cuda one is not, and asking for it is a clear error.
  EXPECT_GT(t.value()->counters().total[0].hits + t.value()->counters().total[0].misses, 0u);
  EXPECT_EQ(&t.value()->counters(), &t.value()->cache().counters());
  expect_error([&] { (void)t.value()->cuda_cache(); }, status_code::unsupported,
               "trainer::cuda_cache(): the embeddings are on the host (config.embedding_device); "
               "use trainer::cache()");
  c.embedding_device = device_choice::host;
  t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  EXPECT_EQ(t.value()->embedding_note(), "embeddings on host");
  // Host-hybrid: "auto" means host, and says why.
  c.mode = trainer_mode::host_hybrid;
  c.embedding_device = device_choice::automatic;
  t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  EXPECT_STREQ(t.value()->embedding_device(), "host");
  EXPECT_EQ(t.value()->embedding_note(),
            "embeddings on host (auto: mode host_hybrid keeps them on the host)");
  c.embedding_device = device_choice::cuda;
  t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::invalid_argument);
  EXPECT_EQ(t.get_status().message().rfind(
                "config.embedding_device: \"cuda\" with config.mode \"host_hybrid\": ", 0),
            0u)
      << t.get_status().message();
}

TEST(trainer_embedding_device, a_sharded_run_keeps_them_on_the_host) {
  single_process_communicator one;
  trainer_config c = small_config("embedding_sharded");
  c.passes = {{{shard(0)}}};
  c.save_dir.clear();
  c.embedding_device = device_choice::cuda;
  auto t = trainer::create(c, one);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::unsupported);
  EXPECT_EQ(t.get_status().message(),
            "config.embedding_device: \"cuda\" in a sharded run: it keeps its tables on the host "
            "(use \"host\" or \"auto\")");
  c.embedding_device = device_choice::automatic;
  t = trainer::create(c, one);
  EMBCACHE_ASSERT_OK(t);
  EXPECT_STREQ(t.value()->embedding_device(), "host");
  EXPECT_EQ(t.value()->embedding_note(),
            "embeddings on host (auto: a sharded run keeps them on the host)");
}

// "auto" is the cuda path exactly in a build with the cuda space (the trainer then has it) on a
// machine with a device; host-hybrid and sharded runs never ask for it.
TEST(trainer_embedding_device, auto_is_the_cuda_path_only_in_a_cuda_build_with_a_device) {
  const bool on_cuda = auto_embeddings_on_cuda();
  trainer_config c = small_config("embedding_auto_choice");
  c.save_dir.clear();
  c.embedding_device = device_choice::automatic;
  std::string note;
  auto a = detail::embedding_device_of(c, /*sharded=*/false, &note);
  EMBCACHE_ASSERT_OK(a);
  EXPECT_EQ(a.value(), on_cuda);
  EXPECT_EQ(note, on_cuda ? "embeddings on cuda (auto: CUDA device present)"
                          : auto_host_embeddings_note());
  c.embedding_device = device_choice::cuda;
  a = detail::embedding_device_of(c, /*sharded=*/false, &note);
  if (on_cuda) {
    EMBCACHE_ASSERT_OK(a);
    EXPECT_TRUE(a.value());
    EXPECT_EQ(note, "embeddings on cuda");
  } else {
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.get_status().code(), status_code::unsupported);
  }
  c.embedding_device = device_choice::automatic;
  c.mode = trainer_mode::host_hybrid;
  a = detail::embedding_device_of(c, /*sharded=*/false, &note);
  EMBCACHE_ASSERT_OK(a);
  EXPECT_FALSE(a.value());
  c.mode = trainer_mode::keyset;
  a = detail::embedding_device_of(c, /*sharded=*/true, &note);
  EMBCACHE_ASSERT_OK(a);
  EXPECT_FALSE(a.value());
}

// --- configuration ranges and memory ---------------------------------------------------------

TEST(trainer_config, a_key_given_twice_is_refused_naming_it_and_its_place) {
  auto err = [](const std::string& text) {
    auto c = trainer_config_from_text(text, "run.json");
    return c.ok() ? std::string("ok") : c.get_status().message();
  };
  EXPECT_EQ(err(R"({"passes": [["a.bin"]], "batch_size": 64})"), "ok");
  EXPECT_EQ(err(R"({"passes": [["a.bin"]], "batch_size": 64, "batch_size": 128})"),
            "run.json: duplicate key \"batch_size\" in config (JSON keys must be unique)");
  EXPECT_EQ(err(R"({"passes": [["a.bin"]], "tables": [{"name": "wide"},
                   {"name": "deep", "dim": 8, "dim": 16}]})"),
            "run.json: duplicate key \"dim\" in config.tables[1] (JSON keys must be unique)");
  EXPECT_EQ(err(R"({"passes": [["a.bin"]], "model": {"hidden": [8], "seed": 1, "seed": 2}})"),
            "run.json: duplicate key \"seed\" in config.model (JSON keys must be unique)");
  // The same key in two objects is two keys.
  EXPECT_EQ(err(R"({"passes": [["a.bin"]], "tables": [{"name": "wide", "dim": 1},
                   {"name": "deep", "dim": 8}]})"),
            "ok");
}

TEST(trainer_config, a_config_file_is_read_only_when_it_is_a_small_regular_file) {
  const std::string dir = temp_dir("config_files");
  auto err = [](const std::string& path) {
    auto c = load_trainer_config(path);
    return c.ok() ? std::string("ok") : c.get_status().to_string();
  };
  // Nothing is read from a device, a FIFO (no writer: opening it must not wait) or a folder.
  EXPECT_EQ(err("/dev/zero"),
            "invalid_argument: the configuration file: '/dev/zero' is not a regular file (a "
            "FIFO, a device or a socket is never read)");
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  EXPECT_EQ(err(dir + "/fifo"),
            "invalid_argument: the configuration file: '" + dir +
                "/fifo' is not a regular file (a FIFO, a device or a socket is never read)");
  EXPECT_EQ(err(dir), "invalid_argument: the configuration file: '" + dir +
                          "' is a folder, not a regular file");
  // A file larger than 16 MiB is refused before it is read (a sparse one here).
  const std::string big = dir + "/big.json";
  std::ofstream(big) << "{}";
  fs::resize_file(big, max_trainer_config_bytes + 1);
  EXPECT_EQ(err(big), "invalid_argument: the configuration file: '" + big + "' is 16777217 " +
                          "bytes, more than the 16777216 bytes allowed for it");
  EXPECT_EQ(err(dir + "/missing.json")
                .rfind("not_found: " + dir +
                           "/missing.json: cannot open "
                           "the configuration file (cannot open '",
                       0),
            0u)
      << err(dir + "/missing.json");
  std::ofstream(dir + "/ok.json") << R"({"passes": [["a.bin"]]})";
  EXPECT_EQ(err(dir + "/ok.json"), "ok");
}

TEST(trainer_config, output_names_too_long_for_the_file_system_are_refused_at_validation) {
  const std::string base = temp_dir("config_long");
  trainer_config c = small_config("config_long");
  // A save is published beside its ".tmp" and ".old": 251 bytes is the longest name it takes.
  c.save_dir = base + "/" + std::string(251, 's');
  EMBCACHE_EXPECT_OK(validate(c));
  c.save_dir = base + "/" + std::string(252, 's');
  status s = validate(c);
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_EQ(s.message(), "config.save_dir: '" + c.save_dir + "': the name '" +
                             std::string(252, 's') +
                             "' is 252 bytes long; at most 251 fit (NAME_MAX 255, less 4 for the "
                             "'.tmp' and '.old' folders beside it)");
  // trainer::create checks before anything is built or trained.
  auto t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().message(), s.message());
  c.save_dir = base + "/save";
  c.export_dir = base + "/" + std::string(256, 'e') + "/deltas";
  s = validate(c);
  EXPECT_EQ(s.message(), "config.export_dir: '" + c.export_dir + "': the name '" +
                             std::string(256, 'e') +
                             "' is 256 bytes long; at most 255 fit (NAME_MAX 255)");
  c.export_dir.clear();
  c.output_dir = base;
  for (int i = 0; i < 40; ++i) c.output_dir += "/" + std::string(100, 'o');
  s = validate(c);
  EXPECT_EQ(s.message(), "config.output_dir: '" + c.output_dir + "' is " +
                             std::to_string(c.output_dir.size()) +
                             " bytes long; at most 3584 fit (PATH_MAX 4096, less 512 for the "
                             "files written inside it)");
}

TEST(trainer_config, numbers_out_of_range_name_the_field_and_the_range) {
  auto err = [](const std::string& text) {
    auto c = trainer_config_from_text(text);
    return c.ok() ? std::string("ok") : c.get_status().message();
  };
  const std::string pass = R"("passes": [["a.bin"]])";
  auto with = [&](const std::string& fields) { return "{" + pass + ", " + fields + "}"; };
  auto tables = [&](const std::string& deep) {
    return with(R"("tables": [{"name": "wide"}, {"name": "deep", )" + deep + "}]");
  };
  EXPECT_EQ(err(with(R"("batch_size": 64)")), "ok");
  // Negative numbers used to wrap to huge unsigned values.
  EXPECT_EQ(err(with(R"("model": {"hidden": [32, -1]})")),
            "config text: config.model.hidden[1]: expected an integer in [1, 65536], got -1");
  EXPECT_EQ(err(tables(R"("dim": -3)")),
            "config text: config.tables[1].dim: expected an integer in [1, 4096], got -3");
  EXPECT_EQ(err(tables(R"("capacity": -5)")),
            "config text: config.tables[1].capacity: expected an integer in [1, 1099511627776], "
            "got -5");
  EXPECT_EQ(err(tables(R"("slots": -1)")),
            "config text: config.tables[1].slots: expected an integer in [0, 1099511627776], got "
            "-1");
  EXPECT_EQ(err(with(R"("batch_size": -1)")),
            "config text: config.batch_size: expected an integer in [1, 1048576], got -1");
  EXPECT_EQ(err(with(R"("eval_max_samples": -1)")),
            "config text: config.eval_max_samples: expected an integer in [0, 1125899906842624], "
            "got -1");
  EXPECT_EQ(err(with(R"("seed": -1)")),
            "config text: config.seed: expected an integer in [0, 18446744073709551615], got -1");
  EXPECT_EQ(err(with(R"("threads": -2)")),
            "config text: config.threads: expected an integer in [0, 4096], got -2");
  // An integer field takes JSON integers only.
  EXPECT_EQ(err(with(R"("batch_size": 12.5)")),
            "config text: config.batch_size: expected an integer in [1, 1048576], got 12.5");
  EXPECT_EQ(err(with(R"("batch_size": 1e3)")),
            "config text: config.batch_size: expected an integer in [1, 1048576], got 1000.0");
  EXPECT_EQ(err(with(R"("log_interval": true)")),
            "config text: config.log_interval: expected an integer in [0, 1125899906842624], got "
            "true");
  // Upper bounds.
  EXPECT_EQ(err(with(R"("batch_size": 1048577)")),
            "config text: config.batch_size: expected an integer in [1, 1048576], got 1048577");
  EXPECT_EQ(err(with(R"("threads": 100000)")),
            "config text: config.threads: expected an integer in [0, 4096], got 100000");
  EXPECT_EQ(err(tables(R"("dim": 5000)")),
            "config text: config.tables[1].dim: expected an integer in [1, 4096], got 5000");
  EXPECT_EQ(err(with(R"("model": {"hidden": "wide"})")),
            "config text: config.model.hidden: expected an array of at most 32 widths, each an "
            "integer in [1, 65536], got \"wide\"");
  std::string layers = "[1";
  for (int i = 0; i < 32; ++i) layers += ", 1";
  EXPECT_EQ(err(with(R"("model": {"hidden": )" + layers + "]}")),
            "config text: config.model.hidden: expected an array of at most 32 widths, each an "
            "integer in [1, 65536], got an array");
  // Reals: finite (also as a float), within their range.
  EXPECT_EQ(err(with(R"("model": {"learning_rate": 0})")),
            "config text: config.model.learning_rate: expected a finite number > 0, got 0");
  EXPECT_EQ(err(with(R"("model": {"learning_rate": 1e39})")),
            "config text: config.model.learning_rate: expected a finite number > 0, got 1e+39");
  EXPECT_EQ(err(with(R"("model": {"dropout": 1.0})")),
            "config text: config.model.dropout: expected a number in [0, 1), got 1.0");
  EXPECT_EQ(err(with(R"("model": {"epsilon": -1e-8})")),
            "config text: config.model.epsilon: expected a finite number > 0, got -1e-08");
  EXPECT_EQ(err(tables(R"("init_scale": -0.5)")),
            "config text: config.tables[1].init_scale: expected a number in [0, 1000], got -0.5");
  EXPECT_EQ(err(tables(R"("optimizer": {"learning_rate": -0.1})")),
            "config text: config.tables[1].optimizer.learning_rate: expected a finite number > 0, "
            "got -0.1");
  EXPECT_EQ(err(tables(R"("optimizer": {"kind": "ftrl", "ftrl_lr_power": 0.5})")),
            "config text: config.tables[1].optimizer.ftrl_lr_power: expected a finite number <= "
            "0, got 0.5");
  // Text that is no JSON names its origin.
  EXPECT_EQ(err("{\"passes\": [").rfind("config text: not valid JSON: ", 0), 0u);

  // Configurations built in code get the same checks.
  trainer_config c;
  c.passes = {{{"a.bin"}}};
  c.batch_size = std::size_t(-1);
  EXPECT_EQ(validate(c).message(),
            "config.batch_size: expected an integer in [1, 1048576], got 18446744073709551615");
  c = trainer_config{};
  c.passes = {{{"a.bin"}}};
  c.model.hidden = {32, std::size_t(-1)};
  EXPECT_EQ(validate(c).message(),
            "config.model.hidden[1]: expected an integer in [1, 65536], got 18446744073709551615");
  c.model.hidden = {32};
  c.tables[0].optimizer.learning_rate = std::numeric_limits<float>::infinity();
  EXPECT_EQ(validate(c).message(),
            "config.tables[0].optimizer.learning_rate: expected a finite number > 0, got inf");
}

// A sharded run's fields: "world" (a number of ranks or "auto") and "num_blocks"; a world of
// several ranks needs a launcher (a communicator), and on_demand does not shard.
TEST(trainer_config, world_and_num_blocks_are_checked_and_round_trip) {
  auto parse = [](const std::string& fields) {
    return trainer_config_from_text(R"({"passes": [["a.bin"]], )" + fields + "}");
  };
  auto err = [&](const std::string& fields) {
    auto c = parse(fields);
    return c.ok() ? std::string("ok") : c.get_status().message();
  };
  auto c = parse(R"("world": "auto", "num_blocks": 6)");
  EMBCACHE_ASSERT_OK(c);
  EXPECT_EQ(c.value().world, 0);
  EXPECT_EQ(c.value().num_blocks, 6u);
  EXPECT_EQ(nlohmann::json(c.value()).at("world"), "auto");
  c = parse(R"("world": 4, "mode": "host_hybrid")");
  EMBCACHE_ASSERT_OK(c);
  EXPECT_EQ(c.value().world, 4);
  auto back = trainer_config_from_json(nlohmann::json(c.value()));
  EMBCACHE_ASSERT_OK(back);
  EXPECT_EQ(back.value().world, 4);
  EXPECT_EQ(back.value().num_blocks, 8u);
  EXPECT_EQ(err(R"("world": 0)"),
            "config text: config.world: expected an integer in [1, 1048576], got 0");
  EXPECT_EQ(err(R"("world": "all")"),
            "config text: config.world: expected an integer in [1, 1048576] or \"auto\", got "
            "\"all\"");
  EXPECT_EQ(err(R"("num_blocks": 0)"),
            "config text: config.num_blocks: expected an integer in [1, 65536], got 0");
  EXPECT_EQ(err(R"("world": 3)"),
            "config text: config.num_blocks: 8 blocks do not split over config.world 3 ranks "
            "(must be a multiple of the number of ranks)");
  EXPECT_EQ(err(R"("world": 2, "mode": "on_demand")"),
            "config text: config.mode: \"on_demand\" with config.world 2: a sharded run trains in "
            "mode \"keyset\" or \"host_hybrid\"");
  // Without a communicator, more than one rank is a usage error that says how to launch.
  trainer_config t;
  t.passes = {{{"a.bin"}}};
  t.world = 2;
  auto made = trainer::create(t);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.get_status().message(),
            "config.world: 2 ranks need a launcher: run embcache-train under mpirun -np 2, or "
            "pass a communicator to trainer::create");
}

// tables[i].admission: every field optional, checked naming it, written back only when set.
TEST(trainer_config, admission_is_checked_naming_the_field_and_round_trips) {
  auto parse = [](const std::string& admission, const std::string& mode = "keyset") {
    return trainer_config_from_text(R"({"passes": [["a.bin"]], "mode": ")" + mode +
                                    R"(", "tables": [{"name": "wide"}, {"name": "deep", )"
                                    R"("admission": )" +
                                    admission + "}]}");
  };
  auto err = [&](const std::string& admission, const std::string& mode = "keyset") {
    auto c = parse(admission, mode);
    return c.ok() ? std::string("ok") : c.get_status().message();
  };
  auto c = parse(R"({"min_count": 3, "probability": 0.125, "sketch_width": 1024,
                     "sketch_depth": 3, "seed": 9})");
  EMBCACHE_ASSERT_OK(c);
  const admission_options& a = c.value().tables[1].admission;
  EXPECT_EQ(a.min_count, 3u);
  EXPECT_EQ(a.probability, 0.125);
  EXPECT_EQ(a.sketch_width, 1024u);
  EXPECT_EQ(a.sketch_depth, 3u);
  EXPECT_EQ(a.seed, 9u);
  const nlohmann::json j = c.value();
  EXPECT_FALSE(j["tables"][0].contains("admission"));  // the default: not written
  auto back = trainer_config_from_json(j);
  EMBCACHE_ASSERT_OK(back);
  EXPECT_EQ(nlohmann::json(back.value()), j);
  EXPECT_EQ(back.value().tables[1].admission.sketch_depth, 3u);
  EXPECT_EQ(parse(R"({"min_count": 2})").value().tables[1].admission.sketch_width,
            std::uint64_t{1} << 20);
  EXPECT_EQ(err(R"({"min_count": -1})"),
            "config text: config.tables[1].admission.min_count: expected an integer in [0, "
            "4294967295], got -1");
  EXPECT_EQ(err(R"({"probability": 1.5})"),
            "config text: config.tables[1].admission.probability: expected a number in [0, 1], "
            "got 1.5");
  EXPECT_EQ(err(R"({"sketch_depth": 17})"),
            "config text: config.tables[1].admission.sketch_depth: expected an integer in [1, "
            "16], got 17");
  EXPECT_EQ(err(R"({"sketch_width": 0})"),
            "config text: config.tables[1].admission.sketch_width: expected an integer in [1, "
            "4294967296], got 0");
  EXPECT_EQ(err(R"({"min_cout": 2})"),
            "config text: config.tables[1].admission.min_cout: unknown field");
  EXPECT_EQ(err("3"), "config text: config.tables[1].admission: expected an object");
  // Every mode has it (host-hybrid's shards begin the passes keyset mode's do).
  EXPECT_EQ(err(R"({"min_count": 2})", "host_hybrid"), "ok");
  EXPECT_EQ(err(R"({"min_count": 2})", "on_demand"), "ok");
  // Built in code: the same checks.
  trainer_config t;
  t.passes = {{{"a.bin"}}};
  t.tables[0].admission.sketch_depth = 0;
  EXPECT_EQ(validate(t).message(), "config.tables[0].admission.sketch_depth: 0 is outside [1, 16]");
}

// tables[i].admission.default_row: "zeros" (the default, not written) or "slot", else an error
// naming the field; "slot" needs admission on.
TEST(trainer_config, admission_default_row_is_checked_and_round_trips) {
  auto parse = [](const std::string& admission) {
    return trainer_config_from_text(
        R"({"passes": [["a.bin"]], "tables": [{"name": "wide"}, {"name": "deep", "admission": )" +
        admission + "}]}");
  };
  auto c = parse(R"({"min_count": 2, "default_row": "slot"})");
  EMBCACHE_ASSERT_OK(c);
  EXPECT_EQ(c.value().tables[1].admission.default_row, refused_row::slot);
  EXPECT_EQ(c.value().tables[0].admission.default_row, refused_row::zeros);
  const nlohmann::json j = c.value();
  EXPECT_EQ(j["tables"][1]["admission"]["default_row"], "slot");
  auto back = trainer_config_from_json(j);
  EMBCACHE_ASSERT_OK(back);
  EXPECT_EQ(back.value().tables[1].admission.default_row, refused_row::slot);
  auto zeros = parse(R"({"min_count": 2, "default_row": "zeros"})");
  EMBCACHE_ASSERT_OK(zeros);
  EXPECT_EQ(zeros.value().tables[1].admission.default_row, refused_row::zeros);
  EXPECT_FALSE(nlohmann::json(zeros.value())["tables"][1]["admission"].contains("default_row"));
  EXPECT_EQ(parse(R"({"min_count": 2, "default_row": "mean"})").get_status().message(),
            "config text: config.tables[1].admission.default_row: expected \"zeros\" or "
            "\"slot\", got \"mean\"");
  EXPECT_EQ(parse(R"({"min_count": 2, "default_row": 1})").get_status().message(),
            "config text: config.tables[1].admission.default_row: expected \"zeros\" or "
            "\"slot\", got 1");
  trainer_config t;
  t.passes = {{{"a.bin"}}};
  t.tables[0].admission.default_row = refused_row::slot;
  EXPECT_EQ(validate(t).message(),
            "config.tables[0].admission.default_row: \"slot\" needs admission on (min_count or "
            "probability), as only refused keys read it");
}

TEST(trainer_memory, too_large_for_memory_names_the_field_and_the_bytes) {
  trainer_config c;
  c.passes = {{{"a.bin"}}};
  c.move_staged_rows = false;  // no spare rows: the counts below
  // deep: 1,310,720 slots of (16 + 32) * 4 + 45 bytes, and 4 bytes per bucket of 128 slots
  c.tables[1].capacity = 1 << 20;
  EMBCACHE_EXPECT_OK(check_memory(c, std::uint64_t{1} << 30));
  status s = check_memory(c, 100'000'000);
  EXPECT_EQ(s.code(), status_code::capacity_exceeded);
  EXPECT_EQ(s.message(),
            "config.tables[1].capacity: the cache of table \"deep\" (1310720 slots of 237 bytes) "
            "needs 310681600 bytes, more than the 100000000 bytes of physical memory");
  c.tables[1].slots = 2 << 20;
  EXPECT_EQ(check_memory(c, 100'000'000).message(),
            "config.tables[1].slots: the cache of table \"deep\" (2097152 slots of 237 bytes) "
            "needs 497090560 bytes, more than the 100000000 bytes of physical memory");
  // Sizes whose product does not fit in 64 bits say so instead of wrapping.
  c.tables[1].slots = 0;
  c.tables[1].capacity = std::size_t(-1);
  EXPECT_EQ(check_memory(c, 100'000'000).message(),
            "config.tables[1].capacity: the cache of table \"deep\" (18446744073709551615 rows) "
            "needs more than 2^64 bytes, more than the 100000000 bytes of physical memory");

  // Through trainer::create, against this machine's memory: a clear error, not std::bad_alloc.
  ASSERT_GT(physical_memory_bytes(), 0u);
  // (The default moves staged rows: spare rows for the 1 GiB staging, a row index per slot.)
  c = trainer_config{};
  c.passes = {{{"a.bin"}}};
  c.tables[1].capacity = std::size_t{1} << 40;
  auto t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::capacity_exceeded);
  EXPECT_EQ(t.get_status().message().rfind(
                "config.tables[1].capacity: the cache of table \"deep\" (1374389534720 slots of "
                "241 bytes, 5461333 spare rows of 192 bytes) needs 331271876116416 bytes, more "
                "than the ",
                0),
            0u)
      << t.get_status().to_string();
  c.tables[1].capacity = 1000;
  c.model.hidden.assign(32, 65536);
  t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().message().rfind(
                "config.model.hidden: the dense network's parameters, gradients and Adam state "
                "needs 2130788220944 bytes, more than the ",
                0),
            0u)
      << t.get_status().to_string();
  c.model.hidden = {1024, 1024};
  c.tables[1].dim = 4096;
  c.batch_size = 1 << 20;
  t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().message().rfind("config.batch_size: the buffers of one batch of 1048576 "
                                           "samples needs ",
                                           0),
            0u)
      << t.get_status().to_string();
}

// Caches in the cuda space are not host memory: with caches_on_device they count against the
// device's bytes (out_of_device_memory, same naming), the dense network and the batch still
// against the host's.
TEST(trainer_memory, caches_on_the_device_count_against_the_device) {
  trainer_config c;
  c.passes = {{{"a.bin"}}};
  c.move_staged_rows = false;      // no spare rows on the host either: the counts below
  c.tables[0].capacity = 1 << 20;  // wide: 1,310,720 slots of (1 + 2) * 4 + 45 bytes
  c.tables[1].capacity = 1 << 20;  // deep: 1,310,720 slots of (16 + 32) * 4 + 45 bytes
  memory_budget b;
  b.host_bytes = 100'000'000;
  status s = check_memory(c, b);  // on the host: as check_memory(c, bytes)
  EXPECT_EQ(s.code(), status_code::capacity_exceeded);
  EXPECT_EQ(s.message(), check_memory(c, b.host_bytes).message());
  EXPECT_EQ(s.message(),
            "config.tables[1].capacity: the cache of table \"deep\" (1310720 slots of 237 bytes) "
            "needs 310681600 bytes, more than the 100000000 bytes of physical memory");

  // Too large for the host, on the device: not refused for host memory.
  b.caches_on_device = true;
  EMBCACHE_EXPECT_OK(check_memory(c, b));
  b.device_bytes = 100'000'000;
  s = check_memory(c, b);
  EXPECT_EQ(s.code(), status_code::out_of_device_memory);
  EXPECT_EQ(s.message(),
            "config.tables[1].capacity: the cache of table \"deep\" (1310720 slots of 237 bytes) "
            "needs 310681600 bytes, more than the 100000000 bytes of free device memory");
  // Each fits, not all together: the tables and a pass boundary's scratch for the largest
  // (select_victims: 44 bytes per slot, the first of the equal tables named).
  b.device_bytes = 443'105'279;
  s = check_memory(c, b);
  EXPECT_EQ(s.code(), status_code::out_of_device_memory);
  EXPECT_EQ(s.message(),
            "config.tables: the caches and a pass boundary's scratch need 443105280 bytes together "
            "(config.tables[0].capacity 74752000 bytes, config.tables[1].capacity 310681600 bytes, "
            "config.tables[0].capacity (boundary scratch) 57671680 bytes), more than the "
            "443105279 bytes of free device memory");
  b.device_bytes = 443'105'280;
  EMBCACHE_EXPECT_OK(check_memory(c, b));
  // The dense network and the batch stay on the host's account.
  c.model.hidden = {4096, 4096};
  s = check_memory(c, b);
  EXPECT_EQ(s.code(), status_code::capacity_exceeded);
  EXPECT_EQ(s.message(),
            "config.model.hidden: the dense network's parameters, gradients and Adam state needs "
            "296747024 bytes, more than the 100000000 bytes of physical memory");
  c.model.hidden = {1024};
  b.host_bytes = 13'000'000;  // each host part fits, not both
  s = check_memory(c, b);
  EXPECT_EQ(s.code(), status_code::capacity_exceeded);
  EXPECT_EQ(s.message(),
            "config: the dense network and the batch need 19283984 bytes together "
            "(config.model.hidden 7061520 bytes, config.batch_size 12222464 bytes), more than the "
            "13000000 bytes of physical memory");
}

// In a child process whose address space is capped 300 MB above what it uses: a cache that the
// memory estimate lets through (this machine has the memory) but that cannot be allocated is a
// status naming the tables, not an uncaught std::bad_alloc. Exit 0 when so. (Unused under
// AddressSanitizer, whose test skips.)
[[maybe_unused]] int create_under_an_address_space_limit() {
  if (const int e = embcache::test::cap_address_space_above_use(300u << 20)) return 1 + e;
  trainer_config c;
  c.passes = {{{"a.bin"}}};
  c.model.hidden = {16};
  c.tables[1].capacity = 4 << 20;  // 5,242,880 slots of 232 bytes: 1.2 GB
  auto t = trainer::create(c);
  if (t.ok()) return 4;
  std::fprintf(stderr, "%s\n", t.get_status().to_string().c_str());
  return t.get_status().code() == status_code::capacity_exceeded ? 0 : 5;
}

TEST(trainer_memory, allocation_failure_is_a_status_naming_the_tables) {
#ifdef EMBCACHE_TEST_ASAN
  GTEST_SKIP() << "AddressSanitizer reserves more address space than the cap leaves";
#else
  if (physical_memory_bytes() < (std::uint64_t{4} << 30)) GTEST_SKIP() << "less than 4 GiB";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(create_under_an_address_space_limit()), ::testing::ExitedWithCode(0),
              "capacity_exceeded: config.tables: the training cache of table \"wide\" "
              "\\(config.tables\\[0\\].capacity 1048576\\) and table \"deep\" "
              "\\(config.tables\\[1\\].capacity 4194304\\): out of memory \\(std::bad_alloc\\)");
#endif
}

// The trainer warns when the evaluation shard is one of the training shards (the same file by
// another spelling included).
TEST(trainer_config, an_eval_shard_that_is_also_trained_on_is_warned_about) {
  trainer_config c;
  c.data_dir = "/data/x";
  c.passes = {{{"a.bin"}, {}}, {{"b.bin", "c.bin"}, {}}};
  c.eval_shard = "./c.bin";
  const std::string w = detail::eval_shard_in_training(c, 2);
  EXPECT_EQ(w,
            "warning: config.eval_shard /data/x/c.bin is also a training shard of pass 4: the "
            "evaluation measures samples the model trained on");
  c.eval_shard = "/data/x/../x/a.bin";
  EXPECT_NE(detail::eval_shard_in_training(c, 0).find("of pass 1:"), std::string::npos);
  c.eval_shard = "eval.bin";
  EXPECT_EQ(detail::eval_shard_in_training(c, 0), "");
  c.eval_shard.clear();
  EXPECT_EQ(detail::eval_shard_in_training(c, 0), "");
}

TEST(trainer_config, expiry_fields_are_checked_and_round_trip) {
  auto parse = [](const std::string& expiry, const std::string& mode = "keyset") {
    return trainer_config_from_text(
        R"({"passes": [["a.bin"]], "mode": ")" + mode +
        R"(", "tables": [{"name": "wide"}, {"name": "deep", "expiry": )" + expiry + "}]}");
  };
  auto err = [&](const std::string& expiry, const std::string& mode = "keyset") {
    auto c = parse(expiry, mode);
    return c.ok() ? std::string("ok") : c.get_status().message();
  };
  auto c = parse(R"({"ttl_passes": 7, "min_l2_norm": 0.25})");
  EMBCACHE_ASSERT_OK(c);
  EXPECT_EQ(c.value().tables[1].expiry.ttl_passes, 7u);
  EXPECT_EQ(c.value().tables[1].expiry.min_l2_norm, 0.25f);
  const nlohmann::json printed(c.value());
  EXPECT_EQ(printed.at("tables").at(1).at("expiry"),
            nlohmann::json::parse(R"({"ttl_passes": 7, "min_l2_norm": 0.25})"));
  // Off (the default) is not printed: a configuration without expiry prints as before.
  EXPECT_FALSE(printed.at("tables").at(0).contains("expiry"));
  auto back = trainer_config_from_json(printed);
  EMBCACHE_ASSERT_OK(back);
  EXPECT_EQ(back.value().tables[1].expiry.ttl_passes, 7u);
  EXPECT_EQ(back.value().tables[1].expiry.min_l2_norm, 0.25f);
  EXPECT_EQ(err(R"({})"), "ok");
  EXPECT_EQ(err(R"({"ttl_passes": 3})", "on_demand"), "ok");
  EXPECT_EQ(err(R"({"ttl_passes": -1})"),
            "config text: config.tables[1].expiry.ttl_passes: expected an integer in [0, "
            "4294967295], got -1");
  EXPECT_EQ(err(R"({"ttl_passes": 4294967296})"),
            "config text: config.tables[1].expiry.ttl_passes: expected an integer in [0, "
            "4294967295], got 4294967296");
  EXPECT_EQ(err(R"({"min_l2_norm": -0.5})"),
            "config text: config.tables[1].expiry.min_l2_norm: expected a finite number >= 0, "
            "got -0.5");
  EXPECT_EQ(err(R"({"ttl_pases": 3})"),
            "config text: config.tables[1].expiry.ttl_pases: unknown field");
  EXPECT_EQ(err(R"(3)"), "config text: config.tables[1].expiry: expected an object");
  EXPECT_EQ(err(R"({"ttl_passes": 3})", "host_hybrid"), "ok");
}

// tables[i].expiry.ttl_steps: alone or with ttl_passes, printed only when set, at most
// max_ttl_steps, in every mode, sharded runs included (tests/distributed run them).
TEST(trainer_config, expiry_ttl_steps_is_checked_and_round_trips) {
  auto parse = [](const std::string& expiry, const std::string& mode = "keyset") {
    return trainer_config_from_text(
        R"({"passes": [["a.bin"]], "mode": ")" + mode +
        R"(", "tables": [{"name": "wide"}, {"name": "deep", "expiry": )" + expiry + "}]}");
  };
  auto c = parse(R"({"ttl_steps": 500, "ttl_passes": 3})");
  EMBCACHE_ASSERT_OK(c);
  EXPECT_EQ(c.value().tables[1].expiry.ttl_steps, 500u);
  const nlohmann::json printed(c.value());
  EXPECT_EQ(printed.at("tables").at(1).at("expiry"),
            nlohmann::json::parse(R"({"ttl_passes": 3, "min_l2_norm": 0.0, "ttl_steps": 500})"));
  auto back = trainer_config_from_json(printed);
  EMBCACHE_ASSERT_OK(back);
  EXPECT_EQ(back.value().tables[1].expiry.ttl_steps, 500u);
  EXPECT_TRUE(back.value().tables[1].expiry.enabled());
  EMBCACHE_EXPECT_OK(parse(R"({"ttl_steps": 1})", "on_demand").get_status());
  EMBCACHE_EXPECT_OK(parse(R"({"ttl_steps": 1})", "host_hybrid").get_status());
  EXPECT_FALSE(
      nlohmann::json(parse(R"({"ttl_passes": 2})").value())["tables"][1]["expiry"].contains(
          "ttl_steps"));
  EXPECT_EQ(parse(R"({"ttl_steps": 262145})").get_status().message(),
            "config text: config.tables[1].expiry.ttl_steps: expected an integer in [0, "
            "262144], got 262145");
  trainer_config t;
  t.passes = {{{"a.bin"}}};
  t.tables[0].expiry.ttl_steps = max_ttl_steps + 1;
  EXPECT_EQ(validate(t).message(),
            "config.tables[0].expiry.ttl_steps: expected an integer in [0, 262144], got 262145");
}

// A sharded host-hybrid run admits, expires (by passes and steps) and exports on its owners'
// stores (tests/distributed compare it with one rank): it is built with them all, and bad values
// are still refused naming the field, before anything is built.
TEST(trainer_config, a_sharded_host_hybrid_run_takes_admission_expiry_and_export) {
  single_process_communicator one;
  trainer_config c = small_config("sharded_hybrid_lifecycle");
  c.passes = {{{shard(0)}}};
  c.save_dir.clear();
  c.mode = trainer_mode::host_hybrid;
  c.tables[0].admission.min_count = 2;
  c.tables[1].expiry.ttl_passes = 2;
  c.tables[1].expiry.ttl_steps = 10;
  c.export_dir = temp_dir("sharded_hybrid_lifecycle") + "/deltas";
  auto t = trainer::create(c, one);
  EMBCACHE_ASSERT_OK(t);
  t.value().reset();
  c.tables[0].admission.probability = 1.5;
  t = trainer::create(c, one);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::invalid_argument);
  EXPECT_EQ(t.get_status().message().rfind("config.tables[0].admission.probability: ", 0), 0u)
      << t.get_status().message();
  c.tables[0].admission.probability = 0;
  c.tables[1].expiry.ttl_steps = max_ttl_steps + 1;
  t = trainer::create(c, one);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().message(),
            "config.tables[1].expiry.ttl_steps: expected an integer in [0, 262144], got 262145");
}

}  // namespace
}  // namespace embcache::test
