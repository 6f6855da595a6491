// Host memory for download destinations (Tensor.numpy()'s arrays). A fresh
// allocation's pages are faulted in and zeroed by the kernel during the first
// write, which halves a download's speed past a few MiB (docs/performance.md,
// "transfers"); blocks that come back from a dead array are kept, already
// faulted, for the next download of their size class. Process-wide (host
// memory belongs to no device), thread-safe; a block taken holds the pool, so
// an array may outlive every Device and the interpreter's own teardown order.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace pwt {

class HostPool {
 public:
  struct Block {
    uint8_t* data = nullptr;
    uint64_t bytes = 0;  // the mapped size: the request's size class
  };
  struct Stats {
    uint64_t in_use = 0, cached = 0, limit = 0, hits = 0, misses = 0;
  };

  // The process's pool; PYWGTRAIN_HOST_CACHE_MIB (read on first use) bounds
  // the bytes it keeps idle (ArgumentError if malformed).
  static std::shared_ptr<HostPool> global();
  explicit HostPool(uint64_t limit) : limit_(limit) {}
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // A block of at least `bytes`: a cached one of the same size class, else
  // freshly mapped (2 MiB aligned, advised to use huge pages: a fault then
  // zeroes 2 MiB at once). std::bad_alloc if the mapping fails.
  Block take(uint64_t bytes);
  // Back to the cache, or unmapped when keeping it would pass the limit.
  void give(Block b);
  // Unmaps every cached block; returns the bytes freed.
  uint64_t release();
  Stats stats() const;

  // Requests below this go to malloc (NumPy's own arrays): its heap reuses them.
  static constexpr uint64_t kMinBytes = 4ull << 20;
  // Whole huge pages up to 16 MiB, then eight steps per power of two.
  static uint64_t size_class(uint64_t bytes);

 private:
  mutable std::mutex mu_;
  std::multimap<uint64_t, uint8_t*> free_;  // size class -> cached blocks
  uint64_t limit_;
  Stats s_;
};

}  // namespace pwt
