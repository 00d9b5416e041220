// The Redis serving store against a real redis-server started on a loopback port: the layout,
// tombstones, the delta position, gaps, and lookup-only scoring equal to the trainer's evaluation.
#include "embcache/redis.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "embcache/serving.hpp"
#include "embcache/synth.hpp"
#include "embcache/trainer/trainer.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;
using test::file_bytes;
using test::scratch;

test::scratch_cleanup cleanup_at_exit;

// redis-server on the PATH, or "".
std::string redis_server_path() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  for (std::size_t b = 0; b <= dirs.size();) {
    const std::size_t e = std::min(dirs.find(':', b), dirs.size());
    const std::string exe = dirs.substr(b, e - b) + "/redis-server";
    if (::access(exe.c_str(), X_OK) == 0) return exe;
    b = e + 1;
  }
  return {};
}

// A port nobody listens on now (the kernel's pick for an ephemeral bind).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// One redis-server process for the whole binary: no persistence, loopback only, stopped at exit.
class redis_server {
 public:
  static redis_server& get() {
    static redis_server s;
    return s;
  }
  bool installed() const { return installed_; }
  bool running() const { return pid_ > 0; }
  const std::string& why_not() const { return why_not_; }
  redis_options options(const std::string& prefix) const {
    redis_options o;
    o.port = port_;
    o.prefix = prefix;
    return o;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // A raw command's reply as text (string, status, integer) or "(nil)".
  std::string command(const std::vector<std::string>& a) const {
    redisContext* c = redisConnect("127.0.0.1", port_);
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& s : a) {
      argv.push_back(s.data());
      lens.push_back(s.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(a.size()), argv.data(), lens.data()));
    std::string out = "(error)";
    if (r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)) {
      out.assign(r->str, r->len);
    } else if (r && r->type == REDIS_REPLY_INTEGER) {
      out = std::to_string(r->integer);
    } else if (r && r->type == REDIS_REPLY_NIL) {
      out = "(nil)";
    }
    if (r) freeReplyObject(r);
    redisFree(c);
    return out;
  }

 private:
  redis_server() {
    const std::string exe = redis_server_path();
    if (exe.empty()) {
      why_not_ = "redis-server is not installed (Debian: redis-server)";
      return;
    }
    installed_ = true;
    dir_ = scratch("redis");
    for (int attempt = 0; attempt < 3 && pid_ <= 0; ++attempt) start(exe);
    if (pid_ <= 0) why_not_ = "redis-server did not answer PING on 127.0.0.1 (" + dir_ + ")";
  }
  ~redis_server() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 500; ++i) {  // at most about 5 s, then SIGKILL
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      ::usleep(10000);
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  void start(const std::string& exe) {
    port_ = free_port();
    const std::string port = std::to_string(port_);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives a test process that crashed
      const std::string log = dir_ + "/redis.log";
      std::freopen(log.c_str(), "w", stdout);
      ::execl(exe.c_str(), exe.c_str(), "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
              "--appendonly", "no", "--dir", dir_.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 1000; ++i) {                        // at most about 10 s
      if (::waitpid(pid, nullptr, WNOHANG) == pid) return;  // exited (port taken?)
      pid_ = pid;
      if (command({"PING"}) == "PONG") return;
      pid_ = -1;
      ::usleep(10000);
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }

  bool installed_ = false;
  pid_t pid_ = -1;
  int port_ = 0;
  std::string dir_, why_not_;
};

// Skips only when redis-server is not installed; a server that does not start fails the test.
#define EMBCACHE_NEED_REDIS()                                                          \
  if (!redis_server::get().installed()) GTEST_SKIP() << redis_server::get().why_not(); \
  ASSERT_TRUE(redis_server::get().running()) << redis_server::get().why_not()

// The keys and emb_vector rows of a saved table.
std::pair<std::vector<std::int64_t>, std::vector<float>> saved_rows(const std::string& model,
                                                                    const std::string& table) {
  auto m = read_model_folder(model);
  m.value();
  for (auto& t : m.value().tables)
    if (t.name == table) return {t.keys, t.vectors};
  return {};
}

TEST(redis_store, BaseAndDeltasLandInTheDocumentedLayout) {
  EMBCACHE_NEED_REDIS();
  const redis_server& srv = redis_server::get();
  const std::string root = scratch("layout");
  const test::history h = test::make_history(root, false);
  auto r = redis_push(srv.options("h"), h.base, h.deltas);
  ASSERT_TRUE(r.ok()) << r.get_status().to_string();
  EXPECT_TRUE(r.value().base_pushed);
  EXPECT_EQ(r.value().deltas, (std::vector<std::uint64_t>{1, 2}));
  EXPECT_EQ(r.value().keys_deleted, 1u);
  EXPECT_EQ(srv.command({"GET", "h:applied"}), "2");
  const auto schema = nlohmann::json::parse(srv.command({"GET", "h:schema"}));
  EXPECT_EQ(schema, nlohmann::json::parse(
                        R"({"format":"embcache-redis","format_version":1,"key_type":"int64",
                            "tables":[{"name":"emb","dim":4},{"name":"lin","dim":1}]})"));
  for (const char* t : {"emb", "lin"}) {
    const auto [keys, vectors] = saved_rows(h.final_save, t);
    const std::size_t dim = vectors.size() / keys.size();
    EXPECT_EQ(srv.command({"HLEN", std::string("h:table:") + t}), std::to_string(keys.size()));
    for (std::size_t i = 0; i < keys.size(); ++i)
      EXPECT_EQ(srv.command({"HGET", std::string("h:table:") + t, std::to_string(keys[i])}),
                std::string(reinterpret_cast<const char*>(&vectors[i * dim]), dim * 4))
          << t << " key " << keys[i];
  }
  EXPECT_EQ(srv.command({"HEXISTS", "h:table:emb", "12"}), "0");  // the tombstone
  EXPECT_EQ(srv.command({"HEXISTS", "h:table:lin", "12"}), "1");
  EXPECT_EQ(srv.command({"EXISTS", "h:staging:emb"}), "0");
  // The versions reached, and a second push that finds nothing new.
  auto m = redis_read_model(srv.options("h"));
  ASSERT_TRUE(m.ok());
  auto fin = read_model_folder(h.final_save);
  auto deltas = read_delta_folder(h.deltas + "/delta-000002");
  EXPECT_EQ(m.value().position.versions[0].second, deltas.value().tables[0].version);
  auto again = redis_push(srv.options("h"), h.base, h.deltas);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again.value().base_pushed);
  EXPECT_TRUE(again.value().deltas.empty());
  EXPECT_EQ(srv.command({"GET", "h:applied"}), "2");
}

TEST(redis_store, AGapStopsThePushAtTheLastDeltaPushed) {
  EMBCACHE_NEED_REDIS();
  const redis_server& srv = redis_server::get();
  const std::string root = scratch("gap");
  const test::history h = test::make_history(root, false);
  fs::rename(h.deltas + "/delta-000001", root + "/delta-000001");
  auto r = redis_push(srv.options("g"), h.base, h.deltas);
  EXPECT_EQ(r.get_status().code(), status_code::invalid_argument);
  EXPECT_NE(r.get_status().message().find("gap before"), std::string::npos)
      << r.get_status().message();
  EXPECT_EQ(srv.command({"GET", "g:applied"}), "0");  // the base only
  EXPECT_EQ(srv.command({"HEXISTS", "g:table:emb", "12"}), "1");
}

// A small trained model: pass 1 saved as the base, passes 2 and 3 resumed from it; a delta
// exported after every pass; the final save; the trainer's own evaluation of the final model.
struct trained {
  std::string data, deltas, base, final_save;
  eval_metrics eval;
};

const trained& trained_model() {
  static const trained t = [] {
    trained r;
    const std::string root = scratch("trained");
    r.data = root + "/data";
    r.deltas = root + "/deltas";
    r.base = root + "/base";
    r.final_save = root + "/final";
    synth_options so;
    so.rows = 4000;
    so.cardinality_scale = 0.01;
    dataset_writer_options wo;
    wo.output_dir = r.data;
    wo.rows_per_shard = 1000;
    write_synth_dataset(so, wo, /*cross=*/true).value();
    trainer_config c;
    c.data_dir = r.data;
    c.passes = {{{shard_file_name(0)}}};
    c.eval_shard = shard_file_name(3);
    c.dense_device = "host";  // score_shard runs the dense network on the host
    c.crossed = true;         // the wide table takes the crossed keys too
    c.model.hidden = {24, 8};
    c.batch_size = 200;
    c.log_interval = 0;
    for (auto& tb : c.tables) tb.capacity = std::size_t{1} << 17;
    c.export_dir = r.deltas;
    c.export_with_state = true;
    c.save_dir = r.base;
    auto first = trainer::create(c);
    first.value()->set_log([](const std::string&) {});
    first.value()->run().throw_if_error();
    c.passes = {{{shard_file_name(1)}}, {{shard_file_name(2)}}};
    c.resume_from = r.base;
    c.save_dir = r.final_save;
    auto rest = trainer::create(c);
    rest.value()->set_log([](const std::string&) {});
    rest.value()->run().throw_if_error();
    r.eval = rest.value()->evaluate().value();
    return r;
  }();
  return t;
}

TEST(serving_trainer, TheTrainersDeltasApplyToItsFinalSave) {
  const trained& t = trained_model();
  const std::string copy = scratch("trained_apply") + "/base";
  fs::copy(t.base, copy, fs::copy_options::recursive);
  auto r = apply_deltas(copy, t.deltas);
  ASSERT_TRUE(r.ok()) << r.get_status().to_string();
  // delta 1 was exported before the base was saved: contained, it only moves the position.
  EXPECT_EQ(r.value().deltas, (std::vector<std::uint64_t>{1, 2, 3}));
  // Every file of the final save but `version` (the update clock) and `slot_id` (deltas carry
  // no slot ids: keys new since the base have none, so apply leaves the file out).
  for (const char* table : {"wide", "deep"}) {
    const std::string want = t.final_save + "/sparse/" + table;
    std::size_t compared = 0;
    for (const auto& e : fs::directory_iterator(want)) {
      const std::string f = e.path().filename().string();
      if (f == "version" || f == "slot_id") continue;
      EXPECT_EQ(file_bytes(copy + "/sparse/" + table + "/" + f), file_bytes(want + "/" + f))
          << table << "/" << f;
      ++compared;
    }
    EXPECT_GE(compared, 3u) << table;  // key, emb_vector and the optimizer's files
    // The base had a slot id for every row (the trainer's slot_of); the deltas bring keys the
    // base did not hold, without slot ids: slot_id is left out and the rows without one counted.
    EXPECT_TRUE(fs::exists(t.base + "/sparse/" + table + "/slot_id")) << table;
    EXPECT_FALSE(fs::exists(copy + "/sparse/" + table + "/slot_id")) << table;
  }
  const auto manifest = nlohmann::json::parse(file_bytes(copy + "/sparse/manifest.json"));
  for (const auto& e : manifest.at("tables"))
    EXPECT_GT(e.value("rows_without_slot_id", 0), 0) << e.at("name");
}

TEST(serving_trainer, ScoresFromRedisEqualTheTrainersEvaluation) {
  EMBCACHE_NEED_REDIS();
  const redis_server& srv = redis_server::get();
  const trained& t = trained_model();
  const std::string shard = t.data + "/" + shard_file_name(3);
  // The base alone scores differently: the deltas matter.
  apply_options none;
  none.until = 0;
  ASSERT_TRUE(redis_push(srv.options("b"), t.base, t.deltas, none).ok());
  auto base_rows = redis_rows::connect(srv.options("b"));
  ASSERT_TRUE(base_rows.ok());
  auto stale = score_shard(t.final_save, shard, *base_rows.value());
  ASSERT_TRUE(stale.ok()) << stale.get_status().to_string();
  EXPECT_NE(stale.value().logloss, t.eval.logloss);
  // Base and every delta pushed: the trainer's bits.
  ASSERT_TRUE(redis_push(srv.options("m"), t.base, t.deltas).ok());
  EXPECT_EQ(srv.command({"GET", "m:applied"}), "3");
  auto rows = redis_rows::connect(srv.options("m"));
  ASSERT_TRUE(rows.ok()) << rows.get_status().to_string();
  auto s = score_shard(t.final_save, shard, *rows.value());
  ASSERT_TRUE(s.ok()) << s.get_status().to_string();
  EXPECT_EQ(s.value().samples, t.eval.samples);
  EXPECT_EQ(s.value().auc, t.eval.auc);
  EXPECT_EQ(s.value().logloss, t.eval.logloss);
  EXPECT_GT(t.eval.samples, 0u);
}

#if defined(EMBCACHE_APPLY_EXE) && defined(EMBCACHE_SERVE_EXE)
using test::run_tool;

TEST(serving_tools, ApplyIntoRedisThenServeGiveTheTrainersMetrics) {
  EMBCACHE_NEED_REDIS();
  const redis_server& srv = redis_server::get();
  const trained& t = trained_model();
  const std::string apply = std::string(EMBCACHE_APPLY_EXE) + " '" + t.base + "' '" + t.deltas +
                            "' --redis " + srv.address() + " --prefix tools";
  const auto a = run_tool(apply);
  ASSERT_EQ(a.first, 0) << a.second;
  EXPECT_NE(a.second.find("base          pushed\ndeltas        1 2 3\napplied       3 (was 0)"),
            std::string::npos)
      << a.second;
  const std::string out = scratch("tools") + "/metrics.json";
  const std::string serve = std::string(EMBCACHE_SERVE_EXE) + " --redis " + srv.address() +
                            " --prefix tools --model '" + t.final_save + "' --shard '" + t.data +
                            "/" + shard_file_name(3) + "' -o '" + out + "'";
  const auto s = run_tool(serve);
  ASSERT_EQ(s.first, 0) << s.second;
  const auto j = nlohmann::json::parse(file_bytes(out));
  EXPECT_EQ(j.at("applied_delta"), 3);
  EXPECT_EQ(j.at("samples"), t.eval.samples);
  EXPECT_EQ(j.at("auc").get<double>(), t.eval.auc);
  EXPECT_EQ(j.at("logloss").get<double>(), t.eval.logloss);
  // Usage errors exit 2, run-time failures 1.
  EXPECT_EQ(run_tool(std::string(EMBCACHE_SERVE_EXE) + " --redis " + srv.address()).first, 2);
  EXPECT_EQ(
      run_tool(std::string(EMBCACHE_SERVE_EXE) + " --redis nowhere --model x --shard y").first, 2);
  const auto missing = run_tool(std::string(EMBCACHE_SERVE_EXE) + " --redis " + srv.address() +
                                " --prefix empty --model x --shard y");
  EXPECT_EQ(missing.first, 1);
  EXPECT_NE(missing.second.find("holds no model under prefix 'empty'"), std::string::npos)
      << missing.second;
}
#endif

}  // namespace
}  // namespace embcache
