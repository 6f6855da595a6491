// GEMM plans measured on one device (gemm_tuner.cpp): for each product
// shape, the tile configuration and split-K count that ran fastest, kept for
// the device's lifetime and, with a cache directory, in a file per adapter
// and GEMM shader source, so a shape is timed once per machine.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace pwt {

// One GEMM kernel configuration: BM x BN output tile, BK deep, TM x TN per
// thread. warp_w: width in threads of the thread block one warp covers (0:
// BN / TN, whole rows of the workgroup's thread grid). lean_loop:
// gemm.wgsl's LEAN_LOOP (inside workgroups run their unchecked K steps as a
// loop of their own).
struct TileConfig {
  uint32_t bm = 0, bn = 0, bk = 0, tm = 0, tn = 0, warp_w = 0, lean_loop = 0;
  auto fields() const { return std::tie(bm, bn, bk, tm, tn, warp_w, lean_loop); }
  bool operator==(const TileConfig& o) const { return fields() == o.fields(); }
};

// A product's shape; tc: C stored transposed (an NT product run as C^T = B A^T).
struct GemmShape {
  uint32_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false, tc = false;
  auto fields() const { return std::tie(m, n, k, ta, tb, tc); }
  bool operator<(const GemmShape& o) const { return fields() < o.fields(); }
};

// What runs a whole product: tiles and split-K count (>= 1), or with
// workers > 0 stream-K over that many workgroups (gemm.wgsl
// gemm_stream_k; splits is then 1), and the time the tuner measured for one
// call of it (microseconds, GPU timestamps).
struct GemmPlan {
  TileConfig t;
  uint32_t splits = 1;
  uint32_t workers = 0;
  double us = 0;
};

// 64-bit FNV-1a: names the cache file after its signature, and condenses the
// shader sources and heuristic plans that go into the signature.
uint64_t fnv1a(const std::string& s);

class GemmTuning {
 public:
  // enabled: whether gemm_tuner.cpp times candidate plans for shapes it has not
  // seen. cache_dir: where the table persists ("" keeps it in memory);
  // signature names the adapter and the GEMM kernels' source, and a file
  // written under another signature is ignored and replaced.
  void configure(bool enabled, const std::string& cache_dir, const std::string& signature);
  bool enabled() const;
  std::string path() const;
  std::optional<GemmPlan> find(const GemmShape& s) const;
  // Records a measured plan (and appends it to the cache file, if any).
  void add(const GemmShape& s, const GemmPlan& p);
  std::vector<std::pair<GemmShape, GemmPlan>> entries() const;

 private:
  mutable std::mutex mu_;
  bool enabled_ = false;
  std::string path_, signature_;
  bool file_current_ = false;  // the file at path_ starts with signature_
  std::map<GemmShape, GemmPlan> plans_;
};

}  // namespace pwt
