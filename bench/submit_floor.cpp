// What one small GPU call costs through wgpu-native, with and without our
// core: wall clock of recording, wgpuQueueSubmit and the wait until the
// queue's work-done callback fires (spinning on a non-blocking wgpuDevicePoll,
// as Device::wait does), per variant, median of many calls, variants
// interleaved over rounds. The raw variants use only wgpu-native's C API (the
// device comes from our Device::open; nothing timed goes through our code):
//
//   raw empty   an encoder finished and submitted with no commands
//   raw nop     one compute pass dispatching one workgroup of an empty kernel
//   raw bind    the same kernel writing one float, its bind group created per
//               call (as every recorded op creates its own)
//   core 1xKxN  our Recorder: a GEMV x @ W.T recorded with gemm(), submitted,
//               then Device::wait
//
// It says how much of a one-call GEMV is wgpu-native and the driver (issue 16,
// docs/performance.md). Prints one line per variant per round.
//
// --cuda-context first makes a CUDA context current on this thread (libcuda
// through dlopen, the driver API's primary context), as a PyTorch process
// comparing against cuBLAS has one: to see whether its mere presence changes
// Vulkan's latency.
//
//   submit_floor [--calls N] [--rounds R] [--adapter NAME] [--cuda-context]
#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops.hpp"

using namespace pwt;
using Clock = std::chrono::steady_clock;

namespace {

double us(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Spins until every submission so far has finished: the queue's work-done
// callback, pumped by non-blocking polls `gap_us` apart (0: back to back).
void wait_raw(WGPUDevice device, WGPUQueue queue, double gap_us = 0) {
  std::atomic<bool> done{false};
  WGPUQueueWorkDoneCallbackInfo cb = {};
  cb.mode = WGPUCallbackMode_AllowSpontaneous;
  cb.callback = [](WGPUQueueWorkDoneStatus, WGPUStringView, void* flag, void*) {
    static_cast<std::atomic<bool>*>(flag)->store(true, std::memory_order_release);
  };
  cb.userdata1 = &done;
  wgpuQueueOnSubmittedWorkDone(queue, cb);
  while (!done.load(std::memory_order_acquire)) {
    wgpuDevicePoll(device, false, nullptr);
    if (gap_us > 0) {
      const auto until = Clock::now() + std::chrono::nanoseconds(int64_t(gap_us * 1000));
      while (Clock::now() < until) {}
    }
  }
}

struct RawKernel {
  WGPUShaderModule module = nullptr;
  WGPUComputePipeline pipeline = nullptr;
  WGPUBindGroupLayout layout = nullptr;
  RawKernel(WGPUDevice device, const char* label, const char* wgsl) {
    WGPUShaderSourceWGSL src = {};
    src.chain.sType = WGPUSType_ShaderSourceWGSL;
    src.code = sv(wgsl);
    WGPUShaderModuleDescriptor md = {};
    md.nextInChain = &src.chain;
    md.label = sv(label);
    module = wgpuDeviceCreateShaderModule(device, &md);
    WGPUComputePipelineDescriptor pd = {};
    pd.label = sv(label);
    pd.compute.module = module;
    pd.compute.entryPoint = sv("main");
    pipeline = wgpuDeviceCreateComputePipeline(device, &pd);
    layout = wgpuComputePipelineGetBindGroupLayout(pipeline, 0);
  }
  ~RawKernel() {
    wgpuBindGroupLayoutRelease(layout);
    wgpuComputePipelineRelease(pipeline);
    wgpuShaderModuleRelease(module);
  }
};

struct Times {
  std::vector<double> record, submit, wait, total;
};

// One call: record() builds a command buffer, submit() submits it, then the wait.
void time_calls(Times& t, int calls, const std::function<void()>& record, const std::function<void()>& submit,
                const std::function<void()>& wait) {
  for (int i = 0; i < calls; ++i) {
    const auto t0 = Clock::now();
    record();
    const auto t1 = Clock::now();
    submit();
    const auto t2 = Clock::now();
    wait();
    const auto t3 = Clock::now();
    if (i < calls / 10) continue;  // warm-up
    t.record.push_back(us(t0, t1));
    t.submit.push_back(us(t1, t2));
    t.wait.push_back(us(t2, t3));
    t.total.push_back(us(t0, t3));
  }
}

// The CUDA driver API's primary context of device 0, current on this thread;
// throws where libcuda is missing.
void make_cuda_context_current() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) throw std::runtime_error(std::string("--cuda-context: ") + dlerror());
  using Init = int (*)(unsigned);
  using DeviceGet = int (*)(int*, int);
  using Retain = int (*)(void**, int);
  using SetCurrent = int (*)(void*);
  auto init = reinterpret_cast<Init>(dlsym(lib, "cuInit"));
  auto device_get = reinterpret_cast<DeviceGet>(dlsym(lib, "cuDeviceGet"));
  auto retain = reinterpret_cast<Retain>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
  auto set_current = reinterpret_cast<SetCurrent>(dlsym(lib, "cuCtxSetCurrent"));
  if (!init || !device_get || !retain || !set_current)
    throw std::runtime_error("--cuda-context: libcuda lacks a symbol");
  int device = 0;
  void* ctx = nullptr;
  if (init(0) || device_get(&device, 0) || retain(&ctx, device) || set_current(ctx))
    throw std::runtime_error("--cuda-context: creating the CUDA context failed");
}

}  // namespace

int main(int argc, char** argv) {
  int calls = 400, rounds = 3;
  std::string adapter;
  bool cuda_context = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--cuda-context")
      cuda_context = true;
    else if (a == "--calls" && i + 1 < argc)
      calls = std::atoi(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc)
      rounds = std::atoi(argv[++i]);
    else if (a == "--adapter" && i + 1 < argc)
      adapter = argv[++i];
    else {
      std::fprintf(stderr, "usage: submit_floor [--calls N] [--rounds R] [--adapter NAME] [--cuda-context]\n");
      return 2;
    }
  }
  try {
    if (cuda_context) make_cuda_context_current();
    auto dev = Device::open(adapter);
    WGPUDevice device = dev->raw();
    WGPUQueue queue = dev->queue();
    std::printf("adapter: %s (%s)%s, on CPU %d\n", dev->info().name.c_str(), dev->info().backend.c_str(),
                cuda_context ? ", with a CUDA context current" : "", sched_getcpu());

    RawKernel nop(device, "submit_floor nop", "@compute @workgroup_size(64) fn main() {}");
    RawKernel one(device, "submit_floor one",
                  "@group(0) @binding(0) var<storage, read_write> o: array<f32>;\n"
                  "@compute @workgroup_size(64) fn main(@builtin(local_invocation_index) i: u32) {\n"
                  "  if (i == 0u) { o[0] = o[0] + 1.0; }\n}\n");
    Buffer target(dev, 256);

    // Our core's GEMV operands: x (1 x K), W (N x K), y (1 x N).
    struct Gemv {
      uint32_t k, n;
      std::unique_ptr<Buffer> x, w, y;
    };
    std::vector<Gemv> gemvs;
    for (uint32_t s : {4u, 4096u}) {
      Gemv g{s, s, std::make_unique<Buffer>(dev, 4ull * s), std::make_unique<Buffer>(dev, 4ull * s * s),
             std::make_unique<Buffer>(dev, 4ull * s)};
      Recorder rec(dev);
      rec.fill_zero(*g.x, 0, 4ull * s);
      rec.fill_zero(*g.w, 0, 4ull * s * s);
      dev->wait(rec.submit());
      gemvs.push_back(std::move(g));
    }
    {
      // Leave idle clocks before measuring: half a second of GEMMs.
      Buffer a(dev, 1024ull * 1024 * 4), c(dev, 1024ull * 1024 * 4);
      const auto until = Clock::now() + std::chrono::milliseconds(500);
      while (Clock::now() < until) {
        Recorder rec(dev);
        gemm(rec, a, a, c, 1024, 1024, 1024, false, false, 1.0f, 0.0f);
        dev->wait(rec.submit());
      }
    }

    WGPUCommandBuffer cmd = nullptr;
    auto raw_submit = [&] {
      wgpuQueueSubmit(queue, 1, &cmd);
      wgpuCommandBufferRelease(cmd);
      cmd = nullptr;
    };
    auto raw_wait = [&] { wait_raw(device, queue); };
    auto raw_record = [&](const RawKernel* k, bool bind) {
      WGPUCommandEncoderDescriptor ed = {};
      ed.label = sv("submit_floor encoder");
      WGPUCommandEncoder enc = wgpuDeviceCreateCommandEncoder(device, &ed);
      if (k) {
        WGPUComputePassDescriptor pd = {};
        pd.label = sv("submit_floor pass");
        WGPUComputePassEncoder pass = wgpuCommandEncoderBeginComputePass(enc, &pd);
        wgpuComputePassEncoderSetPipeline(pass, k->pipeline);
        WGPUBindGroup group = nullptr;
        if (bind) {
          WGPUBindGroupEntry e = {};
          e.binding = 0;
          e.buffer = target.raw();
          e.size = 256;
          WGPUBindGroupDescriptor bd = {};
          bd.label = sv("submit_floor group");
          bd.layout = k->layout;
          bd.entryCount = 1;
          bd.entries = &e;
          group = wgpuDeviceCreateBindGroup(device, &bd);
          wgpuComputePassEncoderSetBindGroup(pass, 0, group, 0, nullptr);
        }
        wgpuComputePassEncoderDispatchWorkgroups(pass, 1, 1, 1);
        wgpuComputePassEncoderEnd(pass);
        wgpuComputePassEncoderRelease(pass);
        if (group) wgpuBindGroupRelease(group);
      }
      WGPUCommandBufferDescriptor cd = {};
      cd.label = sv("submit_floor commands");
      cmd = wgpuCommandEncoderFinish(enc, &cd);
      wgpuCommandEncoderRelease(enc);
    };

    {
      // Our guarded() alone (two error scopes pushed and popped around an
      // empty body): a one-call GEMV passes through it four times.
      std::vector<double> t;
      for (int i = 0; i < 20 * calls; ++i) {
        const auto t0 = Clock::now();
        dev->guarded("an empty step", [] {});
        t.push_back(us(t0, Clock::now()));
      }
      std::printf("Device::guarded with an empty body: %.2f us (median of %zu)\n", median(t), t.size());
    }
    std::unique_ptr<Recorder> rec;
    for (int r = 0; r < rounds; ++r) {
      auto report = [&](const char* name, Times& t) {
        std::printf("round %d %-16s record %6.1f  submit %6.1f  wait %6.1f  total %6.1f us (median of %zu)\n", r, name,
                    median(t.record), median(t.submit), median(t.wait), median(t.total), t.total.size());
        std::fflush(stdout);
      };
      Times empty, none, bound;
      time_calls(empty, calls, [&] { raw_record(nullptr, false); }, raw_submit, raw_wait);
      report("raw empty", empty);
      for (double gap : {1.0, 5.0}) {
        Times t;
        time_calls(t, calls, [&] { raw_record(nullptr, false); }, raw_submit, [&] { wait_raw(device, queue, gap); });
        const std::string name = "raw empty gap" + std::to_string(int(gap));
        report(name.c_str(), t);
      }
      {
        Times t;
        time_calls(
            t, calls, [&] { raw_record(nullptr, false); }, raw_submit, [&] { wgpuDevicePoll(device, true, nullptr); });
        report("raw empty block", t);
      }
      time_calls(none, calls, [&] { raw_record(&nop, false); }, raw_submit, raw_wait);
      report("raw nop", none);
      time_calls(bound, calls, [&] { raw_record(&one, true); }, raw_submit, raw_wait);
      report("raw bind", bound);
      for (auto& g : gemvs) {
        Times t;
        time_calls(
            t, calls,
            [&] {
              rec = std::make_unique<Recorder>(dev);
              gemm(*rec, *g.x, *g.w, *g.y, 1, g.n, g.k, false, true, 1.0f, 0.0f);
            },
            [&] { rec->submit(); }, [&] { dev->wait(0); });
        const std::string name = "core 1x" + std::to_string(g.k) + "x" + std::to_string(g.n);
        report(name.c_str(), t);
      }
    }
    rec.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "submit_floor: %s\n", e.what());
    return 1;
  }
  return 0;
}
