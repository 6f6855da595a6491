#include "buffer.hpp"

#include <algorithm>

#include "faults.hpp"

namespace pwt {

static uint64_t round4(uint64_t n) { return (n + 3) & ~uint64_t(3); }

Buffer::Buffer(std::shared_ptr<Device> dev, uint64_t bytes, const std::string& label, WGPUBufferUsage extra_usage,
               bool zeroed)
    : dev_(std::move(dev)), block_(std::make_shared<Block>()), bytes_(bytes) {
  const uint64_t size = std::max<uint64_t>(4, round4(bytes));
  const auto& lim = dev_->limits();
  if (size > lim.max_buffer)
    throw OutOfMemoryError("allocating " + std::to_string(bytes) + " bytes: exceeds the device's max_buffer_size of " +
                           std::to_string(lim.max_buffer) + " bytes");
  if (fail_this_allocation(label))
    throw OutOfMemoryError("allocating " + std::to_string(bytes) + " bytes (" + label + "): injected failure");
  Block& b = *block_;
  b.dev = dev_;
  b.cached = extra_usage == WGPUBufferUsage_None && !zeroed;
  if (b.cached) {
    b.handle = dev_->memory().take(size, label);
    b.bytes = dev_->memory().block_size(size);
  } else {
    WGPUBufferDescriptor d = WGPU_BUFFER_DESCRIPTOR_INIT;
    d.label = WGPUStringView{label.data(), label.size()};
    d.size = size;
    d.usage = WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc | WGPUBufferUsage_CopyDst | extra_usage;
    dev_->guarded("allocating " + std::to_string(bytes) + " bytes (" + label + ")",
                  [&] { b.handle = BufferHandle(wgpuDeviceCreateBuffer(dev_->raw(), &d)); });
    if (!b.handle)
      throw OutOfMemoryError("allocating " + std::to_string(bytes) + " bytes: the device returned no buffer");
    b.bytes = size;
  }
  dev_->memory().note_allocated(int64_t(b.bytes));
}

Buffer::Block::~Block() {
  if (!bytes) return;
  dev->memory().note_allocated(-int64_t(bytes));
  if (cached)
    dev->memory().give(std::move(handle), bytes);
  else
    dev->bind_groups().forget(handle.get());  // released with this block
}

Buffer::Buffer(const Buffer& parent, uint64_t offset, uint64_t bytes)
    : dev_(parent.dev_), block_(parent.block_), bytes_(bytes), offset_(parent.offset_ + offset) {
  const uint64_t align = std::max<uint32_t>(dev_->limits().storage_offset_alignment, 4);
  if (offset % align)
    throw ArgumentError("buffer view offset " + std::to_string(offset) +
                        " is not a multiple of the storage offset alignment (" + std::to_string(align) + " bytes)");
  if (offset + bytes > parent.bytes_)
    throw ArgumentError("buffer view of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                        " overruns a buffer of " + std::to_string(parent.bytes_) + " bytes");
}

Buffer::Buffer(std::shared_ptr<Device> dev, WGPUBuffer scratch, uint64_t bytes)
    : dev_(std::move(dev)), block_(std::make_shared<Block>()), bytes_(bytes) {
  wgpuBufferAddRef(scratch);
  block_->dev = dev_;
  block_->handle = BufferHandle(scratch);
}

void Buffer::upload(const void* src, uint64_t bytes, uint64_t offset) {
  if (offset + bytes > bytes_)
    throw ArgumentError("upload of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                        " overruns a buffer of " + std::to_string(bytes_) + " bytes");
  if (bytes == 0) return;
  if (offset % 4) throw ArgumentError("upload offset " + std::to_string(offset) + " is not a multiple of 4 bytes");
  dev_->transfers().upload(raw(), offset_ + offset, src, bytes);
}

void Buffer::download(void* dst, uint64_t bytes, uint64_t offset) const {
  if (offset + bytes > bytes_)
    throw ArgumentError("download of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                        " overruns a buffer of " + std::to_string(bytes_) + " bytes");
  if (bytes == 0) return;
  dev_->transfers().download(raw(), offset_ + offset, dst, bytes);
}

}  // namespace pwt
