// The caching allocator. A tensor's memory goes back to its device's cache
// when the last Buffer using it goes, and the next request of the same size
// class takes it instead of asking the driver: on the H200 a driver allocation
// of activation size costs 0.1-1 ms, and a plain-loop GPT step makes hundreds.
//
// Reuse never reorders memory. Queue order already protects submitted work: a
// new user's writes are submitted (or queue-written) after it. What it does
// not protect is work recorded and not yet submitted, which a queue write or
// another thread's submission would overtake; so memory let go while any
// recording is open waits until every recording opened before that moment has
// been submitted or discarded. Memory a captured step graph binds is pinned:
// it is held for the graph while the graph lives, and cached when it goes.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "handle.hpp"

namespace pwt {

class Device;

struct MemoryStats {
  uint64_t allocated = 0;       // bytes of blocks in use by buffers
  uint64_t peak_allocated = 0;  // high-water mark of allocated
  uint64_t reserved = 0;        // allocated, cached and graph: what the driver holds for us
  uint64_t peak_reserved = 0;
  uint64_t cached = 0;  // blocks in the cache, ready or waiting for open recordings
  uint64_t graph = 0;   // blocks no buffer uses any more that captured graphs still bind
  uint64_t driver_allocations = 0;
  uint64_t cache_hits = 0;
};

class BufferCache {
 public:
  explicit BufferCache(Device& dev);
  BufferCache(const BufferCache&) = delete;
  BufferCache& operator=(const BufferCache&) = delete;

  // Bytes of the block a request of `bytes` gets: a multiple of 512 up to
  // 1 MiB, above it one of eight steps per power of two (at most 12.5% more),
  // capped at the device's max_buffer_size.
  uint64_t block_size(uint64_t bytes) const;
  // A storage block of block_size(bytes) bytes, from the cache when one is
  // ready, else new; an out-of-memory from the driver empties the cache and
  // tries once more. Uninitialized (a new one happens to be zeroed by wgpu).
  BufferHandle take(uint64_t bytes, const std::string& label);
  // A block allocated by take() whose last user is gone.
  void give(BufferHandle block, uint64_t bytes);
  // Accounting of blocks in use (cached or not): +bytes when one is handed
  // out, -bytes when its last user goes.
  void note_allocated(int64_t bytes);

  // A recording got its first command (returns its ticket) / ended.
  uint64_t recording_opened();
  void recording_closed(uint64_t ticket);
  // A captured graph binds `b` (counted): while any does, a block let go is
  // held for them, and cached when the last unpins it.
  void pin(WGPUBuffer b);
  void unpin(WGPUBuffer b);

  // Releases every ready block to the driver; the bytes released.
  uint64_t empty();
  MemoryStats stats() const;
  void reset_peaks();

 private:
  void cache_locked(BufferHandle block, uint64_t bytes);
  void release_ready_locked();  // moves waiting blocks no open recording can bind to ready_
  void note_reserved_locked();

  Device& dev_;
  mutable std::mutex mu_;
  std::multimap<uint64_t, BufferHandle> ready_;  // by block size
  struct Waiting {
    uint64_t released_at;
    uint64_t bytes;
    BufferHandle block;
  };
  std::deque<Waiting> waiting_;   // in released_at order
  std::multiset<uint64_t> open_;  // tickets of open recordings
  struct Pin {
    uint32_t graphs = 0;
    BufferHandle held;  // the block, once no buffer uses it
    uint64_t bytes = 0;
  };
  std::unordered_map<WGPUBuffer, Pin> pinned_;
  uint64_t clock_ = 0;  // orders openings and releases
  MemoryStats s_;
  bool poison_ = false;  // PYWGTRAIN_POISON_CACHED: reused blocks are filled with 0xFF (NaN) first
};

}  // namespace pwt
