// Batched recording: many dispatches and copies go into one command encoder
// and reach the GPU in one submit. Every operation in the core records into a
// Recorder; the synchronous helpers make one, record, submit.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <memory>
#include <vector>

#include "buffer.hpp"
#include "pipeline_cache.hpp"

namespace pwt {

class PassTimer;

// A byte range of a buffer bound to one shader binding.
struct Range {
  WGPUBuffer buffer = nullptr;
  uint64_t offset = 0;
  uint64_t size = 0;
};
inline Range whole(const Buffer& b) {
  return Range{b.raw(), b.offset(), std::max<uint64_t>(4, (b.bytes() + 3) & ~uint64_t(3))};
}

// A storage range bound to one named binding of a kernel (a Slot of
// wgsl::<shader>, shader_contract.hpp).
struct Operand {
  Operand() = default;
  Operand(const Slot& slot, const Range& r) : binding(slot.binding), range(r) {}
  uint32_t binding = 0;
  Range range;
};

// The operands of one dispatch, as a braced list at the call site or a
// vector: a view, so that recording a dispatch allocates nothing for them. A
// view of a braced list is valid for the call it is passed to (the list's
// array lives to the end of the call's full expression), and no longer.
class Operands {
 public:
  Operands(std::initializer_list<Operand> list) : Operands(list.begin(), list.size()) {}
  Operands(const std::vector<Operand>& v) : first_(v.data()), count_(v.size()) {}  // NOLINT: implicit by design
  Operands(const Operand* first, size_t count) : first_(first), count_(count) {}
  const Operand* begin() const { return first_; }
  const Operand* end() const { return first_ + count_; }

 private:
  const Operand* first_;
  size_t count_;
};

// One binding range of a captured graph pointed elsewhere for one replay
// (`to` has the size of `from`; bindings inside `from` keep their offset in it).
struct Rebind {
  Range from;
  Range to;
};

// A recorded sequence of dispatches that can be re-encoded cheaply: it keeps
// each dispatch's pipeline, bind group and uniform block, so a training step
// captured once replays without Python, kernel lookups or bind-group creation
// (the WebGPU counterpart of a CUDA graph; command buffers themselves cannot
// be resubmitted). What changes between steps (the batch, where the loss
// goes) is rebound per replay. The graph holds a reference to every buffer it
// binds.
class StepGraph {
 public:
  StepGraph() = default;
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  size_t size() const { return dispatches_.size(); }
  // Kernel name of each captured dispatch (profiles).
  std::vector<std::string> kernel_names() const;

 private:
  friend class Recorder;
  struct Dispatch {
    const Kernel* kernel;
    BindGroupHandle group;
    std::vector<WGPUBindGroupEntry> entries;
    size_t chunk;
    uint64_t offset;
    uint32_t bytes;
    uint32_t gx, gy, gz;
  };
  std::shared_ptr<Device> dev_;
  std::vector<Dispatch> dispatches_;
  std::vector<BufferHandle> chunks_;
  std::vector<std::vector<uint8_t>> data_;
  std::vector<BufferHandle> bound_;  // references to every buffer a dispatch binds (pinned: never cached)
};

class Recorder {
 public:
  explicit Recorder(std::shared_ptr<Device> dev);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  Device& device() { return *dev_; }
  const std::shared_ptr<Device>& device_ptr() const { return dev_; }

  // Each storage binding of the kernel gets the one operand naming it (an
  // operand for a binding the kernel lacks, a binding without one or with two
  // is an error); `params`, a uniform block of shader_contract.hpp of the
  // type the kernel's uniform binding declares, is copied into per-dispatch
  // uniform memory.
  template <typename P>
  void dispatch(const Kernel& k, Operands operands, const P& params, uint32_t gx, uint32_t gy = 1, uint32_t gz = 1) {
    record_dispatch(k, operands, &params, sizeof(P), UniformTraits<P>::name, gx, gy, gz);
  }
  // A kernel without a uniform binding.
  void dispatch(const Kernel& k, Operands operands, uint32_t gx, uint32_t gy = 1, uint32_t gz = 1) {
    record_dispatch(k, operands, nullptr, 0, nullptr, gx, gy, gz);
  }
  void copy(const Buffer& src, uint64_t src_offset, const Buffer& dst, uint64_t dst_offset, uint64_t bytes);
  void fill_zero(const Buffer& dst, uint64_t offset, uint64_t bytes);
  // Next compute pass writes GPU timestamps at its start and end (benchmarks).
  void time_next_pass(WGPUQuerySet set, uint32_t begin_index, uint32_t end_index);
  void end_pass();
  void resolve_queries(WGPUQuerySet set, uint32_t count, const Buffer& dst);

  size_t pending() const { return commands_; }
  // Finishes and submits everything recorded (one submit); the recorder is
  // reusable afterwards. Returns the submission index (0 if nothing was recorded).
  uint64_t submit();
  // Drops everything recorded and not yet submitted.
  void discard();

  // Capture: dispatches recorded between begin_capture() and end_capture()
  // are also kept in a StepGraph (copies and clears are not capturable).
  void begin_capture();
  std::unique_ptr<StepGraph> end_capture();
  bool capturing() const { return graph_ != nullptr; }
  size_t captured() const { return graph_ ? graph_->dispatches_.size() : 0; }
  // Records the graph's dispatches again, each binding that lies inside a
  // rebind's `from` range bound to its `to` range instead (new bind groups
  // for those dispatches only). With `timer`, each dispatch runs in its own
  // timed pass (index = dispatch index; profiles only: the pass breaks cost
  // time of their own).
  void replay(StepGraph& graph, const std::vector<Rebind>& rebinds = {}, PassTimer* timer = nullptr);

  // Data that belongs to this recording only (a replayed step's batch):
  // written now into recorder-owned device memory, which queue order keeps
  // intact until this recording has run. Storage-aligned.
  Range stage(const void* data, uint64_t bytes);
  // Host data written into dst at this point of the recording (staged, then
  // copied: in stream order, unlike a queue write). Allowed while capturing
  // and not kept in the graph: replays bind fresh data in dst's place
  // (graphs.py's feeds), so only dispatches may read what it writes.
  void write(const Buffer& dst, uint64_t offset, const void* data, uint64_t bytes);
  // A uniform block of this recording (written at submit).
  Range uniform_block(const void* params, size_t bytes);

 private:
  void record_dispatch(const Kernel& k, Operands operands, const void* params, size_t params_bytes,
                       const char* params_type, uint32_t gx, uint32_t gy, uint32_t gz);
  // The group of `k` binding `entries`, from the device's cache (created and
  // checked on a miss). Under the device's lock; a lost device throws.
  BindGroupHandle bind_group(const Kernel& k, const WGPUBindGroupEntry* entries, size_t count);
  void ensure_encoder();  // opens the recording (the caching allocator's ticket)
  void close_recording();
  // Runs one recording call inside error scopes; on error discards the whole
  // recording (see recorder.cpp) and rethrows.
  void recording_step(const std::string& what, const std::function<void()>& body);
  void check_range(const Buffer& b, uint64_t offset, uint64_t bytes, const char* what) const;
  void ensure_pass();

  std::shared_ptr<Device> dev_;
  CommandEncoderHandle encoder_;
  ComputePassHandle pass_;
  struct UniformChunk {
    Device::UniformChunk chunk;
    std::vector<uint8_t> data;  // this recording's blocks, written at submit
    bool owned_by_graph = false;
  };
  std::vector<UniformChunk> uniforms_;
  struct StageUse {
    Device::StageChunk chunk;
    uint64_t used = 0;
  };
  std::vector<StageUse> stages_;
  size_t commands_ = 0;
  uint64_t ticket_ = 0;  // BufferCache::recording_opened()'s while an encoder is open
  bool timed_ = false;
  std::unique_ptr<StepGraph> graph_;
  uint64_t uniform_offset_ = 0;  // offset of the last uniform block in uniforms_.back()
  WGPUPassTimestampWrites timestamps_ = {};
};

}  // namespace pwt
