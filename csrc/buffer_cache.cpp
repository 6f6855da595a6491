#include "buffer_cache.hpp"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "device.hpp"
#include "faults.hpp"

namespace pwt {

BufferCache::BufferCache(Device& dev) : dev_(dev) {
  const char* poison = std::getenv("PYWGTRAIN_POISON_CACHED");
  poison_ = poison && *poison && std::string(poison) != "0";
}

uint64_t BufferCache::block_size(uint64_t bytes) const {
  constexpr uint64_t kSmall = 1ull << 20;
  uint64_t size;
  if (bytes <= kSmall) {
    size = std::max<uint64_t>(512, (bytes + 511) & ~uint64_t(511));
  } else {
    uint64_t top = 1;
    while (top <= bytes / 2) top <<= 1;  // the power of two at or below bytes
    const uint64_t step = top / 8;
    size = (bytes + step - 1) / step * step;
  }
  return std::min(size, std::max(bytes, dev_.limits().max_buffer));
}

BufferHandle BufferCache::take(uint64_t bytes, const std::string& label) {
  const uint64_t size = block_size(bytes);
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = ready_.find(size);
    if (it != ready_.end()) {
      BufferHandle b = std::move(it->second);
      ready_.erase(it);
      s_.cached -= size;
      ++s_.cache_hits;
      if (poison_) {
        const std::vector<uint8_t> ff(bytes, 0xFF);
        wgpuQueueWriteBuffer(dev_.queue(), b.get(), 0, ff.data(), (bytes + 3) & ~uint64_t(3));
      }
      return b;
    }
  }
  WGPUBufferDescriptor d = WGPU_BUFFER_DESCRIPTOR_INIT;
  d.label = WGPUStringView{label.data(), label.size()};
  d.size = size;
  d.usage = WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc | WGPUBufferUsage_CopyDst;
  BufferHandle b;
  const std::string what = "allocating " + std::to_string(bytes) + " bytes (" + label + ")";
  try {
    if (fail_this_allocation(kDriverAllocation)) throw OutOfMemoryError(what + ": injected driver failure");
    dev_.guarded(what, [&] { b = BufferHandle(wgpuDeviceCreateBuffer(dev_.raw(), &d)); });
  } catch (const OutOfMemoryError&) {
    if (empty() == 0) throw;
    dev_.guarded(what, [&] { b = BufferHandle(wgpuDeviceCreateBuffer(dev_.raw(), &d)); });
  }
  if (!b) throw OutOfMemoryError(what + ": the device returned no buffer");
  std::lock_guard<std::mutex> lk(mu_);
  ++s_.driver_allocations;
  return b;
}

void BufferCache::give(BufferHandle block, uint64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  auto pin = pinned_.find(block.get());
  if (pin != pinned_.end()) {
    pin->second.held = std::move(block);
    pin->second.bytes = bytes;
    s_.graph += bytes;
    note_reserved_locked();
    return;
  }
  cache_locked(std::move(block), bytes);
}

void BufferCache::cache_locked(BufferHandle block, uint64_t bytes) {
  s_.cached += bytes;
  if (open_.empty()) {
    ready_.emplace(bytes, std::move(block));
  } else {
    waiting_.push_back({++clock_, bytes, std::move(block)});
  }
  note_reserved_locked();
}

void BufferCache::note_allocated(int64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  s_.allocated += uint64_t(bytes);
  s_.peak_allocated = std::max(s_.peak_allocated, s_.allocated);
  note_reserved_locked();
}

void BufferCache::note_reserved_locked() {
  s_.reserved = s_.allocated + s_.cached + s_.graph;
  s_.peak_reserved = std::max(s_.peak_reserved, s_.reserved);
}

uint64_t BufferCache::recording_opened() {
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t ticket = ++clock_;
  open_.insert(ticket);
  return ticket;
}

void BufferCache::recording_closed(uint64_t ticket) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = open_.find(ticket);
  if (it != open_.end()) open_.erase(it);
  release_ready_locked();
}

void BufferCache::release_ready_locked() {
  // A block released at time t may be bound by recordings opened before t;
  // once the oldest open one opened after t, none can.
  const uint64_t oldest_open = open_.empty() ? UINT64_MAX : *open_.begin();
  while (!waiting_.empty() && waiting_.front().released_at < oldest_open) {
    ready_.emplace(waiting_.front().bytes, std::move(waiting_.front().block));
    waiting_.pop_front();
  }
}

void BufferCache::pin(WGPUBuffer b) {
  std::lock_guard<std::mutex> lk(mu_);
  ++pinned_[b].graphs;
}

void BufferCache::unpin(WGPUBuffer b) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = pinned_.find(b);
  if (it == pinned_.end() || --it->second.graphs) return;
  if (it->second.held) {  // the last graph let go of a block no buffer uses: the cache takes it
    s_.graph -= it->second.bytes;
    cache_locked(std::move(it->second.held), it->second.bytes);
  }
  pinned_.erase(it);
}

uint64_t BufferCache::empty() {
  std::multimap<uint64_t, BufferHandle> released;
  uint64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    released.swap(ready_);
    for (auto& kv : released) bytes += kv.first;
    s_.cached -= bytes;
    note_reserved_locked();
  }
  for (auto& kv : released) dev_.bind_groups().forget(kv.second.get());
  return bytes;  // `released` frees them here, outside the lock
}

MemoryStats BufferCache::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return s_;
}

void BufferCache::reset_peaks() {
  std::lock_guard<std::mutex> lk(mu_);
  s_.peak_allocated = s_.allocated;
  s_.peak_reserved = s_.reserved;
}

}  // namespace pwt
