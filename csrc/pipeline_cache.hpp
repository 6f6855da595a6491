// Compute pipelines compiled once per device and looked up by key afterwards.
// A kernel is (shader file, entry point, specialization constants, binding
// layout); constants are emitted as WGSL `const` declarations ahead of the
// shader text, so one .wgsl file serves every tile configuration. The
// shader's shared constants (shader_contract.hpp) are emitted the same way.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
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

// Bindings one kernel may have: the recorder keeps them in fixed storage.
constexpr size_t kMaxBindings = 16;

// The integer key of a kernel on a hot path: `site` identifies the launcher
// family (the address of a string literal or static the launcher owns),
// `variant` and `variant2` pack the constants that vary, `bindings` is the
// set of binding numbers. Equal keys must mean equal KernelDescs; distinct
// sites for the same desc only cost a lookup.
struct KernelKey {
  const void* site;
  uint64_t variant = 0, variant2 = 0, bindings = 0;
  KernelKey(const void* site, std::initializer_list<Slot> slots, uint64_t variant, uint64_t variant2 = 0)
      : site(site), variant(variant), variant2(variant2) {
    for (const Slot& s : slots) bindings |= uint64_t(1) << s.binding;
  }
  bool operator==(const KernelKey& o) const {
    return site == o.site && variant == o.variant && variant2 == o.variant2 && bindings == o.bindings;
  }
};

class PipelineCache {
 public:
  explicit PipelineCache(Device& dev) : dev_(dev) {}
  const Kernel& get(const KernelDesc& desc);
  // The kernel of `key`, found without building strings; `make()` gives its
  // KernelDesc the first time (launchers that run per op: kernel keys built
  // from strings cost more than recording the dispatch).
  template <typename MakeDesc>
  const Kernel& get(const KernelKey& key, MakeDesc&& make) {
    {
      std::lock_guard<std::mutex> lk(keyed_mu_);
      if (auto it = keyed_.find(key); it != keyed_.end()) return *it->second;
    }
    const Kernel& k = get(make());  // not under keyed_mu_: get() takes the device's lock
    std::lock_guard<std::mutex> lk(keyed_mu_);
    keyed_.emplace(key, &k);
    return k;
  }
  // The kernel of one entry of a family: its bindings looked up by entry
  // point in the family's table (unknown entries are a programming error).
  using EntryBindings = std::map<std::string, std::vector<Slot>>;
  const Kernel& get(const std::string& shader, const std::string& entry, const EntryBindings& table,
                    std::vector<std::pair<std::string, std::string>> constants = {},
                    std::vector<std::pair<std::string, std::string>> aliases = {});
  size_t size() const { return kernels_.size(); }

 private:
  struct KeyHash {
    size_t operator()(const KernelKey& k) const {
      uint64_t h = std::hash<const void*>()(k.site);
      for (uint64_t v : {k.variant, k.variant2, k.bindings}) h = (h ^ v) * 0x9e3779b97f4a7c15ull;
      return size_t(h);
    }
  };
  Device& dev_;
  std::map<std::string, std::unique_ptr<Kernel>> kernels_;
  std::mutex keyed_mu_;
  std::unordered_map<KernelKey, const Kernel*, KeyHash> keyed_;
};

}  // namespace pwt
