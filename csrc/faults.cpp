// Fault injection for the reliability tests: provokes a genuine wgpu
// validation error through the normal recording path, and failed allocations.
#include "faults.hpp"

#include <atomic>
#include <mutex>

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

namespace {
std::mutex fail_mu;
std::string fail_label;
uint32_t fail_after = 0;
std::atomic<uint32_t> fail_count{0};
}  // namespace

void inject_allocation_failures(const std::string& label, uint32_t after, uint32_t count) {
  std::lock_guard<std::mutex> lock(fail_mu);
  fail_label = label;
  fail_after = after;
  fail_count = count;
}

bool fail_this_allocation(const std::string& label) {
  if (!fail_count.load(std::memory_order_relaxed)) return false;  // the common case: no lock
  std::lock_guard<std::mutex> lock(fail_mu);
  if (!fail_count || label != fail_label) return false;
  if (fail_after) {
    --fail_after;
    return false;
  }
  --fail_count;
  return true;
}

namespace {
std::atomic<int64_t> map_fault_in{-1};  // maps left before the fault; -1: none armed
std::atomic<bool> map_fault_loses{false};
}  // namespace

void inject_map_failure(int64_t after, bool lose_device) {
  map_fault_loses = lose_device;
  map_fault_in = after < 0 ? -1 : after;
}

MapFault take_map_fault() {
  if (map_fault_in.load(std::memory_order_relaxed) < 0) return MapFault::None;  // the common case
  if (map_fault_in.fetch_sub(1) != 0) return MapFault::None;
  return map_fault_loses ? MapFault::LoseDevice : MapFault::Fail;
}

namespace {
std::atomic<uint32_t> download_delay_ms{0};
}  // namespace

void inject_download_delay(uint32_t ms) { download_delay_ms = ms; }

uint32_t take_download_delay() {
  if (download_delay_ms.load(std::memory_order_relaxed) == 0) return 0;  // the common case
  return download_delay_ms.exchange(0);
}

}  // namespace pwt
