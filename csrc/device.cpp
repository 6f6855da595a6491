#include "device.hpp"

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cstdlib>

#include "env.hpp"
#include "pipeline_cache.hpp"

namespace pwt {
namespace {

// How on_uncaptured_error marks an out-of-memory error in uncaptured_.
constexpr char kOutOfMemoryPrefix[] = "out of memory: ";

// One instance per process, shared by every Device: the NVIDIA Vulkan driver
// stops enumerating adapters after about 30 instance create/destroy cycles in
// one process (measured on the H100), so instances are never churned.
// It is never released: a static destructor would run at interpreter exit,
// after drivers may have torn down their own state (seen as a segfault at exit
// on the NVIDIA driver), and the OS reclaims it anyway.
std::shared_ptr<InstanceHandle> shared_instance() {
  static std::mutex mu;
  static auto* instance = new std::shared_ptr<InstanceHandle>();
  std::lock_guard<std::mutex> lk(mu);
  if (!*instance) {
    // Primary backends only (Vulkan, Metal, DX12): the GL backend lacks the
    // compute features the kernels rely on.
    WGPUInstanceExtras extras = {};
    extras.chain.sType = static_cast<WGPUSType>(WGPUSType_InstanceExtras);
    extras.backends = WGPUInstanceBackend_Primary;
    WGPUInstanceDescriptor desc = {};
    desc.nextInChain = &extras.chain;
    WGPUInstance raw = wgpuCreateInstance(&desc);
    if (!raw) throw GpuError("wgpuCreateInstance failed: no WebGPU instance could be created");
    *instance = std::make_shared<InstanceHandle>(raw);
  }
  return *instance;
}

std::vector<AdapterHandle> enumerate(WGPUInstance inst) {
  size_t n = wgpuInstanceEnumerateAdapters(inst, nullptr, nullptr);
  std::vector<WGPUAdapter> raw(n);
  if (n) wgpuInstanceEnumerateAdapters(inst, nullptr, raw.data());
  std::vector<AdapterHandle> out;
  for (auto a : raw) out.emplace_back(a);
  return out;
}

const char* adapter_type_name(WGPUAdapterType t) {
  switch (t) {
    case WGPUAdapterType_DiscreteGPU:
      return "discrete-gpu";
    case WGPUAdapterType_IntegratedGPU:
      return "integrated-gpu";
    case WGPUAdapterType_CPU:
      return "cpu";
    default:
      return "unknown";
  }
}

AdapterSummary summarize(WGPUAdapter a, uint32_t index) {
  WGPUAdapterInfo info = {};
  wgpuAdapterGetInfo(a, &info);
  AdapterSummary s;
  s.index = index;
  s.name = to_string(info.device);
  s.vendor = to_string(info.vendor);
  s.architecture = to_string(info.architecture);
  s.driver = to_string(info.description);
  s.backend = backend_name(info.backendType);
  s.adapter_type = adapter_type_name(info.adapterType);
  s.vendor_id = info.vendorID;
  s.device_id = info.deviceID;
  s.subgroup_min = info.subgroupMinSize;
  s.subgroup_max = info.subgroupMaxSize;
  wgpuAdapterInfoFreeMembers(info);
  return s;
}

int type_rank(const std::string& t) {
  if (t == "discrete-gpu") return 0;
  if (t == "integrated-gpu") return 1;
  if (t == "unknown") return 2;
  return 3;  // cpu last
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string feature_name(WGPUFeatureName f) {
  switch (static_cast<uint32_t>(f)) {
    case WGPUFeatureName_ShaderF16:
      return "shader-f16";
    case WGPUFeatureName_Subgroups:
      return "subgroups";
    case WGPUFeatureName_TimestampQuery:
      return "timestamp-query";
    case WGPUFeatureName_Float32Filterable:
      return "float32-filterable";
    case WGPUNativeFeature_TimestampQueryInsideEncoders:
      return "timestamp-query-inside-encoders";
    case WGPUNativeFeature_TimestampQueryInsidePasses:
      return "timestamp-query-inside-passes";
    case WGPUNativeFeature_Immediates:
      return "immediates";
    case WGPUNativeFeature_ShaderFloat32Atomic:
      return "shader-float32-atomic";
    case WGPUNativeFeature_ShaderF64:
      return "shader-f64";
    case WGPUNativeFeature_ShaderInt64:
      return "shader-int64";
    case WGPUNativeFeature_SubgroupBarrier:
      return "subgroup-barrier";
    case WGPUNativeFeature_Subgroup:
      return "subgroup";
    case WGPUNativeFeature_CooperativeMatrix:
      return "cooperative-matrix";
    default:
      return {};
  }
}

// Features pywgtrain uses when the adapter has them.
const WGPUFeatureName kWanted[] = {
    WGPUFeatureName_ShaderF16,
    WGPUFeatureName_Subgroups,
    static_cast<WGPUFeatureName>(WGPUNativeFeature_Subgroup),
    WGPUFeatureName_TimestampQuery,
    static_cast<WGPUFeatureName>(WGPUNativeFeature_TimestampQueryInsideEncoders),
    static_cast<WGPUFeatureName>(WGPUNativeFeature_TimestampQueryInsidePasses),
};

struct ScopeResult {
  std::atomic<bool> done{false};
  WGPUErrorType type = WGPUErrorType_NoError;
  std::string message;
};

void on_pop(WGPUPopErrorScopeStatus status, WGPUErrorType type, WGPUStringView msg, void* u1, void*) {
  auto* r = static_cast<ScopeResult*>(u1);
  r->type = status == WGPUPopErrorScopeStatus_Success ? type : WGPUErrorType_NoError;
  r->message = to_string(msg);
  r->done.store(true, std::memory_order_release);
}

}  // namespace

std::string backend_name(WGPUBackendType t) {
  switch (t) {
    case WGPUBackendType_Vulkan:
      return "vulkan";
    case WGPUBackendType_Metal:
      return "metal";
    case WGPUBackendType_D3D12:
      return "dx12";
    case WGPUBackendType_D3D11:
      return "dx11";
    case WGPUBackendType_OpenGL:
      return "opengl";
    case WGPUBackendType_OpenGLES:
      return "opengles";
    case WGPUBackendType_WebGPU:
      return "webgpu";
    default:
      return "unknown";
  }
}

std::vector<AdapterSummary> Device::list_adapters() {
  auto inst = shared_instance();
  auto adapters = enumerate(inst->get());
  std::vector<AdapterSummary> out;
  for (uint32_t i = 0; i < adapters.size(); ++i) out.push_back(summarize(adapters[i].get(), i));
  return out;
}

void Device::on_device_lost(WGPUDevice const*, WGPUDeviceLostReason reason, WGPUStringView msg, void* u1, void*) {
  auto* self = static_cast<Device*>(u1);
  if (self->releasing_.load()) return;  // our own release, not a loss
  std::lock_guard<std::mutex> lk(self->msg_mu_);
  self->lost_message_ =
      (reason == WGPUDeviceLostReason_Destroyed ? "device destroyed: " : "device lost: ") + to_string(msg);
  self->lost_.store(true);
}

void Device::on_uncaptured_error(WGPUDevice const*, WGPUErrorType type, WGPUStringView msg, void* u1, void*) {
  // Every wgpu call the core makes sits inside guarded() or is followed by
  // check_unscoped(); this records the error for them instead of the default
  // handler aborting the process.
  auto* self = static_cast<Device*>(u1);
  std::lock_guard<std::mutex> lk(self->msg_mu_);
  if (self->uncaptured_.empty())
    self->uncaptured_ = (type == WGPUErrorType_OutOfMemory ? kOutOfMemoryPrefix : "") + to_string(msg);
  self->stray_.store(true, std::memory_order_release);
}

void Device::throw_stray(const std::string& what) {
  std::string msg;
  {
    std::lock_guard<std::mutex> ml(msg_mu_);
    msg.swap(uncaptured_);
    stray_.store(false, std::memory_order_release);
  }
  ensure_alive(what);
  if (msg.rfind(kOutOfMemoryPrefix, 0) == 0)
    throw OutOfMemoryError(what + ": out of GPU memory: " + msg.substr(sizeof(kOutOfMemoryPrefix) - 1));
  throw ValidationError(what + ": " + msg);
}

// How long a wait polls without blocking before it blocks. A blocking wait
// (vkWaitSemaphores) wakes up tens of microseconds after the GPU finishes,
// more than a short kernel runs (H100, docs/performance.md: one 1x4096x4096
// GEMV plus synchronize() 133-189 us blocking, 36-49 spinning). CPU adapters
// do not spin: their work runs on the cores a spinning thread would take.
uint32_t spin_budget_us(const std::string& adapter_type) {
  const char* v = std::getenv("PYWGTRAIN_SPIN_WAIT_US");
  if (!v || !*v) return adapter_type == "cpu" ? 0 : Device::kDefaultSpinWaitUs;
  const std::string text(v);
  const bool digits = text.size() <= 8 && std::all_of(text.begin(), text.end(), ::isdigit);
  const unsigned long us = digits ? std::stoul(text) : 0;
  if (!digits || us > 10'000'000)
    throw ArgumentError("PYWGTRAIN_SPIN_WAIT_US must be an integer from 0 to 10000000 (microseconds), got '" + text +
                        "'");
  return uint32_t(us);
}

std::shared_ptr<Device> Device::open(const std::string& selector_in) {
  std::string selector = selector_in;
  if (selector.empty()) {
    if (const char* env = std::getenv("PYWGTRAIN_ADAPTER")) selector = env;
  }
  std::shared_ptr<Device> dev(new Device());
  dev->instance_ = shared_instance();
  auto adapters = enumerate(dev->instance_->get());
  if (adapters.empty())
    throw GpuError(
        "no WebGPU adapter found (Vulkan/Metal/DX12); on Linux install a Vulkan driver, e.g. mesa-vulkan-drivers");
  std::vector<AdapterSummary> infos;
  for (uint32_t i = 0; i < adapters.size(); ++i) infos.push_back(summarize(adapters[i].get(), i));

  int chosen = -1;
  if (selector.empty()) {
    // High-performance preference: discrete, then integrated, then CPU.
    chosen = 0;
    for (uint32_t i = 1; i < infos.size(); ++i)
      if (type_rank(infos[i].adapter_type) < type_rank(infos[chosen].adapter_type)) chosen = int(i);
  } else if (std::all_of(selector.begin(), selector.end(), ::isdigit)) {
    unsigned long idx = std::stoul(selector);
    if (idx >= infos.size())
      throw ArgumentError("adapter index " + selector + " out of range: " + std::to_string(infos.size()) +
                          " adapter(s) available");
    chosen = int(idx);
  } else {
    for (uint32_t i = 0; i < infos.size() && chosen < 0; ++i)
      if (lower(infos[i].name).find(lower(selector)) != std::string::npos) chosen = int(i);
    if (chosen < 0) {
      std::string names;
      for (auto& s : infos) names += (names.empty() ? "" : ", ") + ("'" + s.name + "'");
      throw ArgumentError("no adapter name contains '" + selector + "'; available: " + names);
    }
  }
  dev->adapter_ = std::move(adapters[chosen]);
  dev->info_ = infos[chosen];
  dev->spin_wait_us_ = spin_budget_us(dev->info_.adapter_type);
  dev->gemm_switches_ = GemmSwitches::from_env();
  const TransferSettings transfer_settings = TransferSettings::from_env();
  const uint64_t bind_group_entries = env_count("PYWGTRAIN_BIND_GROUP_CACHE", kBindGroupCacheEntries);

  WGPULimits alim = WGPU_LIMITS_INIT;
  wgpuAdapterGetLimits(dev->adapter_.get(), &alim);
  std::vector<WGPUFeatureName> req;
  for (auto f : kWanted)
    if (wgpuAdapterHasFeature(dev->adapter_.get(), f)) req.push_back(f);

  WGPUDeviceDescriptor desc = WGPU_DEVICE_DESCRIPTOR_INIT;
  desc.label = sv("pywgtrain");
  desc.requiredFeatureCount = req.size();
  desc.requiredFeatures = req.data();
  desc.requiredLimits = &alim;  // everything the adapter offers (bindings, buffer sizes, workgroup memory)
  desc.deviceLostCallbackInfo.mode = WGPUCallbackMode_AllowSpontaneous;
  desc.deviceLostCallbackInfo.callback = &Device::on_device_lost;
  desc.deviceLostCallbackInfo.userdata1 = dev.get();
  desc.uncapturedErrorCallbackInfo.callback = &Device::on_uncaptured_error;
  desc.uncapturedErrorCallbackInfo.userdata1 = dev.get();

  struct Req {
    std::atomic<bool> done{false};
    WGPUDevice device = nullptr;
    std::string msg;
  } r;
  WGPURequestDeviceCallbackInfo cb = {};
  cb.mode = WGPUCallbackMode_AllowSpontaneous;
  cb.callback = [](WGPURequestDeviceStatus status, WGPUDevice d, WGPUStringView m, void* u1, void*) {
    auto* r = static_cast<Req*>(u1);
    if (status == WGPURequestDeviceStatus_Success)
      r->device = d;
    else
      r->msg = to_string(m);
    r->done.store(true, std::memory_order_release);
  };
  cb.userdata1 = &r;
  wgpuAdapterRequestDevice(dev->adapter_.get(), &desc, cb);
  wait_for_callback(dev->instance_->get(), r.done);
  if (!r.device) throw GpuError("requesting a device from adapter '" + dev->info_.name + "' failed: " + r.msg);
  dev->device_ = DeviceHandle(r.device);
  dev->queue_ = QueueHandle(wgpuDeviceGetQueue(r.device));

  WGPULimits lim = WGPU_LIMITS_INIT;
  wgpuDeviceGetLimits(r.device, &lim);
  dev->limits_.max_storage_binding = lim.maxStorageBufferBindingSize;
  dev->limits_.max_buffer = lim.maxBufferSize;
  dev->limits_.max_workgroups_per_dim = lim.maxComputeWorkgroupsPerDimension;
  dev->limits_.max_invocations = lim.maxComputeInvocationsPerWorkgroup;
  dev->limits_.max_workgroup_storage = lim.maxComputeWorkgroupStorageSize;
  dev->limits_.storage_offset_alignment = lim.minStorageBufferOffsetAlignment;
  dev->limits_.uniform_offset_alignment = lim.minUniformBufferOffsetAlignment;
  dev->limits_.max_storage_buffers_per_stage = lim.maxStorageBuffersPerShaderStage;

  WGPUSupportedFeatures feats = {};
  wgpuDeviceGetFeatures(r.device, &feats);
  for (size_t i = 0; i < feats.featureCount; ++i) {
    auto n = feature_name(feats.features[i]);
    if (!n.empty()) dev->feature_names_.push_back(n);
  }
  wgpuSupportedFeaturesFreeMembers(feats);
  std::sort(dev->feature_names_.begin(), dev->feature_names_.end());
  dev->pipelines_ = std::make_unique<PipelineCache>(*dev);
  dev->memory_ = std::make_unique<BufferCache>(*dev);
  dev->bind_groups_ = std::make_unique<BindGroupCache>(bind_group_entries);
  dev->transfers_ = std::make_unique<Transfers>(*dev, transfer_settings);
  return dev;
}

Device::~Device() {
  // Release order: our own objects first (every pooled buffer included), then
  // queue, device, adapter, instance.
  releasing_.store(true);
  bind_groups_.reset();  // they reference pipelines' layouts and every pool's buffers
  pipelines_.reset();
  memory_.reset();
  uniform_pool_.clear();
  stage_pool_.clear();
  transfers_.reset();
  workspace_.reset();
  for (auto& b : repack_) b.reset();
  for (auto& b : placeholder_) b.reset();
  queue_.reset();
  device_.reset();
  adapter_.reset();
}

bool Device::spin(const std::function<bool()>& finished) const {
  if (spin_wait_us_ == 0) return false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_wait_us_);
  do {
    if (finished()) return true;
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

void wait_for_callback(WGPUInstance instance, const std::atomic<bool>& done, const Device* poll, uint64_t submission) {
  if (poll) {
    const WGPUSubmissionIndex idx = submission;
    auto finished = [&] { return done.load(std::memory_order_acquire) || poll->lost(); };
    if (poll->spin([&] {
          wgpuDevicePoll(poll->raw(), false, nullptr);
          return finished();
        }))
      return;
    while (!finished()) wgpuDevicePoll(poll->raw(), true, submission ? &idx : nullptr);
  } else {
    while (!done.load(std::memory_order_acquire)) wgpuInstanceProcessEvents(instance);
  }
}

std::string Device::lost_message() const {
  std::lock_guard<std::mutex> lk(msg_mu_);
  return lost_message_;
}

void Device::ensure_alive(const std::string& what) const {
  if (lost_.load()) throw DeviceLostError(what + ": " + lost_message() + " (create a new pywgtrain.Device)");
}

void Device::guarded(const std::string& what, const std::function<void()>& body) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  ensure_alive(what);
  WGPUDevice d = device_.get();
  wgpuDevicePushErrorScope(d, WGPUErrorFilter_OutOfMemory);
  wgpuDevicePushErrorScope(d, WGPUErrorFilter_Validation);
  std::exception_ptr thrown;
  try {
    body();
  } catch (...) {
    thrown = std::current_exception();
  }
  ScopeResult res[2];
  for (auto& r : res) {
    WGPUPopErrorScopeCallbackInfo cb = {};
    cb.mode = WGPUCallbackMode_AllowSpontaneous;
    cb.callback = on_pop;
    cb.userdata1 = &r;
    wgpuDevicePopErrorScope(d, cb);
  }
  for (auto& r : res) wait_for_callback(instance_->get(), r.done);
  if (thrown) std::rethrow_exception(thrown);
  ensure_alive(what);
  for (auto& r : res) {
    if (r.type == WGPUErrorType_NoError) continue;
    if (r.type == WGPUErrorType_OutOfMemory) throw OutOfMemoryError(what + ": out of GPU memory: " + r.message);
    if (r.type == WGPUErrorType_Validation) throw ValidationError(what + ": " + r.message);
    throw GpuError(what + ": internal wgpu error: " + r.message);
  }
  std::string stray;
  {
    std::lock_guard<std::mutex> ml(msg_mu_);
    stray.swap(uncaptured_);
    stray_.store(false, std::memory_order_release);
  }
  if (!stray.empty()) throw GpuError(what + ": earlier uncaptured wgpu error: " + stray);
}

std::shared_ptr<std::atomic<bool>> on_work_done(WGPUQueue queue) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  WGPUQueueWorkDoneCallbackInfo cb = {};
  cb.mode = WGPUCallbackMode_AllowSpontaneous;
  cb.callback = [](WGPUQueueWorkDoneStatus, WGPUStringView, void* flag, void*) {
    auto* held = static_cast<std::shared_ptr<std::atomic<bool>>*>(flag);
    (*held)->store(true, std::memory_order_release);
    delete held;
  };
  cb.userdata1 = new std::shared_ptr<std::atomic<bool>>(done);
  wgpuQueueOnSubmittedWorkDone(queue, cb);
  return done;
}

bool Device::query() {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  ensure_alive("querying the GPU");
  auto done = on_work_done(queue_.get());
  wgpuDevicePoll(device_.get(), false, nullptr);
  return done->load(std::memory_order_acquire);
}

void Device::wait(uint64_t submission) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  ensure_alive("waiting for the GPU");
  if (spin_wait_us_ == 0) {
    WGPUSubmissionIndex idx = submission;
    wgpuDevicePoll(device_.get(), true, submission ? &idx : nullptr);
    ensure_alive("waiting for the GPU");
    return;
  }
  // Spinning needs a completion signal that does not block. Not the return
  // value of a non-blocking wgpuDevicePoll ("queue empty"): on the H100
  // (Vulkan) it read true right after submitting 24 ms of GEMMs, and waits
  // returned in 0.2 ms. The queue's work-done callback fires only once every
  // submission so far has finished (a later one than `submission` included).
  // The flag is shared with the callback, which may outlive a lost device's wait.
  auto done = on_work_done(queue_.get());
  wait_for_callback(instance_->get(), *done, this);
  ensure_alive("waiting for the GPU");
}

std::vector<std::pair<std::string, uint64_t>> Device::resource_report() const {
  WGPUGlobalReport r = {};
  wgpuGenerateReport(instance_->get(), &r);
  const auto& h = r.hub;
  return {{"buffers", h.buffers.numAllocated},
          {"bind_groups", h.bindGroups.numAllocated},
          {"bind_group_layouts", h.bindGroupLayouts.numAllocated},
          {"compute_pipelines", h.computePipelines.numAllocated},
          {"pipeline_layouts", h.pipelineLayouts.numAllocated},
          {"shader_modules", h.shaderModules.numAllocated},
          {"command_buffers", h.commandBuffers.numAllocated},
          {"query_sets", h.querySets.numAllocated}};
}

void Device::destroy() {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  bind_groups_->clear();
  wgpuDeviceDestroy(device_.get());
  wgpuInstanceProcessEvents(instance_->get());
  if (!lost_.load()) {
    std::lock_guard<std::mutex> ml(msg_mu_);
    lost_message_ = "device destroyed";
    lost_.store(true);
  }
}

Device::UniformChunk Device::take_uniform_chunk() {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  if (!uniform_pool_.empty()) {
    UniformChunk c = std::move(uniform_pool_.back());
    uniform_pool_.pop_back();
    return c;
  }
  WGPUBufferDescriptor d = WGPU_BUFFER_DESCRIPTOR_INIT;
  d.label = sv("pywgtrain.uniforms");
  d.size = kUniformChunkBytes;
  d.usage = WGPUBufferUsage_Uniform | WGPUBufferUsage_CopyDst;
  BufferHandle h;
  guarded("allocating uniform memory", [&] { h = BufferHandle(wgpuDeviceCreateBuffer(device_.get(), &d)); });
  return UniformChunk{std::move(h), {}};
}

void Device::give_uniform_chunk(UniformChunk chunk) {
  // Safe to reuse at once: queue writes and submissions execute in queue order.
  std::lock_guard<std::recursive_mutex> lk(mu_);
  if (uniform_pool_.size() < 64)
    uniform_pool_.push_back(std::move(chunk));
  else
    bind_groups_->forget(chunk.buffer.get());
}

Device::StageChunk Device::take_stage_chunk(uint64_t min_bytes) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  for (size_t i = 0; i < stage_pool_.size(); ++i) {
    if (stage_pool_[i].bytes >= min_bytes) {
      StageChunk c = std::move(stage_pool_[i]);
      stage_pool_.erase(stage_pool_.begin() + i);
      return c;
    }
  }
  StageChunk c;
  c.bytes = std::max(kStageChunkBytes, (min_bytes + 255) & ~uint64_t(255));
  if (c.bytes > limits_.max_buffer)
    throw ArgumentError("staging " + std::to_string(min_bytes) + " bytes exceeds the device's max_buffer_size " +
                        std::to_string(limits_.max_buffer));
  WGPUBufferDescriptor d = WGPU_BUFFER_DESCRIPTOR_INIT;
  d.label = sv("pywgtrain.stage");
  d.size = c.bytes;
  d.usage = WGPUBufferUsage_Storage | WGPUBufferUsage_CopyDst | WGPUBufferUsage_CopySrc;
  guarded("allocating upload staging memory",
          [&] { c.buffer = BufferHandle(wgpuDeviceCreateBuffer(device_.get(), &d)); });
  return c;
}

void Device::give_stage_chunk(StageChunk chunk) {
  // Same queue-order argument as for uniform chunks; the pool keeps a few.
  std::lock_guard<std::recursive_mutex> lk(mu_);
  if (stage_pool_.size() < 8)
    stage_pool_.push_back(std::move(chunk));
  else
    bind_groups_->forget(chunk.buffer.get());
}

WGPUBuffer Device::placeholder(bool writable) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  BufferHandle& buf = placeholder_[writable ? 1 : 0];
  if (!buf) {
    WGPUBufferDescriptor d = WGPU_BUFFER_DESCRIPTOR_INIT;
    d.label = sv(writable ? "pywgtrain.placeholder_rw" : "pywgtrain.placeholder");
    d.size = 16;
    d.usage = WGPUBufferUsage_Storage;
    guarded("allocating a placeholder buffer", [&] { buf = BufferHandle(wgpuDeviceCreateBuffer(device_.get(), &d)); });
  }
  return buf.get();
}

WGPUBuffer Device::grow(BufferHandle& buf, uint64_t& have, uint64_t bytes, const char* label) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  if (bytes > have) {
    const uint64_t size = std::max<uint64_t>(bytes, have + have / 2);
    WGPUBufferDescriptor d = WGPU_BUFFER_DESCRIPTOR_INIT;
    d.label = sv(label);
    d.size = (size + 255) & ~uint64_t(255);
    // CopySrc: the GEMM tuner copies its operands, and a repacked one lives here.
    d.usage = WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc;
    BufferHandle fresh;
    guarded("allocating " + std::to_string(d.size) + " bytes (" + label + ")",
            [&] { fresh = BufferHandle(wgpuDeviceCreateBuffer(device_.get(), &d)); });
    if (buf) bind_groups_->forget(buf.get());
    buf = std::move(fresh);
    have = d.size;
  }
  return buf.get();
}

WGPUBuffer Device::workspace(uint64_t bytes) {
  return grow(workspace_, workspace_bytes_, bytes, "pywgtrain.workspace");
}

WGPUBuffer Device::repack_space(int operand, uint64_t bytes) {
  return grow(repack_[operand], repack_bytes_[operand], bytes,
              operand ? "pywgtrain.repacked_b" : "pywgtrain.repacked_a");
}

}  // namespace pwt
