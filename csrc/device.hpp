// One wgpu device and everything that lives exactly once per device: queue,
// limits, features, error plumbing, the pipeline cache and staging memory.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bind_group_cache.hpp"
#include "buffer_cache.hpp"
#include "errors.hpp"
#include "gemm_switches.hpp"
#include "gemm_tuning.hpp"
#include "handle.hpp"
#include "transfer.hpp"

namespace pwt {

class PipelineCache;

struct AdapterSummary {
  uint32_t index = 0;
  std::string name, vendor, architecture, driver, backend, adapter_type;
  uint32_t vendor_id = 0, device_id = 0, subgroup_min = 0, subgroup_max = 0;
};

struct DeviceLimits {
  uint64_t max_storage_binding = 0;
  uint64_t max_buffer = 0;
  uint32_t max_workgroups_per_dim = 0;
  uint32_t max_invocations = 0;
  uint32_t max_workgroup_storage = 0;
  uint32_t storage_offset_alignment = 0;
  uint32_t uniform_offset_alignment = 0;
  uint32_t max_storage_buffers_per_stage = 0;
};

class Device : public std::enable_shared_from_this<Device> {
 public:
  // selector: "" (then $PYWGTRAIN_ADAPTER, then the high-performance adapter),
  // a decimal index into list_adapters(), or a case-insensitive name substring.
  static std::shared_ptr<Device> open(const std::string& selector);
  static std::vector<AdapterSummary> list_adapters();
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  WGPUDevice raw() const { return device_.get(); }
  WGPUQueue queue() const { return queue_.get(); }
  WGPUInstance instance() const { return instance_->get(); }
  const AdapterSummary& info() const { return info_; }
  const DeviceLimits& limits() const { return limits_; }
  const std::vector<std::string>& features() const { return feature_names_; }
  bool has_feature(WGPUFeatureName f) const { return wgpuDeviceHasFeature(device_.get(), f); }
  PipelineCache& pipelines() { return *pipelines_; }
  // GEMM plans measured on this device (gemm_tuner.cpp).
  GemmTuning& gemm_tuning() { return gemm_tuning_; }
  // The GEMM's experiment switches, read from the environment when the device opened.
  const GemmSwitches& gemm_switches() const { return gemm_switches_; }

  // Serializes every use of the device: wgpu error scopes are per device, so
  // an error must be attributed to the thread that caused it.
  std::recursive_mutex& mutex() { return mu_; }
  // Tensor memory: the caching allocator and its statistics (buffer_cache.hpp).
  BufferCache& memory() { return *memory_; }
  // Bind groups shared by dispatches that bind the same memory
  // (bind_group_cache.hpp); PYWGTRAIN_BIND_GROUP_CACHE entries, read when the
  // device opens (0: off).
  BindGroupCache& bind_groups() { return *bind_groups_; }
  static constexpr uint64_t kBindGroupCacheEntries = 4096;

  bool lost() const { return lost_.load(); }
  std::string lost_message() const;
  void ensure_alive(const std::string& what) const;

  // Runs `body` inside validation and out-of-memory error scopes (wgpu-native
  // rejects the internal filter) and turns whatever they caught into the
  // matching exception, prefixed by `what`.
  void guarded(const std::string& what, const std::function<void()>& body);
  // The recording hot path runs without error scopes, whose push and pop cost
  // more than the dispatch: object creation and pass encoding report their
  // errors synchronously, so outside any scope an error reaches
  // on_uncaptured_error during the call itself. Called right after such
  // calls, under mutex(): throws what they raised, prefixed by `what`.
  void check_unscoped(const std::string& what) {
    if (stray_.load(std::memory_order_acquire)) throw_stray(what);
  }

  // Blocks until the submission (0: all submitted work) has finished; the
  // Cython layer releases the GIL around it.
  void wait(uint64_t submission);
  // Whether every submission so far has finished (polls once, never blocks).
  bool query();
  // Calls `finished` (which polls the device without blocking) until it
  // returns true or spin_wait_us() have passed; whether it did. Waits spin
  // first and block after (PYWGTRAIN_SPIN_WAIT_US, device.cpp).
  bool spin(const std::function<bool()>& finished) const;
  uint32_t spin_wait_us() const { return spin_wait_us_; }
  static constexpr uint32_t kDefaultSpinWaitUs = 1000;
  // Live wgpu objects by kind (wgpuGenerateReport over the process-wide
  // instance, so all devices together), for leak checks.
  std::vector<std::pair<std::string, uint64_t>> resource_report() const;
  // Deliberately destroys the device (tests of device loss use this).
  void destroy();

  // Reused per-dispatch uniform memory (see Recorder). `written` mirrors
  // the bytes the queue last wrote into the chunk's start, so that a
  // recording whose blocks equal them (the same call again) writes nothing.
  struct UniformChunk {
    BufferHandle buffer;
    std::vector<uint8_t> written;
  };
  UniformChunk take_uniform_chunk();
  void give_uniform_chunk(UniformChunk chunk);
  static constexpr uint64_t kUniformChunkBytes = 64 * 1024;

  // Reused upload memory for data that belongs to one recording (a replayed
  // step's batch): storage buffers of at least kStageChunkBytes.
  struct StageChunk {
    BufferHandle buffer;
    uint64_t bytes = 0;
  };
  StageChunk take_stage_chunk(uint64_t min_bytes);
  void give_stage_chunk(StageChunk chunk);
  static constexpr uint64_t kStageChunkBytes = 8ull << 20;

  // Grow-only storage scratch for split-K partial products. Replacing it while
  // recorded work still binds the old one is safe: wgpu keeps a buffer alive
  // for as long as a command encoder references it.
  WGPUBuffer workspace(uint64_t bytes);
  // Grow-only storage for GEMM operands copied to a padded layout (gemm_record.cpp),
  // one per operand (0: A, 1: B).
  WGPUBuffer repack_space(int operand, uint64_t bytes);

  // A 16-byte storage buffer for bindings a kernel variant declares but never
  // touches (gemm.wgsl's vec4 views when the operand is not aligned for them,
  // the operands of epilogues other than its own). The writable one is
  // another buffer: one dispatch cannot bind a buffer read-only and writable.
  WGPUBuffer placeholder(bool writable = false);

  // Host <-> device copies through the device's staging rings (transfer.hpp).
  Transfers& transfers() { return *transfers_; }

 private:
  Device() = default;
  // Grows `buf` (grow-only, 1.5x) to at least `bytes`.
  WGPUBuffer grow(BufferHandle& buf, uint64_t& have, uint64_t bytes, const char* label);
  static void on_device_lost(WGPUDevice const*, WGPUDeviceLostReason, WGPUStringView, void*, void*);
  static void on_uncaptured_error(WGPUDevice const*, WGPUErrorType, WGPUStringView, void*, void*);

  std::shared_ptr<InstanceHandle> instance_;  // process-wide (device.cpp)
  AdapterHandle adapter_;
  DeviceHandle device_;
  QueueHandle queue_;
  AdapterSummary info_;
  DeviceLimits limits_;
  std::vector<std::string> feature_names_;
  std::unique_ptr<PipelineCache> pipelines_;
  std::unique_ptr<BufferCache> memory_;
  std::unique_ptr<BindGroupCache> bind_groups_;
  GemmTuning gemm_tuning_;
  GemmSwitches gemm_switches_;
  std::vector<UniformChunk> uniform_pool_;
  std::vector<StageChunk> stage_pool_;
  std::unique_ptr<Transfers> transfers_;
  BufferHandle workspace_;
  uint64_t workspace_bytes_ = 0;
  BufferHandle repack_[2];
  uint64_t repack_bytes_[2] = {0, 0};
  BufferHandle placeholder_[2];  // read-only, writable

  std::recursive_mutex mu_;
  std::atomic<bool> lost_{false};
  std::atomic<bool> releasing_{false};
  uint32_t spin_wait_us_ = 0;
  mutable std::mutex msg_mu_;
  std::string lost_message_;
  std::string uncaptured_;          // errors outside any scope, reported by the next guarded() or check_unscoped()
  std::atomic<bool> stray_{false};  // uncaptured_ is not empty
  [[noreturn]] void throw_stray(const std::string& what);
};

std::string backend_name(WGPUBackendType t);

// Waits for a wgpu callback whose last act is done.store(true) (the callback
// may run on another thread: what it wrote before is visible once `done`
// reads true). Without `poll`, processes the instance's events (adapter and
// device requests, error scopes); with it, polls that device, blocking until
// submitted work advances (buffer maps), and gives up once it is lost. A
// `submission` index blocks only until that submission has finished (not
// every later one), so that later work keeps running while we wake.
void wait_for_callback(WGPUInstance instance, const std::atomic<bool>& done, const Device* poll = nullptr,
                       uint64_t submission = 0);

// Registers a work-done callback on `queue`; the returned flag turns true
// once every submission so far has finished.
std::shared_ptr<std::atomic<bool>> on_work_done(WGPUQueue queue);

}  // namespace pwt
