// Move-only owners for wgpu handles: every handle the core creates is released
// exactly once, on every path, by the destructor of one of these.
#pragma once
#include <string>
#include <utility>
#include <webgpu.h>
#include <wgpu.h>

namespace pwt {

template <typename T, void (*Release)(T)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(T raw) : raw_(raw) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : raw_(std::exchange(o.raw_, nullptr)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      raw_ = std::exchange(o.raw_, nullptr);
    }
    return *this;
  }
  ~Handle() { reset(); }
  void reset() {
    if (raw_) Release(std::exchange(raw_, nullptr));
  }
  T get() const { return raw_; }
  explicit operator bool() const { return raw_ != nullptr; }

 private:
  T raw_ = nullptr;
};

using InstanceHandle = Handle<WGPUInstance, wgpuInstanceRelease>;
using AdapterHandle = Handle<WGPUAdapter, wgpuAdapterRelease>;
using DeviceHandle = Handle<WGPUDevice, wgpuDeviceRelease>;
using QueueHandle = Handle<WGPUQueue, wgpuQueueRelease>;
using BufferHandle = Handle<WGPUBuffer, wgpuBufferRelease>;
using ShaderModuleHandle = Handle<WGPUShaderModule, wgpuShaderModuleRelease>;
using BindGroupLayoutHandle = Handle<WGPUBindGroupLayout, wgpuBindGroupLayoutRelease>;
using PipelineLayoutHandle = Handle<WGPUPipelineLayout, wgpuPipelineLayoutRelease>;
using ComputePipelineHandle = Handle<WGPUComputePipeline, wgpuComputePipelineRelease>;
using BindGroupHandle = Handle<WGPUBindGroup, wgpuBindGroupRelease>;
using CommandEncoderHandle = Handle<WGPUCommandEncoder, wgpuCommandEncoderRelease>;
using ComputePassHandle = Handle<WGPUComputePassEncoder, wgpuComputePassEncoderRelease>;
using CommandBufferHandle = Handle<WGPUCommandBuffer, wgpuCommandBufferRelease>;
using QuerySetHandle = Handle<WGPUQuerySet, wgpuQuerySetRelease>;

inline WGPUStringView sv(const char* s) { return WGPUStringView{s, WGPU_STRLEN}; }
inline std::string to_string(WGPUStringView v) {
  if (!v.data) return {};
  return v.length == WGPU_STRLEN ? std::string(v.data) : std::string(v.data, v.length);
}

}  // namespace pwt
