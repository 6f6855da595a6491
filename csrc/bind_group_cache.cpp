#include "bind_group_cache.hpp"

#include <algorithm>
#include <functional>

#include "errors.hpp"

namespace pwt {

BindGroupCache::Key::Key(WGPUBindGroupLayout layout, const WGPUBindGroupEntry* entries, size_t n)
    : layout(layout), count(uint32_t(n)) {
  if (n > kMaxEntries) throw GpuError("a bind group of more than " + std::to_string(kMaxEntries) + " entries");
  uint64_t h = std::hash<const void*>()(layout);
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x9e3779b97f4a7c15ull; };
  for (size_t i = 0; i < n; ++i) {
    const WGPUBindGroupEntry& e = entries[i];
    bound[i] = {e.buffer, e.offset, e.size, e.binding};
    mix(reinterpret_cast<uintptr_t>(e.buffer));
    mix(e.offset);
    mix(e.size ^ (uint64_t(e.binding) << 48));
  }
  hash = size_t(h);
}

bool BindGroupCache::Key::operator==(const Key& o) const {
  if (layout != o.layout || count != o.count) return false;
  for (uint32_t i = 0; i < count; ++i) {
    const Bound &a = bound[i], &b = o.bound[i];
    if (a.buffer != b.buffer || a.offset != b.offset || a.size != b.size || a.binding != b.binding) return false;
  }
  return true;
}

BindGroupHandle BindGroupCache::find(const Key& key) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) {
    ++misses_;
    return {};
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  wgpuBindGroupAddRef(it->second.group.get());
  return BindGroupHandle(it->second.group.get());
}

void BindGroupCache::keep(const Key& key, WGPUBindGroup group) {
  if (!capacity_) return;
  std::vector<BufferHandle> buffers;
  for (uint32_t i = 0; i < key.count; ++i) {
    const WGPUBuffer b = key.bound[i].buffer;
    if (std::any_of(buffers.begin(), buffers.end(), [b](const BufferHandle& h) { return h.get() == b; })) continue;
    wgpuBufferAddRef(b);
    buffers.emplace_back(b);
  }
  wgpuBindGroupAddRef(group);
  BindGroupHandle held(group);
  std::lock_guard<std::mutex> lk(mu_);
  auto [it, fresh] = map_.try_emplace(key);
  if (!fresh) return;  // another thread kept the same group meanwhile; ours goes
  for (auto& b : buffers) ++uses_[b.get()];
  it->second.group = std::move(held);
  it->second.buffers = std::move(buffers);
  lru_.push_front(&it->first);
  it->second.lru = lru_.begin();
  if (map_.size() > capacity_) erase_locked(map_.find(*lru_.back()));
}

void BindGroupCache::erase_locked(Map::iterator it) {
  for (auto& b : it->second.buffers) {
    auto u = uses_.find(b.get());
    if (u != uses_.end() && --u->second == 0) uses_.erase(u);
  }
  lru_.erase(it->second.lru);
  map_.erase(it);
}

void BindGroupCache::forget(WGPUBuffer b) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!uses_.count(b)) return;  // the common case: nothing cached binds it
  for (auto it = map_.begin(); it != map_.end();) {
    auto next = std::next(it);
    const auto& bufs = it->second.buffers;
    if (std::any_of(bufs.begin(), bufs.end(), [b](const BufferHandle& h) { return h.get() == b; })) erase_locked(it);
    it = next;
  }
}

void BindGroupCache::clear() {
  Map dropped;
  {
    std::lock_guard<std::mutex> lk(mu_);
    dropped.swap(map_);
    lru_.clear();
    uses_.clear();
  }
}

BindGroupStats BindGroupCache::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return {hits_, misses_, map_.size()};
}

}  // namespace pwt
