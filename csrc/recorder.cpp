#include "recorder.hpp"

#include <array>
#include <cstring>
#include <utility>

#include "timing.hpp"

namespace pwt {

Recorder::Recorder(std::shared_ptr<Device> dev) : dev_(std::move(dev)) {}

Recorder::~Recorder() { discard(); }

void Recorder::ensure_encoder() {
  if (encoder_) return;
  recording_step("creating a command encoder",
                 [&] { encoder_ = CommandEncoderHandle(wgpuDeviceCreateCommandEncoder(dev_->raw(), nullptr)); });
  ticket_ = dev_->memory().recording_opened();
}

void Recorder::close_recording() {
  if (ticket_) dev_->memory().recording_closed(std::exchange(ticket_, 0));
}

StepGraph::~StepGraph() {
  for (auto& b : bound_) dev_->memory().unpin(b.get());
  for (auto& c : chunks_) dev_->bind_groups().forget(c.get());  // no recording takes these chunks again
}

BindGroupHandle Recorder::bind_group(const Kernel& k, const WGPUBindGroupEntry* entries, size_t count) {
  if (dev_->lost()) {
    dev_->bind_groups().clear();  // nothing can use them any more
    dev_->ensure_alive("recording " + k.name);
  }
  return dev_->bind_groups().get(k.layout.get(), entries, count, [&](const WGPUBindGroupDescriptor& d) {
    BindGroupHandle group(wgpuDeviceCreateBindGroup(dev_->raw(), &d));
    dev_->check_unscoped("recording " + k.name);  // a refused group is not kept
    return group;
  });
}

void Recorder::ensure_pass() {
  ensure_encoder();
  if (pass_) return;
  WGPUComputePassDescriptor d = {};
  if (timed_) d.timestampWrites = &timestamps_;
  pass_ = ComputePassHandle(wgpuCommandEncoderBeginComputePass(encoder_.get(), &d));
  timed_ = false;
}

void Recorder::end_pass() {
  if (!pass_) return;
  wgpuComputePassEncoderEnd(pass_.get());
  pass_.reset();
}

void Recorder::time_next_pass(WGPUQuerySet set, uint32_t begin_index, uint32_t end_index) {
  end_pass();
  timestamps_ = {};
  timestamps_.querySet = set;
  timestamps_.beginningOfPassWriteIndex = begin_index;
  timestamps_.endOfPassWriteIndex = end_index;
  timed_ = true;
}

Range Recorder::uniform_block(const void* params, size_t bytes) {
  const uint64_t align = std::max<uint32_t>(dev_->limits().uniform_offset_alignment, 16);
  const uint64_t need = (bytes + align - 1) / align * align;
  if (uniforms_.empty() || uniforms_.back().data.size() + need > Device::kUniformChunkBytes) {
    uniforms_.push_back(UniformChunk{dev_->take_uniform_chunk(), {}, false});
    uniforms_.back().data.reserve(Device::kUniformChunkBytes);
  }
  auto& c = uniforms_.back();
  const uint64_t offset = c.data.size();
  uniform_offset_ = offset;
  c.data.resize(offset + need, 0);
  std::memcpy(c.data.data() + offset, params, bytes);
  return Range{c.chunk.buffer.get(), offset, (bytes + 15) & ~uint64_t(15)};
}

Range Recorder::stage(const void* data, uint64_t bytes) {
  if (bytes == 0 || bytes % 4)
    throw ArgumentError("stage: size must be a positive multiple of 4 bytes, got " + std::to_string(bytes));
  if (bytes > dev_->limits().max_storage_binding)
    throw ArgumentError("stage: " + std::to_string(bytes) + " bytes exceed max_storage_buffer_binding_size " +
                        std::to_string(dev_->limits().max_storage_binding));
  const uint64_t align = std::max<uint32_t>(dev_->limits().storage_offset_alignment, 4);
  if (stages_.empty() || stages_.back().used + bytes > stages_.back().chunk.bytes)
    stages_.push_back(StageUse{dev_->take_stage_chunk(bytes), 0});
  auto& s = stages_.back();
  const uint64_t offset = s.used;
  s.used = (offset + bytes + align - 1) / align * align;
  recording_step("staging " + std::to_string(bytes) + " bytes",
                 [&] { wgpuQueueWriteBuffer(dev_->queue(), s.chunk.buffer.get(), offset, data, bytes); });
  return Range{s.chunk.buffer.get(), offset, bytes};
}

void Recorder::record_dispatch(const Kernel& k, Operands operands, const void* params, size_t params_bytes,
                               const char* params_type, uint32_t gx, uint32_t gy, uint32_t gz) {
  const auto& lim = dev_->limits();
  if (gx > lim.max_workgroups_per_dim || gy > lim.max_workgroups_per_dim || gz > lim.max_workgroups_per_dim)
    throw ArgumentError(k.name + ": dispatch of (" + std::to_string(gx) + ", " + std::to_string(gy) + ", " +
                        std::to_string(gz) + ") workgroups exceeds the device limit of " +
                        std::to_string(lim.max_workgroups_per_dim) + " per dimension");
  // The contract first (these are errors in the launcher, whatever the grid).
  if (k.uniform && (!params_type || std::strcmp(params_type, k.uniform->type) != 0))
    throw ArgumentError(k.name + ": binding " + std::to_string(k.uniform->binding) + " (" + k.uniform->var +
                        ") takes a " + k.uniform->type + ", the launcher passed " +
                        (params_type ? params_type : "no uniform block"));
  if (!k.uniform && params_type)
    throw ArgumentError(k.name + ": the kernel has no uniform binding, the launcher passed a " + params_type);
  for (const Operand& op : operands) {
    const Slot* slot = nullptr;
    for (const Slot& s : k.bindings)
      if (s.binding == op.binding) slot = &s;
    if (!slot || slot->kind == Bind::Uniform)
      throw ArgumentError(k.name + ": an operand for binding " + std::to_string(op.binding) +
                          ", which is not a storage binding of the kernel");
  }
  if (gx == 0 || gy == 0 || gz == 0) return;
  // Fixed storage: this runs for every dispatch, and an allocation is a
  // sizable part of its cost (PipelineCache refuses kernels with more).
  std::array<WGPUBindGroupEntry, kMaxBindings> entries;
  size_t count = 0;
  uint32_t uniform_offset = 0;  // the block's dynamic offset: the group binds its chunk from 0
  for (const Slot& slot : k.bindings) {
    Range r;
    if (slot.kind == Bind::Uniform) {
      r = uniform_block(params, params_bytes);
      uniform_offset = uint32_t(r.offset);
      r.offset = 0;
    } else {
      const Operand* found = nullptr;
      for (const Operand& op : operands) {
        if (op.binding != slot.binding) continue;
        if (found)
          throw ArgumentError(k.name + ": two operands for binding " + std::to_string(slot.binding) + " (" + slot.var +
                              ")");
        found = &op;
      }
      if (!found)
        throw ArgumentError(k.name + ": no operand for binding " + std::to_string(slot.binding) + " (" + slot.var +
                            ")");
      r = found->range;
      if (r.size > lim.max_storage_binding)
        throw ArgumentError(k.name + ": binding of " + std::to_string(r.size) +
                            " bytes exceeds max_storage_buffer_binding_size " +
                            std::to_string(lim.max_storage_binding));
    }
    WGPUBindGroupEntry& e = entries[count++];
    e = {};
    e.binding = slot.binding;
    e.buffer = r.buffer;
    e.offset = r.offset;
    e.size = r.size;
  }
  ensure_pass();
  // No error scopes here (Device::check_unscoped says why); what the calls
  // raise is attributed to this kernel by the check right after them.
  std::lock_guard<std::recursive_mutex> lk(dev_->mutex());
  try {
    BindGroupHandle group = bind_group(k, entries.data(), count);
    wgpuComputePassEncoderSetPipeline(pass_.get(), k.pipeline.get());
    wgpuComputePassEncoderSetBindGroup(pass_.get(), 0, group.get(), k.uniform ? 1 : 0, &uniform_offset);
    wgpuComputePassEncoderDispatchWorkgroups(pass_.get(), gx, gy, gz);
    dev_->check_unscoped("recording " + k.name);
    if (graph_) {
      // References taken now: a temporary bound here may be released before
      // the capture ends, and its handle's address reused by another buffer.
      for (size_t i = 0; i < count; ++i) {
        const WGPUBuffer b = entries[i].buffer;
        bool known = false;
        for (auto& h : graph_->bound_) known = known || h.get() == b;
        if (known) continue;
        wgpuBufferAddRef(b);
        graph_->bound_.push_back(BufferHandle(b));
        dev_->memory().pin(b);
      }
      const bool has_uniform = !uniforms_.empty() && params_bytes;
      graph_->dispatches_.push_back({&k, std::move(group),
                                     std::vector<WGPUBindGroupEntry>(entries.begin(), entries.begin() + count),
                                     has_uniform ? uniforms_.size() - 1 : 0, has_uniform ? uniform_offset_ : 0,
                                     uint32_t(has_uniform ? params_bytes : 0), gx, gy, gz});
    }
  } catch (...) {
    discard();  // as recording_step does: the recording is broken
    throw;
  }
  ++commands_;
}

void Recorder::copy(const Buffer& src, uint64_t so, const Buffer& dst, uint64_t doff, uint64_t bytes) {
  if (bytes == 0) return;
  if (graph_) throw ArgumentError("a buffer copy cannot be captured in a step graph");
  check_range(src, so, bytes, "copy source");
  check_range(dst, doff, bytes, "copy destination");
  end_pass();
  ensure_encoder();
  recording_step("recording a copy of " + std::to_string(bytes) + " bytes", [&] {
    wgpuCommandEncoderCopyBufferToBuffer(encoder_.get(), src.raw(), src.offset() + so, dst.raw(), dst.offset() + doff,
                                         bytes);
  });
  ++commands_;
}

void Recorder::write(const Buffer& dst, uint64_t offset, const void* data, uint64_t bytes) {
  check_range(dst, offset, bytes, "write destination");
  const Range src = stage(data, bytes);
  end_pass();
  ensure_encoder();
  recording_step("recording a write of " + std::to_string(bytes) + " bytes", [&] {
    wgpuCommandEncoderCopyBufferToBuffer(encoder_.get(), src.buffer, src.offset, dst.raw(), dst.offset() + offset,
                                         bytes);
  });
  ++commands_;
}

void Recorder::fill_zero(const Buffer& dst, uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return;
  if (graph_) throw ArgumentError("a buffer clear cannot be captured in a step graph");
  check_range(dst, offset, bytes, "clear");
  end_pass();
  ensure_encoder();
  recording_step("recording a clear of " + std::to_string(bytes) + " bytes",
                 [&] { wgpuCommandEncoderClearBuffer(encoder_.get(), dst.raw(), dst.offset() + offset, bytes); });
  ++commands_;
}

void Recorder::resolve_queries(WGPUQuerySet set, uint32_t count, const Buffer& dst) {
  end_pass();
  ensure_encoder();
  recording_step("resolving timestamp queries",
                 [&] { wgpuCommandEncoderResolveQuerySet(encoder_.get(), set, 0, count, dst.raw(), dst.offset()); });
  ++commands_;
}

void Recorder::begin_capture() {
  if (pending()) throw ArgumentError("begin_capture: the recorder already holds uncaptured work; submit it first");
  graph_ = std::make_unique<StepGraph>();
  graph_->dev_ = dev_;
}

std::unique_ptr<StepGraph> Recorder::end_capture() {
  if (!graph_) throw ArgumentError("end_capture without begin_capture");
  auto g = std::move(graph_);
  // The graph shares the uniform chunks from now on: they never return to
  // the pool. submit() writes this recording's bytes once; replays rebind
  // the blocks that change.
  for (auto& chunk : uniforms_) {
    wgpuBufferAddRef(chunk.chunk.buffer.get());
    g->chunks_.push_back(BufferHandle(chunk.chunk.buffer.get()));
    g->data_.push_back(chunk.data);
    chunk.owned_by_graph = true;
  }
  return g;
}

std::vector<std::string> StepGraph::kernel_names() const {
  std::vector<std::string> names;
  for (auto& d : dispatches_) names.push_back(d.kernel->name);
  return names;
}

void Recorder::replay(StepGraph& g, const std::vector<Rebind>& rebinds, PassTimer* timer) {
  if (graph_) throw ArgumentError("replay while capturing");
  if (g.dispatches_.empty()) return;
  if (g.dev_ != dev_) throw ArgumentError("replay: the graph was captured on another device");
  for (auto& rb : rebinds)
    if (rb.from.size != rb.to.size)
      throw ArgumentError("replay: a rebind of " + std::to_string(rb.from.size) + " bytes to a range of " +
                          std::to_string(rb.to.size) + " bytes");
  // The rebound groups first, outside the error scopes recording_step opens
  // (bind_group() checks each new one at once, so that a refused group is
  // never cached), and before anything of the replay is recorded.
  std::vector<BindGroupHandle> rebound(rebinds.empty() ? 0 : g.dispatches_.size());
  if (!rebinds.empty()) {
    std::lock_guard<std::recursive_mutex> lk(dev_->mutex());
    std::vector<WGPUBindGroupEntry> entries;
    for (size_t i = 0; i < g.dispatches_.size(); ++i) {
      auto& d = g.dispatches_[i];
      entries = d.entries;
      bool changed = false;
      for (auto& e : entries) {
        for (auto& rb : rebinds) {
          if (e.buffer != rb.from.buffer || e.offset + e.size <= rb.from.offset ||
              e.offset >= rb.from.offset + rb.from.size)
            continue;
          if (e.offset < rb.from.offset || e.offset + e.size > rb.from.offset + rb.from.size)
            throw ArgumentError("replay: " + d.kernel->name + " binds a range that straddles a rebound one");
          e.buffer = rb.to.buffer;
          e.offset = rb.to.offset + (e.offset - rb.from.offset);
          changed = true;
          break;
        }
      }
      if (changed) rebound[i] = bind_group(*d.kernel, entries.data(), entries.size());
    }
  }
  ensure_pass();
  recording_step("replaying a captured step", [&] {
    for (size_t i = 0; i < g.dispatches_.size(); ++i) {
      auto& d = g.dispatches_[i];
      if (timer) {
        timer->time_next_pass(*this, uint32_t(i));
        ensure_pass();
      }
      const WGPUBindGroup group = !rebound.empty() && rebound[i] ? rebound[i].get() : d.group.get();
      const uint32_t uniform_offset = uint32_t(d.offset);
      wgpuComputePassEncoderSetPipeline(pass_.get(), d.kernel->pipeline.get());
      wgpuComputePassEncoderSetBindGroup(pass_.get(), 0, group, d.kernel->uniform ? 1 : 0, &uniform_offset);
      wgpuComputePassEncoderDispatchWorkgroups(pass_.get(), d.gx, d.gy, d.gz);
    }
  });
  commands_ += g.dispatches_.size();
}

void Recorder::discard() {
  pass_.reset();
  encoder_.reset();
  close_recording();
  for (auto& c : uniforms_)
    if (!c.owned_by_graph) dev_->give_uniform_chunk(std::move(c.chunk));
  uniforms_.clear();
  for (auto& s : stages_) dev_->give_stage_chunk(std::move(s.chunk));
  stages_.clear();
  commands_ = 0;
  timed_ = false;
  graph_.reset();
}

void Recorder::recording_step(const std::string& what, const std::function<void()>& body) {
  try {
    dev_->guarded(what, body);
  } catch (const std::exception& e) {
    // wgpu-native aborts the process when an invalid command buffer is
    // submitted, so a failed step invalidates everything recorded with it.
    discard();
    throw;
  }
}

void Recorder::check_range(const Buffer& b, uint64_t offset, uint64_t bytes, const char* what) const {
  // Checked here: wgpu-native validates copies only at submit, where an error is fatal.
  if (offset % 4 || bytes % 4)
    throw ValidationError(std::string(what) + ": offset " + std::to_string(offset) + " and size " +
                          std::to_string(bytes) + " must be multiples of 4 bytes");
  const uint64_t extent = (b.bytes() + 3) & ~uint64_t(3);
  if (offset + bytes > extent)
    throw ValidationError(std::string(what) + ": copy of " + std::to_string(bytes) + " bytes at offset " +
                          std::to_string(offset) + " overruns a buffer of " + std::to_string(extent) + " bytes");
}

uint64_t Recorder::submit() {
  if (!encoder_) return 0;
  end_pass();
  uint64_t index = 0;
  // Whatever happens, the recorder ends empty and its uniform chunks return.
  auto encoder = std::move(encoder_);
  auto chunks = std::move(uniforms_);
  uniforms_.clear();
  auto stages = std::move(stages_);
  stages_.clear();
  commands_ = 0;
  std::exception_ptr err;
  try {
    // Finish in its own scope: an invalid command buffer must never reach
    // wgpuQueueSubmit, whose errors wgpu-native treats as fatal.
    CommandBufferHandle cmd;
    dev_->guarded("finishing recorded GPU work",
                  [&] { cmd = CommandBufferHandle(wgpuCommandEncoderFinish(encoder.get(), nullptr)); });
    dev_->guarded("submitting recorded GPU work", [&] {
      for (auto& c : chunks) {
        // A chunk that already holds these bytes (the same calls as its
        // last recording) needs no write: queue writes are ordered with
        // submissions, so the last one written is what the GPU reads. This
        // spares a one-call submission wgpu's staging buffer and copy.
        auto& w = c.chunk.written;
        if (c.data.empty() || (c.data.size() <= w.size() && std::memcmp(c.data.data(), w.data(), c.data.size()) == 0))
          continue;
        wgpuQueueWriteBuffer(dev_->queue(), c.chunk.buffer.get(), 0, c.data.data(), c.data.size());
        w.swap(c.data);
      }
      WGPUCommandBuffer cmds[] = {cmd.get()};
      index = wgpuQueueSubmitForIndex(dev_->queue(), 1, cmds);
    });
  } catch (...) {
    // A failed write or submit leaves the chunks' contents unknown.
    err = std::current_exception();
    for (auto& c : chunks) c.chunk.written.clear();
  }
  close_recording();  // after the submit: memory released meanwhile waits until its work is queued
  for (auto& c : chunks)
    if (!c.owned_by_graph) dev_->give_uniform_chunk(std::move(c.chunk));
  for (auto& s : stages) dev_->give_stage_chunk(std::move(s.chunk));
  if (err) std::rethrow_exception(err);
  return index;
}

}  // namespace pwt
