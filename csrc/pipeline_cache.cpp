#include "pipeline_cache.hpp"

#include <sstream>

#include "device.hpp"
#include "shaders.hpp"

namespace pwt {

std::string KernelDesc::key() const {
  std::string k = shader + ":" + entry;
  for (auto& [name, value] : constants) k += ";" + name + "=" + value;
  for (auto& [name, type] : aliases) k += ";" + name + ":" + type;
  if (trusted) k += ";trusted";
  return k;
}

const Kernel& PipelineCache::get(const std::string& shader, const std::string& entry, const EntryBindings& table,
                                 std::vector<std::pair<std::string, std::string>> constants,
                                 std::vector<std::pair<std::string, std::string>> aliases) {
  const auto it = table.find(entry);
  if (it == table.end()) throw std::logic_error("no bindings listed for " + shader + ":" + entry);
  KernelDesc d;
  d.shader = shader;
  d.entry = entry;
  d.bindings = it->second;
  d.constants = std::move(constants);
  d.aliases = std::move(aliases);
  return get(d);
}

const Kernel& PipelineCache::get(const KernelDesc& desc) {
  std::lock_guard<std::recursive_mutex> lk(dev_.mutex());
  const std::string key = desc.key();
  if (auto it = kernels_.find(key); it != kernels_.end()) return *it->second;

  auto& sources = embedded_shaders();
  auto src_it = sources.find(desc.shader);
  if (src_it == sources.end()) throw GpuError("unknown shader '" + desc.shader + "'");
  // `enable` directives must precede every declaration, so they go first.
  std::string enables, body, line;
  std::istringstream lines(src_it->second);
  while (std::getline(lines, line)) {
    if (line.rfind("enable ", 0) == 0) {
      enables += line + "\n";
    } else if (line.rfind("//!include ", 0) == 0) {  // shared helper functions
      auto inc = sources.find(line.substr(11));
      if (inc == sources.end()) throw GpuError(desc.shader + ".wgsl includes unknown shader '" + line.substr(11) + "'");
      body += inc->second + "\n";
    } else {
      body += line + "\n";
    }
  }
  // Every binding must be one the shader declares (shader_contract.hpp), at
  // most one of them the uniform block.
  const ShaderInterface* contract = shader_interface(desc.shader);
  if (!contract) throw GpuError("shader '" + desc.shader + "' has no interface in shader_contract.hpp");
  size_t uniforms = 0;
  for (const Slot& slot : desc.bindings) {
    bool declared = false;
    for (const Slot& s : contract->slots)
      declared = declared || (s.binding == slot.binding && s.kind == slot.kind && std::string(s.var) == slot.var);
    if (!declared)
      throw GpuError(key + ": binding " + std::to_string(slot.binding) + " (" + slot.var +
                     ") is not in the shader's interface");
    uniforms += slot.kind == Bind::Uniform;
  }
  if (uniforms > 1) throw GpuError(key + ": more than one uniform binding");
  for (const Slot& slot : desc.bindings)  // KernelKey keeps them as a 64-bit set
    if (slot.binding >= 64) throw GpuError(key + ": binding number " + std::to_string(slot.binding) + " above 63");
  if (desc.bindings.size() > kMaxBindings)
    throw GpuError(key + ": more than " + std::to_string(kMaxBindings) + " bindings (kMaxBindings)");
  bool half = false;
  for (auto& [name, type] : desc.aliases) half = half || type.find("f16") != std::string::npos;
  if (half && enables.find("enable f16;") == std::string::npos) {
    if (!dev_.has_feature(WGPUFeatureName_ShaderF16))
      throw ArgumentError(key + ": float16 kernels need the adapter's shader-f16 feature, which " + dev_.info().name +
                          " does not offer");
    enables += "enable f16;\n";
  }
  std::string code = enables;
  for (auto& [name, value] : contract->constants) code += "const " + name + ": u32 = " + std::to_string(value) + "u;\n";
  for (auto& [name, value] : desc.constants) code += "const " + name + " = " + value + ";\n";
  for (auto& [name, type] : desc.aliases) code += "alias " + name + " = " + type + ";\n";
  code += body;

  auto k = std::make_unique<Kernel>();
  k->name = key;
  k->bindings = desc.bindings;
  for (const Slot& slot : k->bindings)
    if (slot.kind == Bind::Uniform) k->uniform = &slot;
  WGPUDevice d = dev_.raw();
  dev_.guarded("compiling kernel " + key, [&] {
    WGPUShaderSourceWGSL wgsl = {};
    wgsl.chain.sType = WGPUSType_ShaderSourceWGSL;
    wgsl.code = WGPUStringView{code.data(), code.size()};
    WGPUShaderModuleDescriptor smd = {};
    smd.nextInChain = &wgsl.chain;
    smd.label = WGPUStringView{key.data(), key.size()};
    ShaderModuleHandle module(desc.trusted ? wgpuDeviceCreateShaderModuleTrusted(d, &smd, WGPUShaderRuntimeChecks_None)
                                           : wgpuDeviceCreateShaderModule(d, &smd));

    std::vector<WGPUBindGroupLayoutEntry> entries;
    for (const Slot& slot : desc.bindings) {
      WGPUBindGroupLayoutEntry e = {};
      e.binding = slot.binding;
      e.visibility = WGPUShaderStage_Compute;
      e.buffer.type = slot.kind == Bind::Uniform    ? WGPUBufferBindingType_Uniform
                      : slot.kind == Bind::ReadOnly ? WGPUBufferBindingType_ReadOnlyStorage
                                                    : WGPUBufferBindingType_Storage;
      // The uniform block's offset is given per dispatch, so that dispatches
      // on the same buffers share a bind group (bind_group_cache.hpp).
      e.buffer.hasDynamicOffset = slot.kind == Bind::Uniform;
      entries.push_back(e);
    }
    WGPUBindGroupLayoutDescriptor bgld = {};
    bgld.entryCount = entries.size();
    bgld.entries = entries.data();
    k->layout = BindGroupLayoutHandle(wgpuDeviceCreateBindGroupLayout(d, &bgld));

    WGPUBindGroupLayout layouts[] = {k->layout.get()};
    WGPUPipelineLayoutDescriptor pld = {};
    pld.bindGroupLayoutCount = 1;
    pld.bindGroupLayouts = layouts;
    PipelineLayoutHandle pl(wgpuDeviceCreatePipelineLayout(d, &pld));

    WGPUComputePipelineDescriptor cpd = {};
    cpd.label = WGPUStringView{key.data(), key.size()};
    cpd.layout = pl.get();
    cpd.compute.module = module.get();
    cpd.compute.entryPoint = WGPUStringView{desc.entry.data(), desc.entry.size()};
    k->pipeline = ComputePipelineHandle(wgpuDeviceCreateComputePipeline(d, &cpd));
  });
  auto& ref = *k;
  kernels_.emplace(key, std::move(k));
  return ref;
}

}  // namespace pwt
