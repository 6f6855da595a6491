#include "transfer.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <system_error>

#include "device.hpp"
#include "env.hpp"
#include "faults.hpp"

namespace pwt {

namespace {
uint64_t round4(uint64_t n) { return (n + 3) & ~uint64_t(3); }

// A setting from the environment, refused outside [lo, hi] with its unit.
uint64_t env_setting(const char* name, uint64_t fallback, uint64_t lo, uint64_t hi) {
  const uint64_t v = env_count(name, fallback);
  if (v < lo || v > hi)
    throw ArgumentError(std::string(name) + " must be from " + std::to_string(lo) + " to " + std::to_string(hi) +
                        ", got " + std::to_string(v));
  return v;
}

// Staging buffers start at this size (or the chunk size, when smaller) and
// jump to a whole chunk's once a transfer needs more: small reads such as
// item() never allocate a full chunk, large ones never regrow step by step.
constexpr uint64_t kFirstSlotBytes = 1ull << 20;

// Chunks are no smaller than this (unless chunk_bytes is): below it, a
// chunk's own costs (a submission, a map request, a wake-up: tens of
// microseconds) would weigh on its copy.
constexpr uint64_t kMinChunkBytes = 4ull << 20;
}  // namespace

TransferSettings TransferSettings::from_env() {
  TransferSettings s;
  // Half the cores, at most 8: enough threads to keep a copy at memory speed
  // (one core's memcpy, with first-touch page faults on a fresh array, stays
  // well below the bus's speed) without taking every core from the caller's
  // other threads.
  const uint32_t cores = std::max(1u, std::thread::hardware_concurrency());
  s.copy_threads = uint32_t(env_setting("PYWGTRAIN_COPY_THREADS", std::clamp(cores / 2, 1u, 8u), 1, 64));
  s.chunk_bytes = env_setting("PYWGTRAIN_TRANSFER_CHUNK_KIB", s.chunk_bytes >> 10, 4, 1u << 20) << 10;
  s.slots = uint32_t(env_setting("PYWGTRAIN_TRANSFER_SLOTS", s.slots, 1, 16));
  s.queue_write_max = env_setting("PYWGTRAIN_QUEUE_WRITE_MAX_KIB", s.queue_write_max >> 10, 0, 1u << 20) << 10;
  return s;
}

// -- CopyPool ---------------------------------------------------------------------

CopyPool::~CopyPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void CopyPool::run(Job& j) {
  for (;;) {
    const uint64_t i = j.next.fetch_add(1);
    if (i >= j.parts) return;
    const uint64_t begin = i * j.part;
    std::memcpy(j.dst + begin, j.src + begin, std::min(j.part, j.bytes - begin));
    if (j.left.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lk(j.mu);
      j.cv.notify_all();
    }
  }
}

void CopyPool::work() {
  uint64_t seen = 0;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    run(*job);  // a finished job (a late wake-up) has no parts left: returns at once
  }
}

void CopyPool::copy(void* dst, const void* src, uint64_t bytes) {
  const uint64_t parts = std::min<uint64_t>(threads_, bytes / kMinPart);
  if (parts <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  auto job = std::make_shared<Job>();
  job->dst = static_cast<uint8_t*>(dst);
  job->src = static_cast<const uint8_t*>(src);
  job->bytes = bytes;
  job->part = ((bytes + parts - 1) / parts + 4095) & ~uint64_t(4095);  // whole pages per thread
  job->parts = (bytes + job->part - 1) / job->part;
  job->left = job->parts;
  {
    std::lock_guard<std::mutex> lk(mu_);
    try {
      while (workers_.size() + 1 < threads_) workers_.emplace_back([this] { work(); });
    } catch (const std::system_error&) {
      // No more threads to be had: the ones there are (the caller at least) copy every part.
    }
    job_ = job;
    ++generation_;
  }
  cv_.notify_all();
  run(*job);
  std::unique_lock<std::mutex> lk(job->mu);
  job->cv.wait(lk, [&] { return job->left.load() == 0; });
}

// -- Transfers ----------------------------------------------------------------------

// Shared with the map callback, which may run after the wait gave up (device
// loss) or while a staging buffer is released (an aborted map).
struct Transfers::MapState {
  std::atomic<bool> done{false};
  WGPUMapAsyncStatus status = WGPUMapAsyncStatus_Error;
  std::string message;
};

Transfers::Transfers(Device& dev, const TransferSettings& settings)
    : dev_(dev), settings_(settings), pool_(settings.copy_threads) {}

Transfers::~Transfers() { release(); }

const char* Transfers::map_state(const Slot& s) {
  // Tracked here: wgpu-native does not implement wgpuBufferGetMapState.
  if (s.mapped) return "mapped";
  if (!s.map) return "unmapped";
  if (!s.map->done.load(std::memory_order_acquire)) return "pending";
  return s.map->status == WGPUMapAsyncStatus_Success ? "mapped" : "unmapped";
}

void Transfers::unmap(Slot& s) {
  // Unmapping aborts a pending map (its callback runs with an error); a
  // lost device's buffers are released as they are.
  if (s.buffer && !dev_.lost() && std::strcmp(map_state(s), "unmapped") != 0) wgpuBufferUnmap(s.buffer.get());
  s.mapped = false;
  s.map.reset();
}

void Transfers::release_ring(std::vector<Slot>& ring) {
  for (auto& s : ring) unmap(s);
  ring.clear();
}

void Transfers::release() {
  std::lock_guard<std::mutex> ring(down_mu_);
  std::lock_guard<std::recursive_mutex> lk(dev_.mutex());
  release_ring(down_);
  release_ring(up_);
}

Transfers::Slot& Transfers::slot(std::vector<Slot>& ring, size_t i, uint64_t need, bool upload) {
  if (ring.size() <= i) ring.resize(i + 1);
  Slot& s = ring[i];
  if (s.bytes >= need) return s;
  const uint64_t whole = settings_.chunk_bytes + 8;  // a chunk, its lead and its padding to 4
  const uint64_t size = need <= std::min(kFirstSlotBytes, whole) ? std::min(kFirstSlotBytes, whole) : whole;
  WGPUBufferDescriptor d = WGPU_BUFFER_DESCRIPTOR_INIT;
  d.label = sv(upload ? "pywgtrain.upload_staging" : "pywgtrain.download_staging");
  d.size = size;
  d.usage =
      upload ? WGPUBufferUsage_MapWrite | WGPUBufferUsage_CopySrc : WGPUBufferUsage_MapRead | WGPUBufferUsage_CopyDst;
  d.mappedAtCreation = upload;  // an upload slot is ready for writing from the start
  unmap(s);
  s = Slot{};  // releases the old buffer
  s.buffer = BufferHandle(wgpuDeviceCreateBuffer(dev_.raw(), &d));
  if (!s.buffer) throw OutOfMemoryError("allocating a staging buffer of " + std::to_string(size) + " bytes");
  s.bytes = size;
  s.mapped = upload;
  return s;
}

void Transfers::request_map(Slot& s, bool write, uint64_t bytes) {
  auto state = std::make_shared<MapState>();
  WGPUBufferMapCallbackInfo cb = {};
  cb.mode = WGPUCallbackMode_AllowSpontaneous;
  cb.callback = [](WGPUMapAsyncStatus status, WGPUStringView msg, void* u1, void*) {
    auto* held = static_cast<std::shared_ptr<MapState>*>(u1);
    (*held)->status = status;
    (*held)->message = to_string(msg);
    (*held)->done.store(true, std::memory_order_release);
    delete held;
  };
  cb.userdata1 = new std::shared_ptr<MapState>(state);
  s.map = state;
  wgpuBufferMapAsync(s.buffer.get(), write ? WGPUMapMode_Write : WGPUMapMode_Read, 0, bytes, cb);
}

void Transfers::wait_unlocked(const std::atomic<bool>& done) {
  auto finished = [&] {
    wgpuDevicePoll(dev_.raw(), false, nullptr);
    return done.load(std::memory_order_acquire) || dev_.lost();
  };
  if (dev_.spin(finished)) return;
  // Then polls between sleeps of up to 250 us: a wake-up later by at most
  // that much, at a few thousand cheap polls a second while it waits.
  for (auto pause = std::chrono::microseconds(20); !finished(); pause = std::min(2 * pause, decltype(pause)(250)))
    std::this_thread::sleep_for(pause);
}

void Transfers::await_map(Slot& s, const std::string& what, bool locked) {
  const std::shared_ptr<MapState> m = std::move(s.map);
  if (!m) throw GpuError(what + ": no map of the staging buffer was requested");
  if (locked) {
    wait_for_callback(dev_.instance(), m->done, &dev_, s.submission);
  } else {
    wait_unlocked(m->done);
  }
  dev_.ensure_alive(what);
  s.mapped = m->status == WGPUMapAsyncStatus_Success;
  std::string failure = s.mapped ? std::string() : m->message.empty() ? std::string("no reason given") : m->message;
  switch (take_map_fault()) {
    case MapFault::None:
      break;
    case MapFault::Fail:
      failure = "injected failure";
      break;
    case MapFault::LoseDevice:
      dev_.destroy();
      dev_.ensure_alive(what);
      break;
  }
  if (!failure.empty()) throw GpuError(what + ": mapping a staging buffer failed: " + failure);
}

uint64_t Transfers::chunk_for(uint64_t bytes) const {
  // A transfer of a few chunks' worth is cut into `slots` chunks, so that the
  // GPU's copy of one overlaps the host's copy of the next; a multiple of
  // 64 KiB (of 4, as every chunk must start at the same lead).
  const uint64_t even = ((bytes + settings_.slots - 1) / settings_.slots + 0xFFFF) & ~uint64_t(0xFFFF);
  return std::min(settings_.chunk_bytes, std::max(kMinChunkBytes, even));
}

uint64_t Transfers::submit_copy(WGPUBuffer src, uint64_t src_off, WGPUBuffer dst, uint64_t dst_off, uint64_t bytes) {
  CommandEncoderHandle enc(wgpuDeviceCreateCommandEncoder(dev_.raw(), nullptr));
  wgpuCommandEncoderCopyBufferToBuffer(enc.get(), src, src_off, dst, dst_off, bytes);
  CommandBufferHandle cmd(wgpuCommandEncoderFinish(enc.get(), nullptr));
  WGPUCommandBuffer cmds[] = {cmd.get()};
  return wgpuQueueSubmitForIndex(dev_.queue(), 1, cmds);
}

void Transfers::upload(WGPUBuffer dst, uint64_t offset, const void* src, uint64_t bytes) {
  const std::string what = "uploading " + std::to_string(bytes) + " bytes";
  const auto* in = static_cast<const uint8_t*>(src);
  const uint64_t whole = bytes & ~uint64_t(3);
  dev_.guarded(what, [&] {
    if (bytes <= settings_.queue_write_max) {
      // Small: the queue's own staging and no submission (its copy runs
      // ahead of the next one); a submission per write costs more than a
      // memcpy of this size.
      if (whole) wgpuQueueWriteBuffer(dev_.queue(), dst, offset, in, whole);
      if (whole != bytes) {  // ragged tail: pad to the 4-byte copy granule
        uint8_t tail[4] = {0, 0, 0, 0};
        std::memcpy(tail, in + whole, bytes - whole);
        wgpuQueueWriteBuffer(dev_.queue(), dst, offset + whole, tail, 4);
      }
      return;
    }
    const uint64_t chunk = chunk_for(bytes);
    const uint64_t n = (bytes + chunk - 1) / chunk;
    const size_t depth = size_t(std::min<uint64_t>(n, settings_.slots));
    try {
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t len = std::min(chunk, bytes - i * chunk), copy = round4(len);
        Slot& s = slot(up_, size_t(i % depth), copy, true);
        if (!s.mapped) await_map(s, what);  // its last copy has finished
        auto* p = static_cast<uint8_t*>(wgpuBufferGetMappedRange(s.buffer.get(), 0, s.bytes));
        if (!p) throw GpuError(what + ": the staging buffer's mapped memory is unavailable");
        pool_.copy(p, in + i * chunk, len);
        std::memset(p + len, 0, copy - len);
        wgpuBufferUnmap(s.buffer.get());
        s.mapped = false;
        s.submission = submit_copy(s.buffer.get(), 0, dst, offset + i * chunk, copy);
        request_map(s, true, s.bytes);  // ready again once this copy is done
      }
    } catch (...) {
      release_ring(up_);  // (not the download ring: a download in flight may be using it)
      throw;
    }
  });
}

void Transfers::download(WGPUBuffer src, uint64_t offset, void* dst, uint64_t bytes) {
  const std::string what = "downloading " + std::to_string(bytes) + " bytes";
  auto* out = static_cast<uint8_t*>(dst);
  const uint64_t chunk = chunk_for(bytes);  // a multiple of 4: every chunk has the same lead
  const uint64_t n = (bytes + chunk - 1) / chunk;
  const uint64_t lead = offset & 3, base = offset - lead;
  const size_t depth = size_t(std::min<uint64_t>(n, settings_.slots));
  auto length = [&](uint64_t i) { return std::min(chunk, bytes - i * chunk); };
  // Chunk i: a copy into slot i % depth, then a map that completes once the copy has.
  auto issue = [&](uint64_t i) {
    const uint64_t copy = round4(lead + length(i));
    Slot& s = slot(down_, size_t(i % depth), copy, false);
    s.submission = submit_copy(src, base + i * chunk, s.buffer.get(), 0, copy);
    request_map(s, false, copy);
  };
  // Chunk i's mapped bytes into `out`; unmaps its slot. The wgpu calls run
  // under the device's lock without error scopes (their errors are reported
  // synchronously: Device::check_unscoped), the host copy outside it.
  auto take = [&](uint64_t i) {
    Slot& s = down_[size_t(i % depth)];
    const uint64_t len = length(i);
    const uint8_t* p;
    {
      std::lock_guard<std::recursive_mutex> lk(dev_.mutex());
      p = static_cast<const uint8_t*>(wgpuBufferGetConstMappedRange(s.buffer.get(), 0, round4(lead + len)));
      dev_.check_unscoped(what);
    }
    if (!p) throw GpuError(what + ": the staging buffer's mapped memory is unavailable");
    pool_.copy(out + i * chunk, p + lead, len);
    std::lock_guard<std::recursive_mutex> lk(dev_.mutex());
    wgpuBufferUnmap(s.buffer.get());
    s.mapped = false;
    dev_.check_unscoped(what);
  };
  auto delay_for_tests = [] {
    if (const uint32_t ms = take_download_delay()) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  };
  std::lock_guard<std::mutex> ring(down_mu_);
  try {
    if (n <= depth) {
      // Every chunk's copy is submitted at once, in one locked step after
      // all work submitted before: the read is one snapshot, and the waits
      // and host copies that follow leave the device to other threads.
      dev_.guarded(what, [&] {
        for (uint64_t i = 0; i < n; ++i) issue(i);
      });
      delay_for_tests();
      for (uint64_t i = 0; i < n; ++i) {
        await_map(down_[size_t(i)], what, false);
        take(i);
      }
    } else {
      // More chunks than staging buffers: a later chunk's copy is submitted
      // once an earlier one is out, and another thread's submission or
      // queue write in between could change the source under it. So wait
      // for the work submitted so far without the lock (earlier work, the
      // long wait), then hold the lock from the first copy to the last.
      std::shared_ptr<std::atomic<bool>> drained;
      {
        std::lock_guard<std::recursive_mutex> lk(dev_.mutex());
        dev_.ensure_alive(what);
        drained = on_work_done(dev_.queue());
      }
      delay_for_tests();
      wait_unlocked(*drained);
      dev_.guarded(what, [&] {
        for (uint64_t i = 0; i < depth; ++i) issue(i);
        for (uint64_t i = 0; i < n; ++i) {
          await_map(down_[size_t(i % depth)], what);
          take(i);
          if (i + depth < n) issue(i + depth);
        }
      });
    }
  } catch (...) {
    std::lock_guard<std::recursive_mutex> lk(dev_.mutex());
    release_ring(down_);
    release_ring(up_);  // (used only under the device's lock: idle now)
    throw;
  }
}

std::vector<Transfers::SlotInfo> Transfers::report() {
  std::lock_guard<std::mutex> ring(down_mu_);
  std::lock_guard<std::recursive_mutex> lk(dev_.mutex());
  std::vector<SlotInfo> out;
  for (const auto* ring : {&down_, &up_}) {
    for (const auto& s : *ring) {
      if (s.buffer) out.push_back({ring == &down_ ? "download" : "upload", map_state(s), s.bytes});
    }
  }
  return out;
}

}  // namespace pwt
