// GPU timestamps around compute passes, for the microbenchmarks and
// `pywgtrain bench`: each timed pass gets a begin/end pair of queries.
#pragma once
#include <memory>
#include <vector>

#include "recorder.hpp"

namespace pwt {

class PassTimer {
 public:
  PassTimer(std::shared_ptr<Device> dev, uint32_t max_passes);
  // The next compute pass recorded on r is timed as pass `index`.
  void time_next_pass(Recorder& r, uint32_t index);
  // Resolves, submits and waits; returns each pass's duration in nanoseconds.
  std::vector<double> read(Recorder& r, uint32_t passes);

 private:
  std::shared_ptr<Device> dev_;
  QuerySetHandle set_;
  std::unique_ptr<Buffer> resolved_;
  uint32_t max_passes_;
};

}  // namespace pwt
