// Device memory. A Buffer is a storage buffer (or an aligned view of one) that
// can also be copied from and to; bytes are rounded up to 4 as wgpu copies require.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "device.hpp"

namespace pwt {

class Buffer {
 public:
  Buffer(std::shared_ptr<Device> dev, uint64_t bytes, const std::string& label = "pywgtrain.tensor",
         WGPUBufferUsage extra_usage = WGPUBufferUsage_None);
  // A view of `bytes` bytes of `parent` from `offset` (a multiple of the
  // device's storage offset alignment, so every binding inside stays aligned).
  // Views share the parent's memory: flat parameter arenas hand one to each tensor.
  Buffer(const Buffer& parent, uint64_t offset, uint64_t bytes);
  // The first `bytes` bytes of device-owned scratch memory (taking a reference).
  Buffer(std::shared_ptr<Device> dev, WGPUBuffer scratch, uint64_t bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint64_t bytes() const { return bytes_; }
  WGPUBuffer raw() const { return buf_.get(); }
  // Byte offset of this buffer's first byte inside raw().
  uint64_t offset() const { return offset_; }
  Device& device() const { return *dev_; }
  const std::shared_ptr<Device>& device_ptr() const { return dev_; }

  void upload(const void* src, uint64_t bytes, uint64_t offset = 0);
  // Blocks until the GPU has produced the data; callers release the GIL.
  void download(void* dst, uint64_t bytes, uint64_t offset = 0) const;

 private:
  std::shared_ptr<Device> dev_;
  BufferHandle buf_;
  uint64_t bytes_;
  uint64_t offset_ = 0;
  uint64_t owned_bytes_ = 0;  // what this buffer allocated (0 for views and scratch references)
};

}  // namespace pwt
