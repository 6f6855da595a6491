// Fault injection for the reliability tests: provokes a genuine wgpu
// validation error through the normal recording path.
#include "faults.hpp"

#include "dispatch_util.hpp"

namespace pwt {

void inject_invalid_binding(Recorder& r, const Buffer& buf) {
  KernelDesc d;
  d.shader = "reduce";
  d.entry = "partial_sum";
  d.bindings = {{0, Bind::ReadOnly}, {1, Bind::ReadWrite}, {2, Bind::Uniform}};
  d.constants = {{"SQUARE", "false"}};
  const Kernel& k = r.device().pipelines().get(d);
  struct { uint32_t n, out_off; } p{1, 0};
  // A range past the end of the buffer at a misaligned offset: wgpu rejects the bind group.
  Range bad{buf.raw(), buf.offset() + 4, buf.bytes() + 256};
  r.dispatch(k, {bad, whole(buf)}, p, 1);
}

}  // namespace pwt
