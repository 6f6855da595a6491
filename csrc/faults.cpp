// Fault injection for the reliability tests: provokes a genuine wgpu
// validation error through the normal recording path.
#include "faults.hpp"

#include "dispatch_util.hpp"

namespace pwt {

void inject_invalid_binding(Recorder& r, const Buffer& buf) {
  KernelDesc d;
  d.shader = "reduce";
  d.entry = "partial_sum";
  d.bindings = {wgsl::reduce::src, wgsl::reduce::dst, wgsl::reduce::pp};
  d.constants = {{"SQUARE", "false"}};
  const Kernel& k = r.device().pipelines().get(d);
  ReducePartialParams p;
  p.n = 1;
  // A range past the end of the buffer at a misaligned offset: wgpu rejects the bind group.
  Range bad{buf.raw(), buf.offset() + 4, buf.bytes() + 256};
  r.dispatch(k, {{wgsl::reduce::src, bad}, {wgsl::reduce::dst, whole(buf)}}, p, 1);
}

}  // namespace pwt
