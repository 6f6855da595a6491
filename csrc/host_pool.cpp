#include "host_pool.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <new>

#include "env.hpp"

namespace pwt {

namespace {
constexpr uint64_t kHugePage = 2ull << 20;

void unmap(uint8_t* p, uint64_t bytes) { munmap(p, bytes); }
}  // namespace

std::shared_ptr<HostPool> HostPool::global() {
  // 2 GiB by default: a few of the largest downloads a training loop repeats.
  static const std::shared_ptr<HostPool> pool =
      std::make_shared<HostPool>(env_count("PYWGTRAIN_HOST_CACHE_MIB", 2048) << 20);
  return pool;
}

HostPool::~HostPool() { release(); }

uint64_t HostPool::size_class(uint64_t bytes) {
  uint64_t step = kHugePage;
  if (bytes > 16 * kHugePage / 2) {
    uint64_t top = 1;
    while (top <= bytes / 2) top <<= 1;  // the power of two at or below bytes
    step = std::max(kHugePage, top / 8);
  }
  return (bytes + step - 1) / step * step;
}

HostPool::Block HostPool::take(uint64_t bytes) {
  const uint64_t size = size_class(bytes);
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = free_.find(size);
    if (it != free_.end()) {
      Block b{it->second, size};
      free_.erase(it);
      s_.cached -= size;
      s_.in_use += size;
      ++s_.hits;
      return b;
    }
  }
  // Over-map by a huge page and trim both ends, so that the block starts on
  // a huge-page boundary and every 2 MiB of it can be one huge page.
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();  // MemoryError in Python
  auto* p = static_cast<uint8_t*>(raw);
  const uint64_t lead = (kHugePage - reinterpret_cast<uintptr_t>(p) % kHugePage) % kHugePage;
  if (lead) unmap(p, lead);
  unmap(p + lead + size, kHugePage - lead);
  p += lead;
  madvise(p, size, MADV_HUGEPAGE);  // advice only: without THP the block works with small pages
  std::lock_guard<std::mutex> lk(mu_);
  s_.in_use += size;
  ++s_.misses;
  return Block{p, size};
}

void HostPool::give(Block b) {
  if (!b.data) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    s_.in_use -= b.bytes;
    if (s_.cached + b.bytes <= limit_) {
      free_.emplace(b.bytes, b.data);
      s_.cached += b.bytes;
      return;
    }
  }
  unmap(b.data, b.bytes);
}

uint64_t HostPool::release() {
  std::multimap<uint64_t, uint8_t*> idle;
  {
    std::lock_guard<std::mutex> lk(mu_);
    idle.swap(free_);
    s_.cached = 0;
  }
  uint64_t freed = 0;
  for (auto& [bytes, p] : idle) {
    unmap(p, bytes);
    freed += bytes;
  }
  return freed;
}

HostPool::Stats HostPool::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  Stats s = s_;
  s.limit = limit_;
  return s;
}

}  // namespace pwt
