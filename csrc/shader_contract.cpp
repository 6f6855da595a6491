#include "shader_contract.hpp"

#include <map>

namespace pwt {

std::vector<UniformLayout> uniform_layouts() {
#define PWT_LAYOUT_OF(S, SIZE) UniformTraits<S>::layout(),
  return {PWT_UNIFORMS(PWT_LAYOUT_OF)};
#undef PWT_LAYOUT_OF
}

std::vector<ShaderInterface> shader_interfaces() {
#define PWT_INTERFACE_OF(stem) wgsl::stem::interface(),
  return {PWT_SHADERS(PWT_INTERFACE_OF)};
#undef PWT_INTERFACE_OF
}

std::vector<ContractBinding> contract_bindings() {
  std::vector<ContractBinding> out;
  for (const auto& shader : shader_interfaces())
    for (const Slot& s : shader.slots)
      out.push_back({shader.shader, s.var, s.binding,
                     s.kind == Bind::Uniform    ? "uniform"
                     : s.kind == Bind::ReadOnly ? "read"
                                                : "read_write",
                     s.type});
  return out;
}

std::vector<ContractConstant> contract_constants() {
  std::vector<ContractConstant> out;
  for (const auto& shader : shader_interfaces())
    for (const auto& [name, value] : shader.constants) out.push_back({shader.shader, name, value});
  return out;
}

const ShaderInterface* shader_interface(const std::string& stem) {
  static const std::map<std::string, ShaderInterface> by_stem = [] {
    std::map<std::string, ShaderInterface> m;
    for (auto& s : shader_interfaces()) m.emplace(s.shader, s);
    return m;
  }();
  auto it = by_stem.find(stem);
  return it == by_stem.end() ? nullptr : &it->second;
}

}  // namespace pwt
