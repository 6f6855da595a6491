// Deliberate faults for tests (see tests/test_errors.py).
#pragma once
#include <cstdint>
#include <string>

#include "recorder.hpp"

namespace pwt {
// Records a dispatch whose binding overruns `buf`; throws ValidationError.
void inject_invalid_binding(Recorder& r, const Buffer& buf);
// After `after` more buffer allocations labelled `label`, the next `count`
// fail as out of GPU memory (count 0 clears it). Buffer's constructor asks
// fail_this_allocation; the caching allocator asks it with kDriverAllocation
// before each request to the driver (an injected refusal it retries once
// after emptying its cache, as it does a real one).
void inject_allocation_failures(const std::string& label, uint32_t after, uint32_t count);
bool fail_this_allocation(const std::string& label);
inline const std::string kDriverAllocation = "<driver>";
// After `after` more staging-buffer maps of host transfers (transfer.cpp),
// the next one fails: reported as a failed map, or (lose_device) by
// destroying the device first.
enum class MapFault { None, Fail, LoseDevice };
void inject_map_failure(int64_t after, bool lose_device);  // after < 0: none
MapFault take_map_fault();
// The next download's wait for the GPU lasts `ms` longer (as if earlier work
// ran that long), so that tests can show what other threads do meanwhile.
void inject_download_delay(uint32_t ms);
uint32_t take_download_delay();  // 0 when none is armed
}  // namespace pwt
