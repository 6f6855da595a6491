// C++ exceptions for every way the GPU can refuse work. The Cython layer maps
// each type to a Python exception of the same name (pywgtrain.errors).
#pragma once
#include <stdexcept>
#include <string>

namespace pwt {

struct GpuError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// wgpu validation: the call was malformed (bad binding, size, usage...).
struct ValidationError : GpuError {
  using GpuError::GpuError;
};
// The device or driver refused an allocation.
struct OutOfMemoryError : GpuError {
  using GpuError::GpuError;
};
// The device is gone (destroyed, reset, driver crash); create a new Device.
struct DeviceLostError : GpuError {
  using GpuError::GpuError;
};
// Caller error detected before any GPU work (shape, size, limit).
struct ArgumentError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

}  // namespace pwt
