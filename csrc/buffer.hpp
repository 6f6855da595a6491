// Device memory. A Buffer is a storage buffer (or an aligned view of one) that
// can also be copied from and to; bytes are rounded up to 4 as wgpu copies require.
// Plain storage memory comes from the device's caching allocator
// (buffer_cache.hpp) and goes back to it when the Buffer and its views are gone.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "device.hpp"

namespace pwt {

class Buffer {
 public:
  // Uninitialized memory from the cache, unless `zeroed` or `extra_usage`
  // asks for a new buffer of its own (wgpu zero-fills those).
  Buffer(std::shared_ptr<Device> dev, uint64_t bytes, const std::string& label = "pywgtrain.tensor",
         WGPUBufferUsage extra_usage = WGPUBufferUsage_None, bool zeroed = false);
  // A view of `bytes` bytes of `parent` from `offset` (a multiple of the
  // device's storage offset alignment, so every binding inside stays aligned).
  // Views share the parent's memory: flat parameter arenas hand one to each tensor.
  Buffer(const Buffer& parent, uint64_t offset, uint64_t bytes);
  // The first `bytes` bytes of device-owned scratch memory (taking a reference).
  Buffer(std::shared_ptr<Device> dev, WGPUBuffer scratch, uint64_t bytes);
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint64_t bytes() const { return bytes_; }
  WGPUBuffer raw() const { return block_->handle.get(); }
  // Byte offset of this buffer's first byte inside raw().
  uint64_t offset() const { return offset_; }
  Device& device() const { return *dev_; }
  const std::shared_ptr<Device>& device_ptr() const { return dev_; }

  void upload(const void* src, uint64_t bytes, uint64_t offset = 0);
  // Blocks until the GPU has produced the data; callers release the GIL.
  void download(void* dst, uint64_t bytes, uint64_t offset = 0) const;

 private:
  // The wgpu buffer a Buffer and its views share; the last one to go gives
  // it back to the cache (or releases it).
  struct Block {
    std::shared_ptr<Device> dev;
    BufferHandle handle;
    uint64_t bytes = 0;  // what it counts in the device's memory stats (0 for scratch references)
    bool cached = false;
    ~Block();
  };
  std::shared_ptr<Device> dev_;
  std::shared_ptr<Block> block_;
  uint64_t bytes_;
  uint64_t offset_ = 0;
};

}  // namespace pwt
