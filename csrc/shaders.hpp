// WGSL sources from shaders/*.wgsl, embedded at build time (file stem -> text).
#pragma once
#include <map>
#include <string>

namespace pwt {
const std::map<std::string, std::string>& embedded_shaders();
}
