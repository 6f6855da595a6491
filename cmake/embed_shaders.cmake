# Run in script mode: writes ${OUT} (a C++ source) holding every .wgsl file in
# ${SHADER_DIR} as a raw string literal, keyed by file stem.
file(GLOB _shaders "${SHADER_DIR}/*.wgsl")
list(SORT _shaders)
set(_body "// Generated from shaders/*.wgsl by cmake/embed_shaders.cmake. Do not edit.\n#include \"shaders.hpp\"\nnamespace pwt {\nconst std::map<std::string, std::string>& embedded_shaders() {\n  static const std::map<std::string, std::string> sources = {\n")
foreach(_path IN LISTS _shaders)
  get_filename_component(_stem "${_path}" NAME_WE)
  file(READ "${_path}" _src)
  string(APPEND _body "    {\"${_stem}\", R\"__wgsl__(${_src})__wgsl__\"},\n")
endforeach()
string(APPEND _body "  };\n  return sources;\n}\n}  // namespace pwt\n")
file(WRITE "${OUT}.tmp" "${_body}")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT}.tmp" "${OUT}")
