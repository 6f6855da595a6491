// Host <-> device copies at the bus's speed. Each device keeps two rings of
// persistent staging buffers, MAP_READ for downloads and MAP_WRITE for
// uploads, and pipelines a large transfer through them in chunks: the GPU
// copies one chunk while the host copies another, and each wait is for one
// submission, never for all of them. Host copies of large chunks are split
// across a few threads (CopyPool). Small uploads go through the queue's own
// write (no submission of their own).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "handle.hpp"

namespace pwt {

class Device;

// The transfer tunables, read once when a Device opens.
struct TransferSettings {
  // PYWGTRAIN_TRANSFER_CHUNK_KIB: bytes one staging buffer carries per copy
  // (the most: transfers of less than `slots` such chunks use smaller ones).
  uint64_t chunk_bytes = 32ull << 20;
  // PYWGTRAIN_TRANSFER_SLOTS: staging buffers per direction (chunks in flight).
  uint32_t slots = 4;
  // PYWGTRAIN_COPY_THREADS: threads (the caller's included) that share one host copy.
  uint32_t copy_threads = 1;
  // PYWGTRAIN_QUEUE_WRITE_MAX_KIB: uploads up to this size use wgpuQueueWriteBuffer.
  uint64_t queue_write_max = 1ull << 20;

  // ArgumentError names a malformed or out-of-range variable.
  static TransferSettings from_env();
};

// Threads that split one large memcpy; the caller takes part too. Workers
// start on the first copy large enough to split and are joined on destruction.
class CopyPool {
 public:
  explicit CopyPool(uint32_t threads) : threads_(threads ? threads : 1) {}
  ~CopyPool();
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;
  void copy(void* dst, const void* src, uint64_t bytes);
  uint32_t threads() const { return threads_; }
  // A part smaller than this is not worth waking a thread for.
  static constexpr uint64_t kMinPart = 1ull << 20;

 private:
  struct Job {
    uint8_t* dst = nullptr;
    const uint8_t* src = nullptr;
    uint64_t bytes = 0, part = 0, parts = 0;
    std::atomic<uint64_t> next{0}, left{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  static void run(Job& job);
  void work();

  uint32_t threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Job> job_;  // the copy in progress (workers hold a reference while they help)
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

class Transfers {
 public:
  Transfers(Device& dev, const TransferSettings& settings);
  ~Transfers();
  Transfers(const Transfers&) = delete;
  Transfers& operator=(const Transfers&) = delete;

  // `bytes` from `src` into `dst` at byte `offset` (a multiple of 4); a
  // ragged tail is padded with zeros to the 4-byte copy granule. Returns once
  // `src` may be reused: the copies are submitted, in queue order.
  void upload(WGPUBuffer dst, uint64_t offset, const void* src, uint64_t bytes);
  // `bytes` from `src` at byte `offset` into `dst`, after all submitted work.
  // Holds the device's lock only to submit and to map and unmap, not while it
  // waits for the GPU or copies on the host, so other threads record
  // meanwhile; see download() for what a read then sees.
  void download(WGPUBuffer src, uint64_t offset, void* dst, uint64_t bytes);
  // Releases every staging buffer (Device::empty_cache); waits for a download in flight.
  void release();

  const TransferSettings& settings() const { return settings_; }
  // (direction, bytes, map state) of each staging buffer, for tests:
  // "unmapped", "pending" or "mapped".
  struct SlotInfo {
    std::string direction, state;
    uint64_t bytes;
  };
  std::vector<SlotInfo> report();

 private:
  struct MapState;
  struct Slot {
    BufferHandle buffer;
    uint64_t bytes = 0;
    std::shared_ptr<MapState> map;  // the map requested last, until it is taken
    uint64_t submission = 0;        // the copy that map waits for
    bool mapped = false;            // mapped and not yet unmapped by us
  };
  Slot& slot(std::vector<Slot>& ring, size_t i, uint64_t need, bool upload);
  uint64_t chunk_for(uint64_t bytes) const;     // the chunk size of a transfer of `bytes`
  static const char* map_state(const Slot& s);  // "mapped", "pending" or "unmapped"
  void unmap(Slot& s);
  void release_ring(std::vector<Slot>& ring);  // under the device's lock
  void request_map(Slot& s, bool write, uint64_t bytes);
  // Waits for the slot's map; GpuError (DeviceLostError) if it failed.
  // `locked`: the caller holds the device's lock (else wait_unlocked).
  void await_map(Slot& s, const std::string& what, bool locked = true);
  // Waits for `done` without wgpu's blocking poll, which holds the device's
  // fence for the whole wait: every other thread's submission (which takes
  // it for writing) would wait as long.
  void wait_unlocked(const std::atomic<bool>& done);
  uint64_t submit_copy(WGPUBuffer src, uint64_t src_off, WGPUBuffer dst, uint64_t dst_off, uint64_t bytes);

  Device& dev_;
  TransferSettings settings_;
  CopyPool pool_;
  std::vector<Slot> down_, up_;
  // Held across a download (which holds the device's lock only in parts):
  // one download at a time uses the ring. Taken before the device's lock.
  std::mutex down_mu_;
};

}  // namespace pwt
