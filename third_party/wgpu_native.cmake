# Locates wgpu-native and exposes it as the imported target wgpu_native::wgpu_native.
#
# Order of preference:
#   1. -DWGPU_NATIVE_DIR=<dir>: a wgpu-native release layout
#      (include/webgpu/{webgpu,wgpu}.h or include/{webgpu,wgpu}.h, lib/libwgpu_native.so).
#   2. The `wgpu` Python wheel (pinned 0.32.0) in the build environment, found
#      through importlib's spec lookup, which does not import (or need) wgpu's
#      Python dependencies.
# Sets WGPU_NATIVE_LIBRARY (the file to bundle next to the extension).

set(WGPU_NATIVE_DIR "" CACHE PATH "wgpu-native release directory (headers + library)")

if(WGPU_NATIVE_DIR)
  find_path(WGPU_NATIVE_INCLUDE_DIR wgpu.h
    PATHS "${WGPU_NATIVE_DIR}/include/webgpu" "${WGPU_NATIVE_DIR}/include" "${WGPU_NATIVE_DIR}"
    NO_DEFAULT_PATH)
  find_library(WGPU_NATIVE_LIBRARY NAMES wgpu_native wgpu_native-release
    PATHS "${WGPU_NATIVE_DIR}/lib" "${WGPU_NATIVE_DIR}" NO_DEFAULT_PATH)
else()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import importlib.util, os; s = importlib.util.find_spec('wgpu'); print(os.path.join(os.path.dirname(s.origin), 'resources') if s else '')"
    OUTPUT_VARIABLE _wgpu_resources OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _wgpu_resources)
    message(FATAL_ERROR
      "wgpu-native not found: install the build requirement `wgpu==0.32.0` "
      "or pass -DWGPU_NATIVE_DIR=<wgpu-native release dir>.")
  endif()
  find_path(WGPU_NATIVE_INCLUDE_DIR wgpu.h PATHS "${_wgpu_resources}" NO_DEFAULT_PATH)
  find_library(WGPU_NATIVE_LIBRARY NAMES wgpu_native-release wgpu_native
    PATHS "${_wgpu_resources}" NO_DEFAULT_PATH)
endif()

if(NOT WGPU_NATIVE_INCLUDE_DIR OR NOT WGPU_NATIVE_LIBRARY)
  message(FATAL_ERROR "wgpu-native headers or library missing (include: '${WGPU_NATIVE_INCLUDE_DIR}', lib: '${WGPU_NATIVE_LIBRARY}')")
endif()
message(STATUS "wgpu-native: ${WGPU_NATIVE_LIBRARY}")

add_library(wgpu_native::wgpu_native SHARED IMPORTED GLOBAL)
set_target_properties(wgpu_native::wgpu_native PROPERTIES
  IMPORTED_LOCATION "${WGPU_NATIVE_LIBRARY}"
  # The wheel's library has no SONAME; link it by name (-l) so the extension
  # records a bare file name that $ORIGIN resolves, not a build-machine path.
  IMPORTED_NO_SONAME TRUE
  INTERFACE_INCLUDE_DIRECTORIES "${WGPU_NATIVE_INCLUDE_DIR}")
