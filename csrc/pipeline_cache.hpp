// Compute pipelines compiled once per device and looked up by key afterwards.
// A kernel is (shader file, entry point, specialization constants, binding
// layout); constants are emitted as WGSL `const` declarations ahead of the
// shader text, so one .wgsl file serves every tile configuration. The
// shader's shared constants (shader_contract.hpp) are emitted the same way.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "handle.hpp"
#include "shader_contract.hpp"

namespace pwt {

class Device;

struct KernelDesc {
  std::string shader;  // file stem under shaders/
  std::string entry;
  std::vector<Slot> bindings;  // the entry point's bindings, from wgsl::<shader> (shader_contract.hpp)
  std::vector<std::pair<std::string, std::string>> constants;  // (name, WGSL literal)
  // (name, WGSL type), emitted as `alias name = type;`: element types (gemm.wgsl's AB, CT). An f16
  // type also emits `enable f16;` and needs the device's shader-f16 feature.
  std::vector<std::pair<std::string, std::string>> aliases;
  // Skip wgpu's injected bounds checks: only for kernels whose every access is
  // bounds-checked in the shader itself (the checks cost registers and
  // block vectorization in hot loops).
  bool trusted = false;
  std::string key() const;
};

struct Kernel {
  std::string name;
  std::vector<Slot> bindings;
  const Slot* uniform = nullptr;  // the uniform binding in `bindings`, if any
  BindGroupLayoutHandle layout;
  ComputePipelineHandle pipeline;
};

class PipelineCache {
 public:
  explicit PipelineCache(Device& dev) : dev_(dev) {}
  const Kernel& get(const KernelDesc& desc);
  // The kernel of one entry of a family: its bindings looked up by entry
  // point in the family's table (unknown entries are a programming error).
  using EntryBindings = std::map<std::string, std::vector<Slot>>;
  const Kernel& get(const std::string& shader, const std::string& entry, const EntryBindings& table,
                    std::vector<std::pair<std::string, std::string>> constants = {});
  size_t size() const { return kernels_.size(); }

 private:
  Device& dev_;
  std::map<std::string, std::unique_ptr<Kernel>> kernels_;
};

}  // namespace pwt
