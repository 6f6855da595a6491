// Deliberate faults for tests (see tests/test_errors.py).
#pragma once
#include "recorder.hpp"

namespace pwt {
// Records a dispatch whose binding overruns `buf`; throws ValidationError.
void inject_invalid_binding(Recorder& r, const Buffer& buf);
}  // namespace pwt
