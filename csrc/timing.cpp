#include "timing.hpp"

namespace pwt {

PassTimer::PassTimer(std::shared_ptr<Device> dev, uint32_t max_passes) : dev_(std::move(dev)), max_passes_(max_passes) {
  if (!dev_->has_feature(WGPUFeatureName_TimestampQuery))
    throw GpuError("adapter '" + dev_->info().name + "' does not support timestamp queries");
  WGPUQuerySetDescriptor d = {};
  d.type = WGPUQueryType_Timestamp;
  d.count = 2 * max_passes;
  dev_->guarded("creating a timestamp query set",
                [&] { set_ = QuerySetHandle(wgpuDeviceCreateQuerySet(dev_->raw(), &d)); });
  resolved_ =
      std::make_unique<Buffer>(dev_, uint64_t(16) * max_passes, "pywgtrain.timestamps", WGPUBufferUsage_QueryResolve);
}

void PassTimer::time_next_pass(Recorder& r, uint32_t index) {
  if (index >= max_passes_) throw ArgumentError("PassTimer: pass index out of range");
  r.time_next_pass(set_.get(), 2 * index, 2 * index + 1);
}

std::vector<double> PassTimer::read(Recorder& r, uint32_t passes) {
  r.resolve_queries(set_.get(), 2 * passes, *resolved_);
  dev_->wait(r.submit());
  std::vector<uint64_t> ticks(2 * passes);
  resolved_->download(ticks.data(), ticks.size() * 8);
  const double period = wgpuQueueGetTimestampPeriod(dev_->queue());
  std::vector<double> ns(passes);
  for (uint32_t i = 0; i < passes; ++i) ns[i] = double(ticks[2 * i + 1] - ticks[2 * i]) * period;
  return ns;
}

}  // namespace pwt
