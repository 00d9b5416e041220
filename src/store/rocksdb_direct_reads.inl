// Direct reads of a MultiGet's blocks submitted together: RocksDB's own file system reads the
// blocks of a MultiRead one pread at a time unless the library was built with io_uring, which
// Debian's is not. Each pread of an O_DIRECT file is a system call, a wake-up of the reading
// thread and, on a virtual disk, a doorbell (an exit to the hypervisor); a MultiGet batch reads up
// to 32 blocks of one SST file. `batched_reads_file_system` opens SST files for direct reads
// itself and submits a MultiRead's blocks as one io_uring submission, then reaps them. Part of
// rocksdb_store.cpp, which includes it.
#pragma once

#include <fcntl.h>
#include <pthread.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#ifdef EMBCACHE_HAVE_LIBURING
#include <liburing.h>
#endif

namespace embcache {
namespace {

// A multiple of every device's logical block size (what O_DIRECT aligns offsets, lengths and
// buffers to).
constexpr std::size_t kDirectAlignment = 4096;

rocksdb::IOStatus read_error(const std::string& name, std::uint64_t offset, std::size_t n,
                             int err) {
  return rocksdb::IOStatus::IOError("while reading " + std::to_string(n) + " bytes at offset " +
                                    std::to_string(offset) + " of " + name + ": " +
                                    std::strerror(err));
}

// Reads [offset, offset + n) of an O_DIRECT file into `scratch` with pread until n bytes or the
// end of the file: a read that ends short of an aligned length has reached it (asking again at
// the unaligned offset would read nothing).
rocksdb::IOStatus pread_fully(int fd, const std::string& name, std::uint64_t offset, std::size_t n,
                              char* scratch, std::size_t* got) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, scratch + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      *got = done;
      return read_error(name, offset + done, n - done, err);
    }
    if (r == 0) break;  // the end of the file
    done += static_cast<std::size_t>(r);
    if (done < n && done % kDirectAlignment != 0) break;
  }
  *got = done;
  return rocksdb::IOStatus::OK();
}

#ifdef EMBCACHE_HAVE_LIBURING

// One ring per thread: a MultiRead is synchronous, so a thread has at most one in flight.
// kRingDepth bounds the reads submitted at once; a longer MultiRead goes in windows of it (a
// MultiGet batch reads at most 32 blocks of a file: two windows).
constexpr unsigned kRingDepth = 16;

// A ring belongs to the process that set it up: after fork() the child's copy shares the
// parent's kernel ring with its own copy of the ring's private indexes, so each process would
// overrun the other's entries. fork() counts itself (pthread_atfork, registered before the first
// ring), and a ring set up before the last fork is set up again.
std::atomic<unsigned> g_forks{0};

struct thread_ring {
  io_uring ring{};
  bool ready = false;
  unsigned forks = 0;
  thread_ring() { set_up(); }
  ~thread_ring() { tear_down(); }
  thread_ring(const thread_ring&) = delete;
  thread_ring& operator=(const thread_ring&) = delete;
  void set_up() {
    forks = g_forks.load(std::memory_order_relaxed);
    ready = io_uring_queue_init(kRingDepth, &ring, 0) == 0;
  }
  // Unmaps this process's view of the ring and closes its descriptor.
  void tear_down() {
    if (ready) io_uring_queue_exit(&ring);
    ready = false;
  }
};

thread_ring& this_thread_ring() {
  thread_local thread_ring ring;
  if (ring.forks != g_forks.load(std::memory_order_relaxed)) {
    // A copy from before a fork(); its reads were the parent's, none is this process's.
    ring.tear_down();
    ring.set_up();
  }
  return ring;
}

// Whether this process may use io_uring for reads: the kernel has it, no seccomp filter or
// sysctl forbids it, and it knows IORING_OP_READ (5.6 on; rings set up on older kernels fail
// every such read). Asked once.
bool io_uring_usable() {
  static const bool usable = [] {
    if (::pthread_atfork(nullptr, nullptr,
                         [] { g_forks.fetch_add(1, std::memory_order_relaxed); }) != 0)
      return false;
    io_uring probe_ring{};
    if (io_uring_queue_init(1, &probe_ring, 0) != 0) return false;
    io_uring_probe* probe = io_uring_get_probe_ring(&probe_ring);
    const bool reads = probe && io_uring_opcode_supported(probe, IORING_OP_READ);
    if (probe) io_uring_free_probe(probe);
    io_uring_queue_exit(&probe_ring);
    return reads;
  }();
  return usable;
}

#else

bool io_uring_usable() { return false; }

#endif

// rocksdb_batched_reads_done()'s counts.
std::atomic<std::uint64_t> g_batched_multi_reads{0};
std::atomic<std::uint64_t> g_batched_blocks{0};

// An SST file opened with O_DIRECT whose MultiRead submits its blocks together.
class batched_reads_file final : public rocksdb::FSRandomAccessFile {
 public:
  batched_reads_file(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  ~batched_reads_file() override { ::close(fd_); }
  batched_reads_file(const batched_reads_file&) = delete;
  batched_reads_file& operator=(const batched_reads_file&) = delete;

  rocksdb::IOStatus Read(std::uint64_t offset, std::size_t n, const rocksdb::IOOptions&,
                         rocksdb::Slice* result, char* scratch,
                         rocksdb::IODebugContext*) const override {
    std::size_t got = 0;
    rocksdb::IOStatus st = pread_fully(fd_, name_, offset, n, scratch, &got);
    *result = rocksdb::Slice(scratch, got);
    return st;
  }

  rocksdb::IOStatus MultiRead(rocksdb::FSReadRequest* reqs, std::size_t num_reqs,
                              const rocksdb::IOOptions& options,
                              rocksdb::IODebugContext* dbg) override {
#ifdef EMBCACHE_HAVE_LIBURING
    if (num_reqs > 1) {
      thread_ring& tr = this_thread_ring();
      if (tr.ready) {
        if (submit_together(tr.ring, reqs, num_reqs)) {
          g_batched_multi_reads.fetch_add(1, std::memory_order_relaxed);
          g_batched_blocks.fetch_add(num_reqs, std::memory_order_relaxed);
          return rocksdb::IOStatus::OK();
        }
        // The ring failed (not a read: a read's own error is in its status). Its reads are
        // reaped; the thread reads with pread from now on, starting with these.
        tr.ready = false;
      }
    }
#endif
    for (std::size_t i = 0; i < num_reqs; ++i)
      reqs[i].status = Read(reqs[i].offset, reqs[i].len, options, &reqs[i].result,
                            reqs[i].scratch, dbg);
    return rocksdb::IOStatus::OK();
  }

  bool use_direct_io() const override { return true; }
  std::size_t GetRequiredBufferAlignment() const override { return kDirectAlignment; }
  // Direct I/O: the page cache holds nothing of the file.
  rocksdb::IOStatus InvalidateCache(std::size_t, std::size_t) override {
    return rocksdb::IOStatus::OK();
  }

 private:
#ifdef EMBCACHE_HAVE_LIBURING
  // Submits up to kRingDepth reads at a time and reaps them; false when the ring itself fails
  // (every read it took is reaped first: their buffers are the caller's).
  bool submit_together(io_uring& ring, rocksdb::FSReadRequest* reqs, std::size_t num_reqs) {
    int res[kRingDepth];
    for (std::size_t base = 0; base < num_reqs; base += kRingDepth) {
      const std::size_t count = std::min<std::size_t>(kRingDepth, num_reqs - base);
      for (std::size_t i = 0; i < count; ++i) {
        rocksdb::FSReadRequest& r = reqs[base + i];
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        if (!sqe) return false;  // not expected of an empty ring; nothing is submitted yet
        io_uring_prep_read(sqe, fd_, r.scratch, static_cast<unsigned>(r.len), r.offset);
        io_uring_sqe_set_data64(sqe, i);
      }
      // Submitted (retried while the kernel takes them only in part), then waited for in one
      // call: the completions are then all in the ring.
      std::size_t submitted = 0;
      for (int tries = 0; submitted < count; ++tries) {
        const int sub = io_uring_submit(&ring);
        if (sub > 0) submitted += static_cast<std::size_t>(sub);
        else if (tries > 100 || (sub < 0 && sub != -EINTR && sub != -EAGAIN && sub != -EBUSY))
          return reap(ring, submitted);
      }
      io_uring_cqe* first = nullptr;
      int w;
      do w = io_uring_wait_cqe_nr(&ring, &first, static_cast<unsigned>(count));
      while (w == -EINTR);
      if (w < 0) return reap(ring, count);
      // The whole window is reaped before any result is set (which allocates): the ring is
      // empty again whatever happens next.
      for (std::size_t left = count; left > 0; --left) {
        io_uring_cqe* cqe = nullptr;
        do w = io_uring_wait_cqe(&ring, &cqe);
        while (w == -EINTR);
        if (w < 0) return reap(ring, left);
        res[io_uring_cqe_get_data64(cqe)] = cqe->res;
        io_uring_cqe_seen(&ring, cqe);
      }
      for (std::size_t i = 0; i < count; ++i) finish(reqs[base + i], res[i]);
    }
    return true;
  }

  // Sets a request's result from its completion `res` (bytes read or -errno). A read the ring
  // could not do (an interrupted one, or a file system that refuses it there) is done with
  // pread, whose error, if any, is the one reported.
  void finish(rocksdb::FSReadRequest& r, int res) const {
    std::size_t got = 0;
    if (res < 0) {
      r.status = pread_fully(fd_, name_, r.offset, r.len, r.scratch, &got);
    } else {
      got = static_cast<std::size_t>(res);
      r.status = rocksdb::IOStatus::OK();
      // Short of an aligned length: the end of the file. Short but aligned: the rest is read.
      if (got > 0 && got < r.len && got % kDirectAlignment == 0) {
        std::size_t more = 0;
        r.status = pread_fully(fd_, name_, r.offset + got, r.len - got, r.scratch + got, &more);
        got += more;
      }
    }
    r.result = rocksdb::Slice(r.scratch, got);
  }

  // Waits for the `in_flight` reads the kernel still owns; false. It does not return before
  // they are done: their buffers are the caller's, freed once MultiRead returns.
  static bool reap(io_uring& ring, std::size_t in_flight) {
    for (int failures = 0; in_flight > 0;) {
      io_uring_cqe* cqe = nullptr;
      const int w = io_uring_wait_cqe(&ring, &cqe);
      if (w == 0) {
        io_uring_cqe_seen(&ring, cqe);
        --in_flight;
      } else if (w != -EINTR && ++failures > 10000) {
        std::fprintf(stderr, "embcache: io_uring fails to return %zu reads (%s)\n", in_flight,
                     std::strerror(-w));
        std::abort();  // returning would let the kernel write into freed buffers
      } else if (w != -EINTR) {
        ::usleep(1000);
      }
    }
    return false;
  }
#endif

  int fd_;
  std::string name_;
};

// RocksDB's default file system, but SST files opened for direct reads are batched_reads_files.
class batched_reads_file_system final : public rocksdb::FileSystemWrapper {
 public:
  batched_reads_file_system() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "embcache-batched-reads"; }

  rocksdb::IOStatus NewRandomAccessFile(const std::string& fname,
                                        const rocksdb::FileOptions& file_opts,
                                        std::unique_ptr<rocksdb::FSRandomAccessFile>* result,
                                        rocksdb::IODebugContext* dbg) override {
    if (!file_opts.use_direct_reads || file_opts.use_mmap_reads)
      return target()->NewRandomAccessFile(fname, file_opts, result, dbg);
    int fd;
    do fd = ::open(fname.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    // RocksDB's own file system names what went wrong (a missing file, a file system without
    // O_DIRECT) as the rest of the database expects it.
    if (fd < 0) return target()->NewRandomAccessFile(fname, file_opts, result, dbg);
    try {
      result->reset(new batched_reads_file(fd, fname));
    } catch (...) {
      ::close(fd);
      throw;
    }
    return rocksdb::IOStatus::OK();
  }
};

// The environment of databases whose direct reads are batched: Env::Default()'s threads, clock
// and compaction pools with the file system above. One per process, never destroyed (RocksDB's
// background threads may use it until exit).
rocksdb::Env* batched_reads_env() {
  static rocksdb::Env* env =
      rocksdb::NewCompositeEnv(std::make_shared<batched_reads_file_system>()).release();
  return env;
}

}  // namespace

bool rocksdb_batched_reads_available() noexcept { return io_uring_usable(); }

rocksdb_batched_read_counts rocksdb_batched_reads_done() noexcept {
  rocksdb_batched_read_counts c;
  c.multi_reads = g_batched_multi_reads.load(std::memory_order_relaxed);
  c.blocks = g_batched_blocks.load(std::memory_order_relaxed);
  return c;
}

}  // namespace embcache
