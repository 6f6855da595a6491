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
  if(WIN32)
    # wgpu's Windows wheels ship wgpu_native-release.dll without an import
    # library. Make one with MSVC's lib.exe from the functions webgpu.h and
    # wgpu.h declare, which are exactly the DLL's exports (228 in 0.32.0).
    find_file(WGPU_NATIVE_LIBRARY wgpu_native-release.dll PATHS "${_wgpu_resources}" NO_DEFAULT_PATH)
    if(WGPU_NATIVE_LIBRARY AND WGPU_NATIVE_INCLUDE_DIR)
      file(READ "${WGPU_NATIVE_INCLUDE_DIR}/webgpu.h" _wgpu_h)
      file(READ "${WGPU_NATIVE_INCLUDE_DIR}/wgpu.h" _wgpu_ext_h)
      string(REGEX MATCHALL "wgpu[A-Z][A-Za-z0-9_]*[ \t]*\\(" _wgpu_fns "${_wgpu_h}${_wgpu_ext_h}")
      list(TRANSFORM _wgpu_fns REPLACE "[ \t(]" "")
      list(REMOVE_DUPLICATES _wgpu_fns)
      list(JOIN _wgpu_fns "\n  " _wgpu_exports)
      set(_wgpu_def "${CMAKE_CURRENT_BINARY_DIR}/wgpu_native-release.def")
      set(WGPU_NATIVE_IMPLIB "${CMAKE_CURRENT_BINARY_DIR}/wgpu_native-release.lib")
      file(WRITE "${_wgpu_def}" "LIBRARY wgpu_native-release.dll\nEXPORTS\n  ${_wgpu_exports}\n")
      execute_process(
        COMMAND "${CMAKE_AR}" /nologo "/def:${_wgpu_def}" "/out:${WGPU_NATIVE_IMPLIB}"
                "/machine:${CMAKE_CXX_COMPILER_ARCHITECTURE_ID}"
        RESULT_VARIABLE _wgpu_lib_rc)
      if(NOT _wgpu_lib_rc EQUAL 0)
        message(FATAL_ERROR "could not make an import library for ${WGPU_NATIVE_LIBRARY} (${CMAKE_AR}: ${_wgpu_lib_rc})")
      endif()
    endif()
  else()
    find_library(WGPU_NATIVE_LIBRARY NAMES wgpu_native-release wgpu_native
      PATHS "${_wgpu_resources}" NO_DEFAULT_PATH)
  endif()
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
if(WGPU_NATIVE_IMPLIB)
  set_target_properties(wgpu_native::wgpu_native PROPERTIES IMPORTED_IMPLIB "${WGPU_NATIVE_IMPLIB}")
endif()
