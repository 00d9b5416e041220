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
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "embcache/serving.hpp"
#include "embcache/synth.hpp"
#include "embcache/trainer/dense_backend.hpp"
#include "embcache/trainer/score.hpp"
#include "embcache/trainer/trainer.hpp"
#include "sharded_history.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;
using test::file_bytes;
using test::scratch;

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

TEST(redis_store, base_and_deltas_land_in_the_documented_layout) {
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
  auto want = nlohmann::json::parse(
      R"({"format":"embcache-redis","format_version":1,"key_type":"int64",
          "tables":[{"name":"emb","dim":4},{"name":"lin","dim":1}]})");
  want["run_id"] = read_model_folder(h.base).value().run_id;  // the run of base and deltas
  EXPECT_EQ(schema, want);
  EXPECT_EQ(srv.command({"HGET", "h:rows", "emb"}), "7");  // 6 - 1 erased + 2 new
  EXPECT_EQ(srv.command({"HGET", "h:rows", "lin"}), "8");
  EXPECT_EQ(srv.command({"EXISTS", "h:lock"}), "0");
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

// Expiry: the tombstone of an expired key deletes it from Redis; Redis then holds the final save.
TEST(redis_store, expired_rows_leave_redis) {
  EMBCACHE_NEED_REDIS();
  const redis_server& srv = redis_server::get();
  const test::history h = test::make_expiring_history(scratch("expired"));
  auto r = redis_push(srv.options("x"), h.base, h.deltas);
  ASSERT_TRUE(r.ok()) << r.get_status().to_string();
  EXPECT_EQ(r.value().keys_deleted, 1u);
  EXPECT_EQ(srv.command({"HEXISTS", "x:table:emb", "1"}), "0");
  EXPECT_EQ(srv.command({"HEXISTS", "x:table:lin", "1"}), "1");
  for (const char* t : {"emb", "lin"}) {
    const auto [keys, vectors] = saved_rows(h.final_save, t);
    EXPECT_EQ(srv.command({"HLEN", std::string("x:table:") + t}), std::to_string(keys.size()));
  }
}

TEST(redis_store, a_gap_stops_the_push_at_the_last_delta_pushed) {
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

// Two writers into one store: while the first holds the store (its hook runs right before its
// EXEC), a second push is refused as "in use" and changes nothing; the first lands whole.
TEST(redis_store, a_second_writer_is_refused_while_one_pushes) {
  EMBCACHE_NEED_REDIS();
  const redis_server& srv = redis_server::get();
  const std::string root = scratch("two_writers");
  const test::history h = test::make_history(root, false);
  redis_options first = srv.options("w");
  status second;
  int commits = 0;
  first.before_commit = [&](const std::string&) {
    if (commits++ == 0) second = redis_push(srv.options("w"), h.base, h.deltas).get_status();
  };
  auto r = redis_push(first, h.base, h.deltas);
  ASSERT_TRUE(r.ok()) << r.get_status().to_string();
  EXPECT_EQ(second.code(), status_code::invalid_argument) << second.to_string();
  EXPECT_NE(second.message().find("prefix 'w' is in use by another writer (lock 'w:lock' is held"),
            std::string::npos)
      << second.message();
  EXPECT_EQ(r.value().deltas, (std::vector<std::uint64_t>{1, 2}));
  EXPECT_EQ(srv.command({"GET", "w:applied"}), "2");
  for (const char* t : {"emb", "lin"}) {
    const auto [keys, vectors] = saved_rows(h.final_save, t);
    EXPECT_EQ(srv.command({"HLEN", std::string("w:table:") + t}), std::to_string(keys.size()));
    EXPECT_EQ(srv.command({"HGET", "w:rows", t}), std::to_string(keys.size()));
  }
  // The lock is gone with its writer, and nothing staged is left behind.
  EXPECT_EQ(srv.command({"EXISTS", "w:lock"}), "0");
  EXPECT_EQ(srv.command({"EVAL", "return #redis.call('KEYS', ARGV[1])", "0", "w:staging:*"}), "0");
}

// A transaction that cannot run whole runs not at all: here another client deletes the staging
// hash of a base right before its EXEC (where a failed RENAME used to let the rest through).
TEST(redis_store, a_base_swap_is_all_or_nothing) {
  EMBCACHE_NEED_REDIS();
  const redis_server& srv = redis_server::get();
  const std::string root = scratch("all_or_nothing");
  const test::history h = test::make_history(root, false);
  ASSERT_TRUE(redis_push(srv.options("a"), h.base, h.deltas).ok());
  const std::string schema = srv.command({"GET", "a:schema"});
  redis_options o = srv.options("a");
  o.before_commit = [&](const std::string& what) {
    if (what.rfind("swapping in base", 0) != 0) return;
    for (const char* t : {"emb", "lin"}) {
      const std::string token = srv.command({"GET", "a:lock"});
      srv.command({"DEL", "a:staging:" + token + ":" + t});
    }
  };
  auto r = redis_push(o, h.final_save, "", {}, /*replace_base=*/true);
  EXPECT_EQ(r.get_status().code(), status_code::io_error) << r.get_status().to_string();
  EXPECT_NE(r.get_status().message().find("nothing of it was applied"), std::string::npos)
      << r.get_status().message();
  EXPECT_EQ(srv.command({"GET", "a:applied"}), "2");
  EXPECT_EQ(srv.command({"GET", "a:schema"}), schema);
  for (const char* t : {"emb", "lin"}) {
    const auto [keys, vectors] = saved_rows(h.final_save, t);
    EXPECT_EQ(srv.command({"HLEN", std::string("a:table:") + t}), std::to_string(keys.size()));
  }
}

// A delta of another run is refused, naming both identities; nothing of it lands.
TEST(redis_store, a_delta_of_another_run_is_refused) {
  EMBCACHE_NEED_REDIS();
  const redis_server& srv = redis_server::get();
  const test::history a = test::make_history(scratch("run_a"), false);
  const test::history d = test::make_history(scratch("run_d"), false);
  const std::string run_a = read_model_folder(a.base).value().run_id;
  const std::string run_d = read_delta_folder(d.deltas + "/delta-000001").value().run_id;
  ASSERT_EQ(run_a.size(), 32u);
  ASSERT_NE(run_a, run_d);
  apply_options none;
  none.until = 0;
  ASSERT_TRUE(redis_push(srv.options("r"), a.base, a.deltas, none).ok());
  auto r = redis_push(srv.options("r"), "", d.deltas);
  EXPECT_EQ(r.get_status().code(), status_code::invalid_argument);
  EXPECT_NE(r.get_status().message().find("'" + d.deltas + "/delta-000001' belongs to run " +
                                          run_d + ", the model in redis 127.0.0.1:"),
            std::string::npos)
      << r.get_status().message();
  EXPECT_NE(r.get_status().message().find(" to run " + run_a), std::string::npos);
  EXPECT_EQ(srv.command({"GET", "r:applied"}), "0");
  EXPECT_NE(srv.command({"GET", "r:schema"}).find(run_a), std::string::npos);
  // Its own run's deltas go on.
  EXPECT_TRUE(redis_push(srv.options("r"), "", a.deltas).ok());
  EXPECT_EQ(srv.command({"GET", "r:applied"}), "2");
}

// A table key renamed behind the store's back: the store no longer holds what its last push left,
// and a reader refuses it instead of scoring every key as a zero row.
TEST(redis_store, a_reader_refuses_a_table_that_lost_its_rows) {
  EMBCACHE_NEED_REDIS();
  const redis_server& srv = redis_server::get();
  const test::history h = test::make_history(scratch("renamed"), false);
  ASSERT_TRUE(redis_push(srv.options("n"), h.base, h.deltas).ok());
  ASSERT_TRUE(redis_rows::connect(srv.options("n")).ok());
  srv.command({"RENAME", "n:table:emb", "n:table:other"});
  auto r = redis_rows::connect(srv.options("n"));
  EXPECT_EQ(r.get_status().code(), status_code::corruption);
  EXPECT_NE(r.get_status().message().find(
                "'n:table:emb' holds 0 rows, the last push left 7 (the key is missing"),
            std::string::npos)
      << r.get_status().message();
}

// A sharded run's save and its ranks' deltas land as the rows of the same history trained by one
// process, at the last delta.
TEST(redis_store, a_sharded_save_and_the_ranks_deltas_land_as_one_process_rows) {
  EMBCACHE_NEED_REDIS();
  const redis_server& srv = redis_server::get();
  const test::sharded_history h = test::make_sharded_history(scratch("sharded"));
  auto r = redis_push(srv.options("sh"), h.base, h.exports);
  ASSERT_TRUE(r.ok()) << r.get_status().to_string();
  EXPECT_TRUE(r.value().base_pushed);
  EXPECT_EQ(r.value().deltas, (std::vector<std::uint64_t>{2, 3}));  // delta 1 is in the save
  EXPECT_EQ(r.value().keys_deleted, 1u);
  EXPECT_EQ(srv.command({"GET", "sh:applied"}), "3");
  for (const char* t : {"emb", "lin"}) {
    const auto [keys, vectors] = saved_rows(h.one_final, t);
    const std::size_t dim = vectors.size() / keys.size();
    EXPECT_EQ(srv.command({"HLEN", std::string("sh:table:") + t}), std::to_string(keys.size()));
    for (std::size_t i = 0; i < keys.size(); ++i)
      EXPECT_EQ(srv.command({"HGET", std::string("sh:table:") + t, std::to_string(keys[i])}),
                std::string(reinterpret_cast<const char*>(&vectors[i * dim]), dim * 4))
          << t << " key " << keys[i];
  }
  const auto schema = nlohmann::json::parse(srv.command({"GET", "sh:schema"}));
  EXPECT_EQ(schema.at("run_id"), test::run_a);
  auto again = redis_push(srv.options("sh"), h.base, h.exports);
  ASSERT_TRUE(again.ok()) << again.get_status().to_string();
  EXPECT_FALSE(again.value().base_pushed);
  EXPECT_TRUE(again.value().deltas.empty());
  // The point of a sharded save is its applied_delta: the store (at delta 3) fits the final save
  // and not the base (delta 1).
  auto m = redis_read_model(srv.options("sh"));
  ASSERT_TRUE(m.ok()) << m.get_status().to_string();
  EXPECT_TRUE(redis_check_model(m.value(), srv.options("sh"), h.final_save, false).ok());
  const status old = redis_check_model(m.value(), srv.options("sh"), h.base, false);
  EXPECT_EQ(old.code(), status_code::invalid_argument);
  EXPECT_NE(old.message().find("stands at version 3 (applied delta 3), the save '" + h.base +
                               "' at version 1"),
            std::string::npos)
      << old.to_string();
}

TEST(redis_address, host_port_and_bracketed_ipv6) {
  auto v4 = parse_redis_address("10.0.0.1:7000");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4.value().host, "10.0.0.1");
  EXPECT_EQ(v4.value().port, 7000);
  auto v6 = parse_redis_address("[::1]:6380");
  ASSERT_TRUE(v6.ok()) << v6.get_status().to_string();
  EXPECT_EQ(v6.value().host, "::1");
  EXPECT_EQ(v6.value().port, 6380);
  for (const char* bad : {"::1:6380", "[::1]", "[]:6380", "[::1:6380", "host:0", ":6379"}) {
    auto r = parse_redis_address(bad);
    EXPECT_EQ(r.get_status().code(), status_code::invalid_argument) << bad;
    EXPECT_NE(r.get_status().message().find("expected HOST:PORT or [IPV6]:PORT"), std::string::npos)
        << bad;
  }
}

// A server with a password: refused without it (naming the server, never the password), served
// with it.
TEST(redis_store, auth_sends_the_password) {
  EMBCACHE_NEED_REDIS();
  const redis_server& srv = redis_server::get();
  const test::history h = test::make_history(scratch("auth"), false);
  ASSERT_EQ(srv.command({"CONFIG", "SET", "requirepass", "s3cret pass"}), "OK");
  auto without = redis_push(srv.options("p"), h.base, h.deltas);
  redis_options o = srv.options("p");
  o.password = "xyzzy-pw";
  auto wrong = redis_push(o, h.base, h.deltas);
  o.password = "s3cret pass";
  auto with = redis_push(o, h.base, h.deltas);
  // Back to no password for the other tests.
  redisContext* c = redisConnect("127.0.0.1", o.port);
  freeReplyObject(redisCommand(c, "AUTH %s", "s3cret pass"));
  freeReplyObject(redisCommand(c, "CONFIG SET requirepass %s", ""));
  redisFree(c);
  EXPECT_EQ(without.get_status().code(), status_code::io_error);
  EXPECT_NE(without.get_status().message().find("NOAUTH"), std::string::npos)
      << without.get_status().message();
  EXPECT_EQ(wrong.get_status().code(), status_code::io_error);
  EXPECT_NE(wrong.get_status().message().find(": AUTH failed: "), std::string::npos)
      << wrong.get_status().message();
  EXPECT_EQ(wrong.get_status().message().find("xyzzy-pw"), std::string::npos);
  ASSERT_TRUE(with.ok()) << with.get_status().to_string();
  EXPECT_EQ(srv.command({"GET", "p:applied"}), "2");
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
    c.dense_device = device_choice::host;  // score_shard runs the dense network on the host
    c.embedding_device = device_choice::host;
    c.crossed = true;         // the wide table takes the crossed keys too
    c.model.hidden = {24, 8};
    c.batch_size = 200;
    c.log_interval = 0;
    c.blas_threads = 1;  // the scorer takes the save's BLAS threads (see below)
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

TEST(serving_trainer, the_trainers_deltas_apply_to_its_final_save) {
  const trained& t = trained_model();
  const std::string copy = scratch("trained_apply") + "/base";
  fs::copy(t.base, copy, fs::copy_options::recursive);
  auto r = apply_deltas(copy, t.deltas);
  ASSERT_TRUE(r.ok()) << r.get_status().to_string();
  // delta 1 was exported before the base was saved: contained, it only moves the position.
  EXPECT_EQ(r.value().deltas, (std::vector<std::uint64_t>{1, 2, 3}));
  // Every file of the final save but `version` (the update clock), `slot_id` included: each delta
  // carries the slot ids of its rows (the trainer's slot_of), so the keys new since the base keep
  // theirs.
  for (const char* table : {"wide", "deep"}) {
    const std::string want = t.final_save + "/sparse/" + table;
    std::size_t compared = 0;
    for (const auto& e : fs::directory_iterator(want)) {
      const std::string f = e.path().filename().string();
      if (f == "version") continue;
      EXPECT_EQ(file_bytes(copy + "/sparse/" + table + "/" + f), file_bytes(want + "/" + f))
          << table << "/" << f;
      ++compared;
    }
    EXPECT_GE(compared, 4u) << table;  // key, emb_vector, slot_id and the optimizer's files
    EXPECT_TRUE(fs::exists(copy + "/sparse/" + table + "/slot_id")) << table;
    EXPECT_TRUE(fs::exists(t.deltas + "/delta-000002/" + table + "/slot_id")) << table;
  }
  const auto manifest = nlohmann::json::parse(file_bytes(copy + "/sparse/manifest.json"));
  for (const auto& e : manifest.at("tables"))
    EXPECT_FALSE(e.contains("rows_without_slot_id")) << e.at("name");
}

TEST(serving_trainer, scores_from_redis_equal_the_trainers_evaluation) {
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
  // Another BLAS setting in the scoring process: the scorer takes the save's (1 thread), so the
  // GEMMs split as in training; score_options.blas_threads overrides it.
  set_host_blas_threads(2);
  score_options two;
  two.blas_threads = 2;
  ASSERT_TRUE(score_shard(t.final_save, shard, *rows.value(), two).ok());
  EXPECT_EQ(set_host_blas_threads(0), 2);
  score_options bad;
  bad.blas_threads = -2;
  const auto refused = score_shard(t.final_save, shard, *rows.value(), bad);
  EXPECT_EQ(refused.get_status().code(), status_code::invalid_argument);
  auto s = score_shard(t.final_save, shard, *rows.value());
  EXPECT_EQ(set_host_blas_threads(0), 1);
  ASSERT_TRUE(s.ok()) << s.get_status().to_string();
  EXPECT_EQ(s.value().samples, t.eval.samples);
  EXPECT_EQ(s.value().auc, t.eval.auc);
  EXPECT_EQ(s.value().logloss, t.eval.logloss);
  EXPECT_GT(t.eval.samples, 0u);
}

#if defined(EMBCACHE_APPLY_EXE) && defined(EMBCACHE_SERVE_EXE)
using test::run_tool;

TEST(serving_tools, apply_into_redis_then_serve_give_the_trainers_metrics) {
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

// embcache-serve checks the store against the save before scoring: a table key renamed, a store
// of other tables, a store of another run.
TEST(serving_tools, serve_refuses_a_store_that_does_not_fit_the_save) {
  EMBCACHE_NEED_REDIS();
  const redis_server& srv = redis_server::get();
  const trained& t = trained_model();
  const std::string serve_args =
      " --model '" + t.final_save + "' --shard '" + t.data + "/" + shard_file_name(3) + "'";
  const auto serve = [&](const std::string& prefix) {
    return run_tool(std::string(EMBCACHE_SERVE_EXE) + " --redis " + srv.address() + " --prefix " +
                    prefix + serve_args);
  };
  // A store at delta 1 with the network of the final save (delta 3): refused by table and
  // version, unless the user asks to score anyway.
  apply_options first;
  first.until = 1;
  ASSERT_TRUE(redis_push(srv.options("pt"), t.base, t.deltas, first).ok());
  const auto behind = serve("pt");
  EXPECT_EQ(behind.first, 1) << behind.second;
  EXPECT_NE(behind.second.find("prefix 'pt': table 'wide' stands at version "), std::string::npos)
      << behind.second;
  EXPECT_NE(
      behind.second.find("(applied delta 1), the save '" + t.final_save + "/sparse' at version"),
      std::string::npos)
      << behind.second;
  const auto anyway = run_tool(std::string(EMBCACHE_SERVE_EXE) + " --redis " + srv.address() +
                               " --prefix pt --allow-other-point" + serve_args);
  EXPECT_EQ(anyway.first, 0) << anyway.second;
  EXPECT_NE(anyway.second.find("applied       1\n"), std::string::npos) << anyway.second;
  ASSERT_TRUE(redis_push(srv.options("ren"), t.base, t.deltas).ok());
  ASSERT_EQ(serve("ren").first, 0);
  const std::string rows = srv.command({"HGET", "ren:rows", "deep"});
  srv.command({"RENAME", "ren:table:deep", "ren:gone"});
  const auto renamed = serve("ren");
  EXPECT_EQ(renamed.first, 1) << renamed.second;
  EXPECT_NE(renamed.second.find("'ren:table:deep' holds 0 rows, the last push left " + rows),
            std::string::npos)
      << renamed.second;
  // A store written before P:rows existed: the schema check still sees the empty table.
  srv.command({"DEL", "ren:rows"});
  const auto old = serve("ren");
  EXPECT_EQ(old.first, 1) << old.second;
  EXPECT_NE(old.second.find("prefix 'ren': table 'deep' holds no rows (key missing?)"),
            std::string::npos)
      << old.second;
  // Other tables.
  const test::history h = test::make_history(scratch("other_tables"), false);
  ASSERT_TRUE(redis_push(srv.options("oth"), h.base, h.deltas).ok());
  const auto other = serve("oth");
  EXPECT_EQ(other.first, 1);
  EXPECT_NE(other.second.find("prefix 'oth' has no table 'wide' of the save '" + t.final_save +
                              "/sparse'"),
            std::string::npos)
      << other.second;
  // Another run's model of the same shape.
  const std::string copy = scratch("other_run") + "/base";
  fs::copy(t.base, copy, fs::copy_options::recursive);
  auto m = nlohmann::json::parse(file_bytes(copy + "/sparse/manifest.json"));
  const std::string ours = m.at("run_id");
  const std::string theirs(32, 'e');
  m["run_id"] = theirs;
  std::ofstream(copy + "/sparse/manifest.json", std::ios::trunc) << m.dump(2);
  ASSERT_TRUE(redis_push(srv.options("run"), copy, "").ok());
  const auto run = serve("run");
  EXPECT_EQ(run.first, 1);
  EXPECT_NE(run.second.find("prefix 'run' holds a model of run " + theirs + ", the save '" +
                            t.final_save + "/sparse' belongs to run " + ours),
            std::string::npos)
      << run.second;
}

// The password from a file or from EMBCACHE_REDIS_PASSWORD, never from the command line.
TEST(serving_tools, apply_takes_the_redis_password_from_a_file_or_the_environment) {
  EMBCACHE_NEED_REDIS();
  const redis_server& srv = redis_server::get();
  const test::history h = test::make_history(scratch("tool_auth"), false);
  const std::string file = scratch("tool_auth_pw") + "/password";
  std::ofstream(file) << "tool pw\n";
  const std::string apply = std::string(EMBCACHE_APPLY_EXE) + " '" + h.base + "' '" + h.deltas +
                            "' --redis " + srv.address();
  ASSERT_EQ(srv.command({"CONFIG", "SET", "requirepass", "tool pw"}), "OK");
  const auto without = run_tool(apply + " --prefix t1");
  const auto from_file = run_tool(apply + " --prefix t2 --redis-password-file '" + file + "'");
  const auto from_env = run_tool("EMBCACHE_REDIS_PASSWORD='tool pw' " + apply + " --prefix t3");
  const auto no_file = run_tool(apply + " --prefix t4 --redis-password-file /nonexistent/pw");
  redisContext* c = redisConnect("127.0.0.1", srv.options("").port);
  freeReplyObject(redisCommand(c, "AUTH %s", "tool pw"));
  freeReplyObject(redisCommand(c, "CONFIG SET requirepass %s", ""));
  redisFree(c);
  EXPECT_EQ(without.first, 1);
  EXPECT_NE(without.second.find("NOAUTH"), std::string::npos) << without.second;
  EXPECT_EQ(from_file.first, 0) << from_file.second;
  EXPECT_EQ(from_env.first, 0) << from_env.second;
  EXPECT_EQ(no_file.first, 1);
  EXPECT_NE(no_file.second.find("--redis-password-file '/nonexistent/pw': cannot read it"),
            std::string::npos)
      << no_file.second;
  EXPECT_EQ(srv.command({"GET", "t2:applied"}), "2");
  EXPECT_EQ(srv.command({"GET", "t3:applied"}), "2");
}

// A server that goes away while embcache-apply writes to it: an error naming the server, exit 1,
// not a silent death by SIGPIPE. The stand-in server answers the lock and the model read (no
// model: the base is pushed), then closes; the base's rows (about 17 MB) are then written to a
// closed connection, which fails with EPIPE after the first write.
TEST(serving_tools, a_server_gone_mid_write_is_an_error_not_sigpipe) {
  const std::string root = scratch("gone");
  {
    table_options<std::int64_t> big;
    big.name = "big";
    big.dim = 64;
    big.capacity = std::size_t{1} << 17;
    training_cache<std::int64_t> tc({}, {big});
    std::vector<std::int64_t> keys(65536);
    for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<std::int64_t>(i);
    tc.begin_pass({keys}).throw_if_error();
    tc.save(root + "/base").throw_if_error();
  }
  fs::create_directories(root + "/deltas");
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(lfd, 1), 0);
  const timeval bound{60, 0};  // a tool that never connects or writes fails the test, no hang
  ::setsockopt(lfd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
  ASSERT_EQ(::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  std::thread server([lfd] {
    const int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0) return;
    const timeval bound{60, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
    // Replies to SET NX (taken), GET schema, GET applied (none), HGETALL versions and rows.
    const char* replies[] = {"+OK\r\n", "$-1\r\n", "$-1\r\n", "*0\r\n", "*0\r\n"};
    std::string in;
    char buf[4096];
    std::size_t answered = 0, at = 0;
    while (answered < 5) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      in.append(buf, static_cast<std::size_t>(n));
      // Each command is "*N\r\n" then N "$len\r\n<bytes>\r\n".
      for (;;) {
        std::size_t p = at;
        const auto line = [&](std::size_t from) { return in.find("\r\n", from); };
        std::size_t e = line(p);
        if (e == std::string::npos) break;
        const long items = std::atol(in.c_str() + p + 1);
        p = e + 2;
        bool whole = true;
        for (long i = 0; i < items && whole; ++i) {
          e = line(p);
          if (e == std::string::npos) {
            whole = false;
            break;
          }
          const std::size_t bytes = std::strtoul(in.c_str() + p + 1, nullptr, 10);
          p = e + 2 + bytes + 2;
          whole = p <= in.size();
        }
        if (!whole) break;
        at = p;
        const std::string r = replies[answered++];
        if (::write(fd, r.data(), r.size()) != static_cast<ssize_t>(r.size())) answered = 5;
        if (answered == 5) break;
      }
    }
    ::close(fd);
  });
  const auto r = run_tool(std::string(EMBCACHE_APPLY_EXE) + " '" + root + "/base' '" + root +
                          "/deltas' --redis 127.0.0.1:" + std::to_string(port));
  server.join();
  ::close(lfd);
  EXPECT_EQ(r.first, 1) << r.second;
  EXPECT_NE(r.second.find("redis 127.0.0.1:" + std::to_string(port) + ": lost the connection"),
            std::string::npos)
      << r.second;
}
#endif

}  // namespace
}  // namespace embcache
