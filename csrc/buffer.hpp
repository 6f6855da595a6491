// Device memory. A Buffer is a storage buffer that can also be copied from and
// to; bytes are rounded up to 4 as wgpu copies require.
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
  uint64_t bytes() const { return bytes_; }
  WGPUBuffer raw() const { return buf_.get(); }
  Device& device() const { return *dev_; }
  const std::shared_ptr<Device>& device_ptr() const { return dev_; }

  void upload(const void* src, uint64_t bytes, uint64_t offset = 0);
  // Blocks until the GPU has produced the data; callers release the GIL.
  void download(void* dst, uint64_t bytes, uint64_t offset = 0) const;

 private:
  std::shared_ptr<Device> dev_;
  BufferHandle buf_;
  uint64_t bytes_;
};

}  // namespace pwt
