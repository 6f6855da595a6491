// Bind groups reused across dispatches. Creating one is most of what recording
// a dispatch costs on the host (wgpu-native validates and tracks every
// binding), and eager code records the same kernel on the same memory again
// and again: the caching allocator hands the same blocks back, and uniform
// blocks are bound with a dynamic offset into a pooled chunk, so such
// dispatches bind identical entries and share one group.
//
// Keys are buffer handles, so an entry must not outlive its buffer's handle:
// each entry holds a reference to every buffer it binds (no other buffer can
// get that address while it lives), and the places that truly let a buffer go
// (the allocator's release, pools dropping a chunk, grow-only scratch
// replaced, device loss) call forget() so that the entry does not keep its
// memory alive. Bounded: the least recently used entry goes first.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "handle.hpp"

namespace pwt {

struct BindGroupStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t entries = 0;
};

class BindGroupCache {
 public:
  static constexpr size_t kMaxEntries = 16;  // = kMaxBindings (pipeline_cache.hpp)

  // What a bind group binds: its layout and each entry's binding, buffer,
  // offset and size (a uniform entry at offset 0, its block's offset given
  // per dispatch).
  struct Key {
    WGPUBindGroupLayout layout = nullptr;
    uint32_t count = 0;
    struct Bound {
      WGPUBuffer buffer;
      uint64_t offset, size;
      uint32_t binding;
    };
    std::array<Bound, kMaxEntries> bound;
    size_t hash = 0;
    Key(WGPUBindGroupLayout layout, const WGPUBindGroupEntry* entries, size_t count);
    bool operator==(const Key& o) const;
  };

  // capacity 0 disables the cache: every get() creates a group.
  explicit BindGroupCache(size_t capacity) : capacity_(capacity) {}
  BindGroupCache(const BindGroupCache&) = delete;
  BindGroupCache& operator=(const BindGroupCache&) = delete;

  // The group binding `entries` (count <= kMaxEntries) with `layout`, as a
  // reference of the caller's own. On a miss `make(descriptor)` creates it
  // and throws if the device refused (the group is then not kept).
  template <typename Make>
  BindGroupHandle get(WGPUBindGroupLayout layout, const WGPUBindGroupEntry* entries, size_t count, Make&& make) {
    const Key key(layout, entries, count);
    if (BindGroupHandle hit = find(key)) return hit;
    WGPUBindGroupDescriptor d = {};
    d.layout = layout;
    d.entryCount = count;
    d.entries = entries;
    BindGroupHandle group = make(d);
    keep(key, group.get());
    return group;
  }
  // `b` is going: entries that bind it go now.
  void forget(WGPUBuffer b);
  void clear();
  size_t capacity() const { return capacity_; }
  BindGroupStats stats() const;

 private:
  struct KeyHash {
    size_t operator()(const Key& k) const { return k.hash; }
  };
  struct Entry {
    BindGroupHandle group;
    std::vector<BufferHandle> buffers;  // each distinct buffer bound, referenced
    std::list<const Key*>::iterator lru;
  };
  using Map = std::unordered_map<Key, Entry, KeyHash>;
  BindGroupHandle find(const Key& key);
  void keep(const Key& key, WGPUBindGroup group);
  void erase_locked(Map::iterator it);

  const size_t capacity_;
  mutable std::mutex mu_;
  Map map_;
  std::list<const Key*> lru_;                      // most recently used first
  std::unordered_map<WGPUBuffer, uint32_t> uses_;  // entries binding each buffer
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace pwt
