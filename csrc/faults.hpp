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
}  // namespace pwt
