// C++ microbenchmark: drives the core directly and times GEMM with GPU
// timestamp queries (warm-up, median of many runs, fresh random data, inputs
// rotated over buffer sets larger than L2). Prints one JSON object.
//
//   gemm_bench [MxKxN[:NT] ...] [--reps N] [--adapter NAME]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "ops.hpp"
#include "timing.hpp"

using namespace pwt;

struct Shape { uint32_t m, k, n; bool ta, tb; };

static Shape parse(const std::string& s) {
  Shape sh{};
  char mode[3] = "NN";
  if (std::sscanf(s.c_str(), "%ux%ux%u:%2s", &sh.m, &sh.k, &sh.n, mode) < 3) {
    std::fprintf(stderr, "bad shape '%s' (want MxKxN[:NT])\n", s.c_str());
    std::exit(2);
  }
  sh.ta = mode[0] == 'T';
  sh.tb = mode[1] == 'T';
  return sh;
}

static std::shared_ptr<Buffer> random_buffer(const std::shared_ptr<Device>& dev, size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  std::vector<float> host(n);
  for (auto& v : host) v = dist(rng);
  auto b = std::make_shared<Buffer>(dev, n * 4);
  b->upload(host.data(), n * 4);
  return b;
}

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  int reps = 50;
  std::string adapter;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--adapter" && i + 1 < argc) adapter = argv[++i];
    else shapes.push_back(parse(a));
  }
  if (shapes.empty())
    for (uint32_t s : {1024u, 2048u, 4096u}) shapes.push_back({s, s, s, false, false});
  try {
    auto dev = Device::open(adapter);
    std::mt19937 rng(std::random_device{}());
    {
      // Leave idle clocks before measuring (the first shape otherwise reads slow).
      Buffer w(dev, 2048ull * 2048 * 4), out(dev, 2048ull * 2048 * 4);
      for (int i = 0; i < 10; ++i) {
        Recorder rec(dev);
        for (int j = 0; j < 20; ++j) gemm(rec, w, w, out, 2048, 2048, 2048, false, false, 1.0f, 0.0f);
        dev->wait(rec.submit());
      }
    }
    std::printf("{\"adapter\": \"%s\", \"backend\": \"%s\", \"results\": [", dev->info().name.c_str(), dev->info().backend.c_str());
    for (size_t si = 0; si < shapes.size(); ++si) {
      const Shape& s = shapes[si];
      const size_t bytes = 4ull * (size_t(s.m) * s.k + size_t(s.k) * s.n + size_t(s.m) * s.n);
      const size_t sets = std::clamp<size_t>((256ull << 20) / std::max<size_t>(bytes, 1), 1, 8);
      std::vector<std::shared_ptr<Buffer>> a, b, c;
      for (size_t i = 0; i < sets; ++i) {
        a.push_back(random_buffer(dev, size_t(s.m) * s.k, rng));
        b.push_back(random_buffer(dev, size_t(s.k) * s.n, rng));
        c.push_back(std::make_shared<Buffer>(dev, size_t(s.m) * s.n * 4));
      }
      Recorder rec(dev);
      for (int i = 0; i < 3; ++i) gemm(rec, *a[i % sets], *b[i % sets], *c[i % sets], s.m, s.n, s.k, s.ta, s.tb, 1.0f, 0.0f);
      dev->wait(rec.submit());
      PassTimer timer(dev, reps);
      for (int i = 0; i < reps; ++i) {
        timer.time_next_pass(rec, i);
        gemm(rec, *a[i % sets], *b[i % sets], *c[i % sets], s.m, s.n, s.k, s.ta, s.tb, 1.0f, 0.0f);
      }
      auto ns = timer.read(rec, reps);
      std::sort(ns.begin(), ns.end());
      const double med = ns[ns.size() / 2];
      std::printf("%s\n {\"m\": %u, \"k\": %u, \"n\": %u, \"trans_a\": %s, \"trans_b\": %s, \"median_us\": %.2f, "
                  "\"min_us\": %.2f, \"tflops\": %.3f, \"reps\": %d}",
                  si ? "," : "", s.m, s.k, s.n, s.ta ? "true" : "false", s.tb ? "true" : "false", med / 1e3,
                  ns.front() / 1e3, 2.0 * s.m * s.n * s.k / med / 1e3, reps);
      std::fflush(stdout);
    }
    std::printf("\n]}\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
