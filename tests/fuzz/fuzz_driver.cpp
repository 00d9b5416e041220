// The bounded random-mutation driver behind `fuzz_tests`, and the support every target uses.
//
// Each target runs as the test `fuzz.<name>`: first its seed corpus (tests/fuzz/corpus/<name>/)
// and the empty input as they are, then EMBCACHE_FUZZ_ITERATIONS (default 2000) mutants of
// them, stopping early after EMBCACHE_FUZZ_SECONDS (default 30). Mutations are deterministic
// for a given EMBCACHE_FUZZ_SEED (default: derived from the target's name), so CI runs repeat.
// On a failure the input is written to `fuzz-crash-<name>.bin` in the working folder;
// `EMBCACHE_FUZZ_INPUT=<file> fuzz_tests --gtest_filter=fuzz.<name>` replays it alone.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_target.hpp"

#if !defined(EMBCACHE_FUZZ_LIBFUZZER)
#include <gtest/gtest.h>
#endif

namespace fs = std::filesystem;

extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace embcache::fuzz {
namespace {

struct registered {
  std::string name;
  target_fn fn;
};

std::vector<registered>& registry() {
  static std::vector<registered> r;
  return r;
}

// The input being run, for the crash dump. Plain globals: the dump runs in signal handlers.
const char* g_target = nullptr;
const std::uint8_t* g_data = nullptr;
std::size_t g_size = 0;
char g_dump_path[512] = {0};
volatile std::sig_atomic_t g_dumped = 0;

// Async-signal-safe: open/write/close only.
void dump_current_input() {
  if (g_target == nullptr || g_dump_path[0] == 0 || g_dumped) return;
  g_dumped = 1;
  const int fd = ::open(g_dump_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  std::size_t done = 0;
  while (done < g_size) {
    const ssize_t w = ::write(fd, g_data + done, g_size - done);
    if (w <= 0) break;
    done += std::size_t(w);
  }
  ::close(fd);
  const char msg[] = "\nfuzz: the failing input was written to ";
  (void)!::write(2, msg, sizeof msg - 1);
  (void)!::write(2, g_dump_path, std::strlen(g_dump_path));
  (void)!::write(2, "\n", 1);
}

void on_fatal_signal(int sig) {
  dump_current_input();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void on_alarm(int) {
  const char msg[] = "\nfuzz: one input ran for over 20 s (a hang?)";
  (void)!::write(2, msg, sizeof msg - 1);
  dump_current_input();
  ::_exit(3);
}

struct scratch {
  std::string dir;
  scratch() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/embcache-fuzz-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr)
      throw std::runtime_error("fuzz: cannot create a scratch folder from " + pattern);
    dir = buf.data();
  }
  ~scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

bool register_target(const char* name, target_fn fn) {
  registry().push_back({name, fn});
  return true;
}

const std::string& scratch_dir() {
  static scratch s;
  return s.dir;
}

std::string scratch_file(const std::uint8_t* data, std::size_t size, const std::string& name) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  out.close();
  if (!out) throw std::runtime_error("fuzz: cannot write the scratch file " + path);
  return path;
}

std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(scratch_dir()) / name;
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  return dir.string() + "/";
}

void check_failed(const char* file, int line, const char* condition) {
  std::fprintf(stderr, "\nfuzz: %s:%d: invariant violated: %s\n", file, line, condition);
  dump_current_input();
  std::abort();
}

#if !defined(EMBCACHE_FUZZ_LIBFUZZER)
namespace {

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (*end != 0) {
    std::fprintf(stderr, "fuzz: %s='%s' is not a non-negative integer\n", name, v);
    std::exit(2);
  }
  return std::size_t(x);
}

std::vector<std::uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Tokens that parsers of text (TSV, JSON) and numbers tend to mishandle.
const std::vector<std::string>& dictionary() {
  static const std::vector<std::string> d = {"\t",
                                             "\n",
                                             "\r\n",
                                             " ",
                                             ",",
                                             ":",
                                             "\"",
                                             "{",
                                             "}",
                                             "[",
                                             "]",
                                             "null",
                                             "true",
                                             "false",
                                             "-",
                                             "-1",
                                             "0",
                                             "1",
                                             "12.5",
                                             "1e308",
                                             "-1e308",
                                             "1e-320",
                                             "nan",
                                             "NaN",
                                             "inf",
                                             "-inf",
                                             "4294967295",
                                             "4294967296",
                                             "9223372036854775807",
                                             "-9223372036854775808",
                                             "18446744073709551615",
                                             "18446744073709551616",
                                             "0x",
                                             "\\u0000",
                                             "\xff\xfe",
                                             std::string(1, '\0')};
  return d;
}

// Integers that sit on the edges of sizes and counts.
const std::vector<std::uint64_t>& interesting() {
  static const std::vector<std::uint64_t> v = {0,
                                               1,
                                               2,
                                               7,
                                               8,
                                               15,
                                               16,
                                               63,
                                               64,
                                               127,
                                               128,
                                               255,
                                               256,
                                               4095,
                                               4096,
                                               65535,
                                               65536,
                                               0x7fffffffULL,
                                               0x80000000ULL,
                                               0xffffffffULL,
                                               0x100000000ULL,
                                               0x7fffffffffffffffULL,
                                               0x8000000000000000ULL,
                                               0xffffffffffffffffULL,
                                               0xfffffffffffffff0ULL,
                                               0x0fffffffffffffffULL};
  return v;
}

class mutator {
 public:
  mutator(std::uint64_t seed, const std::vector<std::vector<std::uint8_t>>& corpus,
          std::size_t max_size)
      : rng_(seed), corpus_(corpus), max_size_(max_size) {}

  std::vector<std::uint8_t> next() {
    std::vector<std::uint8_t> b = corpus_[pick(corpus_.size())];
    const std::size_t rounds = 1 + pick(4);
    for (std::size_t r = 0; r < rounds; ++r) mutate(b);
    if (b.size() > max_size_) b.resize(max_size_);
    return b;
  }

 private:
  std::size_t pick(std::size_t n) { return n == 0 ? 0 : std::size_t(rng_() % n); }

  void mutate(std::vector<std::uint8_t>& b) {
    switch (pick(10)) {
      case 0:  // flip a bit
        if (!b.empty()) b[pick(b.size())] ^= std::uint8_t(1u << pick(8));
        break;
      case 1:  // a random byte
        if (!b.empty()) b[pick(b.size())] = std::uint8_t(rng_());
        break;
      case 2: {  // an edge integer, 1/2/4/8 bytes, either byte order
        if (b.empty()) break;
        const std::size_t width = std::size_t{1} << pick(4);
        std::uint64_t x = interesting()[pick(interesting().size())];
        if (pick(4) == 0) x = ~x + 1 + pick(3);  // near-negative
        const std::size_t at = pick(b.size());
        const bool big = pick(2) == 0;
        for (std::size_t i = 0; i < width && at + i < b.size(); ++i)
          b[at + i] = std::uint8_t(x >> (8 * (big ? width - 1 - i : i)));
        break;
      }
      case 3: {  // insert random bytes
        const std::size_t n = 1 + pick(16);
        const std::size_t at = pick(b.size() + 1);
        std::vector<std::uint8_t> ins(n);
        for (auto& c : ins) c = std::uint8_t(rng_());
        b.insert(b.begin() + std::ptrdiff_t(at), ins.begin(), ins.end());
        break;
      }
      case 4: {  // delete a range
        if (b.empty()) break;
        const std::size_t at = pick(b.size());
        const std::size_t n = 1 + pick(std::min<std::size_t>(b.size() - at, 64));
        b.erase(b.begin() + std::ptrdiff_t(at), b.begin() + std::ptrdiff_t(at + n));
        break;
      }
      case 5: {  // copy a range elsewhere
        if (b.size() < 2) break;
        const std::size_t from = pick(b.size());
        const std::size_t n = 1 + pick(std::min<std::size_t>(b.size() - from, 64));
        const std::vector<std::uint8_t> chunk(b.begin() + std::ptrdiff_t(from),
                                              b.begin() + std::ptrdiff_t(from + n));
        const std::size_t at = pick(b.size() + 1);
        b.insert(b.begin() + std::ptrdiff_t(at), chunk.begin(), chunk.end());
        break;
      }
      case 6:  // truncate
        b.resize(pick(b.size() + 1));
        break;
      case 7: {  // a dictionary token, inserted or written over
        const std::string& t = dictionary()[pick(dictionary().size())];
        const std::size_t at = pick(b.size() + 1);
        if (pick(2) == 0 || at + t.size() > b.size()) {
          b.insert(b.begin() + std::ptrdiff_t(at), t.begin(), t.end());
        } else {
          std::copy(t.begin(), t.end(), b.begin() + std::ptrdiff_t(at));
        }
        break;
      }
      case 8: {  // splice another seed's tail onto this one's head
        const auto& other = corpus_[pick(corpus_.size())];
        const std::size_t head = pick(b.size() + 1);
        const std::size_t tail = pick(other.size() + 1);
        b.resize(head);
        b.insert(b.end(), other.begin() + std::ptrdiff_t(tail), other.end());
        break;
      }
      default: {  // replace a run of digits with an edge number written out
        if (b.empty()) break;
        std::size_t at = pick(b.size());
        while (at < b.size() && !(b[at] >= '0' && b[at] <= '9')) ++at;
        if (at == b.size()) break;
        std::size_t end = at;
        while (end < b.size() && ((b[end] >= '0' && b[end] <= '9') || b[end] == '.')) ++end;
        std::string num;
        switch (pick(3)) {
          case 0:
            num = std::to_string(interesting()[pick(interesting().size())]);
            break;
          case 1:
            num = "-" + std::to_string(interesting()[pick(interesting().size())]);
            break;
          default:
            num = dictionary()[15 + pick(15)];
            break;
        }
        b.erase(b.begin() + std::ptrdiff_t(at), b.begin() + std::ptrdiff_t(end));
        b.insert(b.begin() + std::ptrdiff_t(at), num.begin(), num.end());
        break;
      }
    }
  }

  std::mt19937_64 rng_;
  const std::vector<std::vector<std::uint8_t>>& corpus_;
  std::size_t max_size_;
};

// Runs one input; false (with the reason in *why) when the target let an exception escape.
bool run_one(const registered& t, const std::vector<std::uint8_t>& input, std::string* why) {
  g_data = input.data();
  g_size = input.size();
  g_dumped = 0;
  ::alarm(20);
  try {
    t.fn(input.data(), input.size());
  } catch (const std::exception& e) {
    ::alarm(0);
    *why = std::string("an exception escaped the parser: ") + e.what();
    dump_current_input();
    return false;
  } catch (...) {
    ::alarm(0);
    *why = "a non-standard exception escaped the parser";
    dump_current_input();
    return false;
  }
  ::alarm(0);
  return true;
}

class fuzz_test : public ::testing::Test {
 public:
  explicit fuzz_test(const registered* t) : t_(t) {}

  void TestBody() override {
    g_target = t_->name.c_str();
    std::snprintf(g_dump_path, sizeof g_dump_path, "fuzz-crash-%s.bin", g_target);
    std::string why;

    if (const char* replay = std::getenv("EMBCACHE_FUZZ_INPUT"); replay && *replay) {
      ASSERT_TRUE(fs::is_regular_file(replay)) << "EMBCACHE_FUZZ_INPUT: no file " << replay;
      const auto input = read_bytes(replay);
      ASSERT_TRUE(run_one(*t_, input, &why)) << replay << ": " << why;
      return;
    }

    const fs::path dir = fs::path(EMBCACHE_FUZZ_CORPUS_DIR) / t_->name;
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    ASSERT_FALSE(files.empty()) << "target " << t_->name << " has no seed corpus in " << dir;

    std::vector<std::vector<std::uint8_t>> corpus;
    std::size_t largest = 0;
    for (const auto& f : files) {
      corpus.push_back(read_bytes(f));
      largest = std::max(largest, corpus.back().size());
      ASSERT_TRUE(run_one(*t_, corpus.back(), &why)) << "seed " << f << ": " << why;
    }
    ASSERT_TRUE(run_one(*t_, {}, &why)) << "the empty input: " << why;

    std::uint64_t seed = std::hash<std::string>{}(t_->name) & 0xffffffffULL;
    seed = env_size("EMBCACHE_FUZZ_SEED", seed);
    const std::size_t iterations = env_size("EMBCACHE_FUZZ_ITERATIONS", 2000);
    const double seconds = double(env_size("EMBCACHE_FUZZ_SECONDS", 30));
    mutator m(seed, corpus, 2 * largest + 4096);
    const auto start = std::chrono::steady_clock::now();
    std::size_t ran = 0;
    for (; ran < iterations; ++ran) {
      const auto input = m.next();
      ASSERT_TRUE(run_one(*t_, input, &why))
          << "mutant " << ran << " (EMBCACHE_FUZZ_SEED=" << seed << "): " << why;
      const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
      if (spent.count() > seconds) {
        ++ran;
        break;
      }
    }
    std::printf("fuzz.%s: %zu seeds and %zu mutants (seed %llu) ran clean\n", g_target,
                corpus.size(), ran, static_cast<unsigned long long>(seed));
    g_target = nullptr;
  }

 private:
  const registered* t_;
};

}  // namespace
#endif  // !EMBCACHE_FUZZ_LIBFUZZER

}  // namespace embcache::fuzz

#if !defined(EMBCACHE_FUZZ_LIBFUZZER)
int main(int argc, char** argv) {
  using namespace embcache::fuzz;
  ::testing::InitGoogleTest(&argc, argv);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, on_fatal_signal);
  std::signal(SIGALRM, on_alarm);
  if (&__sanitizer_set_death_callback != nullptr)
    __sanitizer_set_death_callback(dump_current_input);
  for (const auto& t : registry()) {
    const registered* p = &t;
    ::testing::RegisterTest("fuzz", t.name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                            [p]() -> ::testing::Test* { return new fuzz_test(p); });
  }
  return RUN_ALL_TESTS();
}
#endif
