// The GEMM autotuner: which plans compete for a shape, timing them on this
// device, and the plan a product runs with (forced, measured or heuristic).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gemm_internal.hpp"
#include "shaders.hpp"
#include "timing.hpp"

namespace pwt {

namespace gemm_detail {

namespace {

// clang-format off
// Autotuning (Device::gemm_tuning): the first product of a shape times the
// plans below and keeps the fastest, unless the heuristic plan is within
// kTuneMargin of it (timing noise must not trade a known plan for an equal
// one). Candidates: 64x64 tiles (4x4 per thread), 64x128 tiles (8x4, warps
// on 8x4 thread blocks, 4x8 in TN: with_mode_warps) and 32x128 tiles (the
// same 8x4 on 128 threads: twice the workgroups of 64x128 for outputs of
// under a wave or two, docs/gemm_notes.md #70; both 128-column tiles
// LEAN_LOOP both ways) over split counts while each split keeps >= kTuneMinKPerSplit of K
// and the workgroups fit kTuneMaxWaves waves, and stream-K (kStreamKTiles,
// its warps as with_mode_warps sets them). Each runs in batches of calls
// lasting about kTuneBatchUs (the median call by GPU timestamps) on
// operand copies rotated as the bench rotates its own, GemmSwitches::tune_rounds rounds
// interleaved, after a warm-up that brings the GPU's clocks up; the median
// round counts. Tiny products (< kTuneMinMacs) keep the heuristic: launch
// cost dominates them. Timing writes a scratch C (never the caller's, which
// recorded work may still read), so products whose C exceeds kTuneMaxScratch
// and those past one binding keep the heuristic too, as does every product on
// an adapter without timestamp queries.
constexpr uint64_t kTuneMinMacs = uint64_t(1) << 22;
constexpr uint64_t kTuneMaxScratch = uint64_t(256) << 20;
constexpr uint64_t kTuneMinKPerSplit = 64;
constexpr uint64_t kTuneMaxWaves = 4;
constexpr double kTuneBatchUs = 1000;
constexpr uint32_t kTuneMaxReps = 64;
constexpr uint64_t kTuneRotateBytes = uint64_t(256) << 20;  // as `pywgtrain bench gemm`: well past L2
constexpr uint64_t kTuneMaxSets = 8;
constexpr uint32_t kTuneSplits[] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32};
constexpr TileConfig kTuneTiles[] = {{64, 64, 16, 4, 4}, {64, 128, 16, 8, 4, 8}, {32, 128, 16, 8, 4, 8}};
// Stream-K candidates: 64x128 tiles (LEAN_LOOP both ways), one wave of
// workers, on outputs of fewer than kTuneMaxWaves waves of tiles whose
// workers get >= kTuneMinKPerSplit of K each.
constexpr TileConfig kStreamKTiles = kTuneTiles[1];
// clang-format on

// Whether a plan (read from a cache file) is one the tuner could have chosen:
// anything else is ignored rather than compiled.
bool plan_supported(const GemmPlan& p, bool ta, bool tb) {
  if (p.splits < 1 || p.splits > kMaxSplits || p.t.lean_loop > 1) return false;
  TileConfig base = p.t;
  base.lean_loop = 0;
  if (p.workers) return p.splits == 1 && base == with_mode_warps(kStreamKTiles, ta, tb);
  for (const TileConfig& t : kTuneTiles)
    if (base == with_mode_warps(t, ta, tb) && (p.t.lean_loop == 0 || t.bn == 128)) return true;
  return false;
}

bool tunable(const Device& dev, const GemmProblem& g) {
  if (!dev.has_feature(WGPUFeatureName_TimestampQuery)) return false;
  const uint64_t c_bytes = uint64_t(g.m) * g.n * 4;
  if (uint64_t(g.m) * g.n * g.k < kTuneMinMacs || c_bytes > kTuneMaxScratch || c_bytes > dev.limits().max_buffer)
    return false;
  const GemmProblem packed_c = [&] {
    GemmProblem q = g;
    q.ldc = g.tc ? g.m : g.n;
    return q;
  }();
  for (const TileConfig& t : kTuneTiles) {
    const Blocks b = blocks(dev, packed_c, t);
    if (b.m < g.m || b.n < g.n || b.k < g.k) return false;
  }
  return true;
}

std::vector<GemmPlan> tune_candidates(const Device& dev, const GemmProblem& g, const GemmPlan& heuristic) {
  std::vector<GemmPlan> out{heuristic};
  auto add = [&](const TileConfig& t, uint32_t splits, uint32_t workers = 0) {
    GemmPlan p;
    p.t = t;
    p.splits = splits;
    p.workers = workers;
    for (const GemmPlan& q : out)
      if (q.t == p.t && q.splits == p.splits && q.workers == p.workers) return;
    out.push_back(p);
  };
  for (const TileConfig& t : kTuneTiles) {
    const uint64_t tiles = ceil_div(g.m, t.bm) * ceil_div(g.n, t.bn);
    for (uint32_t s : kTuneSplits) {
      s = std::max<uint32_t>(s, uint32_t(ceil_div(g.k, kMaxKPerSplit)));  // bounded K loops
      if (s > 1 && (g.k / s < kTuneMinKPerSplit || tiles * s > kTuneMaxWaves * dev.gemm_switches().slots)) continue;
      // 128-wide tiles take LEAN_LOOP both ways: which K loop shape wins
      // depends on the shape (docs/gemm_notes.md #79).
      TileConfig v = with_mode_warps(t, g.ta, g.tb);
      add(v, s);
      if (t.bn == 128) {
        v.lean_loop = 1;
        add(v, s);
      }
    }
  }
  const uint64_t slots = dev.gemm_switches().slots;
  const uint64_t sk_tiles = ceil_div(g.m, kStreamKTiles.bm) * ceil_div(g.n, kStreamKTiles.bn);
  if (sk_tiles < kTuneMaxWaves * slots &&
      ceil_div(g.k, kStreamKTiles.bk) * sk_tiles * kStreamKTiles.bk >= slots * kTuneMinKPerSplit &&
      stream_k_layout(dev, g.m, g.n, g.k, kStreamKTiles, uint32_t(slots))) {
    const TileConfig plain = with_mode_warps(kStreamKTiles, g.ta, g.tb);
    TileConfig lean = plain;
    lean.lean_loop = 1;
    add(plain, 1, uint32_t(slots));
    add(lean, 1, uint32_t(slots));
  }
  return out;
}

// Times the candidates for g's shape on the device (own submissions, before
// whatever `outer` holds) and returns the plan to keep.
GemmPlan tune_plan(Recorder& outer, const GemmProblem& g, const GemmPlan& heuristic) {
  Device& dev = outer.device();
  const std::vector<GemmPlan> candidates = tune_candidates(dev, g, heuristic);
  Recorder rec(outer.device_ptr());
  // The timed calls rotate through copies of A and B (and scratch outputs:
  // never the caller's C, which recorded work may still read), as `pywgtrain
  // bench gemm` rotates its operand sets: on one set, warm in L2, plans that
  // stream their operands read fast and ran slow in the bench
  // (docs/gemm_notes.md #67). Up to kTuneMaxSets sets
  // within kTuneRotateBytes; where two do not fit, or the GPU has no memory
  // for the copies, the caller's A and B alone (tuning must not fail a
  // product that fits).
  auto extent = [](uint64_t rows, uint64_t cols, uint64_t ld) { return ((rows - 1) * ld + cols) * 4; };
  const uint64_t a_bytes = g.ta ? extent(g.k, g.m, g.lda) : extent(g.m, g.k, g.lda);
  const uint64_t b_bytes = g.tb ? extent(g.n, g.k, g.ldb) : extent(g.k, g.n, g.ldb);
  const uint64_t c_bytes = uint64_t(g.m) * g.n * 4;
  uint64_t sets = std::clamp<uint64_t>(kTuneRotateBytes / (a_bytes + b_bytes + c_bytes), 1, kTuneMaxSets);
  std::vector<std::unique_ptr<Buffer>> owned;
  auto scratch = [&](uint64_t bytes, const char* label) {
    // Whole vec4s: the kernels' 128-bit views of an operand bind past the
    // last row's end up to the next 16 bytes.
    owned.push_back(std::make_unique<Buffer>(outer.device_ptr(), (bytes + 15) & ~uint64_t(15), label));
    return owned.back().get();
  };
  GemmProblem base = g;  // the caller's A and B into a scratch C
  base.c = scratch(c_bytes, "pywgtrain.gemm_tune_output");
  base.ldc = g.tc ? g.m : g.n;
  base.alpha = 1.0f;
  base.beta = 0.0f;
  std::vector<GemmProblem> probes{base};
  if (sets > 1) {
    std::vector<GemmProblem> copies;
    try {
      for (uint64_t i = 0; i < sets; ++i) {
        GemmProblem p = base;
        if (i) p.c = scratch(c_bytes, "pywgtrain.gemm_tune_output");
        p.a = scratch(a_bytes, "pywgtrain.gemm_tune_a");
        p.b = scratch(b_bytes, "pywgtrain.gemm_tune_b");
        rec.copy(*g.a, 0, *p.a, 0, a_bytes);
        rec.copy(*g.b, 0, *p.b, 0, b_bytes);
        copies.push_back(p);
      }
    } catch (const OutOfMemoryError&) {
      // Fewer sets: the copies made so far.
    }
    if (!copies.empty()) probes = std::move(copies);
  }
  sets = probes.size();
  // GPU timestamps around each call, as `pywgtrain bench` times (tunable()
  // requires them: wall clock around a submission measures the host too).
  PassTimer timer(outer.device_ptr(), kTuneMaxReps);
  auto per_call_us = [&](const GemmPlan& p, uint32_t reps) {
    for (uint32_t i = 0; i < reps; ++i) {
      timer.time_next_pass(rec, i);
      record_planned(rec, probes[i % sets], EpilogueArgs{}, p);
    }
    std::vector<double> ns = timer.read(rec, reps);
    std::nth_element(ns.begin(), ns.begin() + reps / 2, ns.end());
    return ns[reps / 2] / 1e3;
  };
  // Untimed, one submission each: every candidate once (compiling each
  // variant), then the heuristic's plan 4 x reps times (clocks up).
  auto run_untimed = [&](const GemmPlan& p, uint32_t calls) {
    for (uint32_t i = 0; i < calls; ++i) record_planned(rec, probes[i % sets], EpilogueArgs{}, p);
  };
  for (const GemmPlan& p : candidates) run_untimed(p, 1);
  dev.wait(rec.submit());
  const double one = std::max(per_call_us(heuristic, 1), 1.0);
  const uint32_t reps = uint32_t(std::clamp(kTuneBatchUs / one, 2.0, double(kTuneMaxReps)));
  run_untimed(heuristic, 4 * reps);
  dev.wait(rec.submit());
  std::vector<std::vector<double>> rounds(candidates.size());
  for (uint32_t round = 0; round < dev.gemm_switches().tune_rounds; ++round)
    for (size_t i = 0; i < candidates.size(); ++i) rounds[i].push_back(per_call_us(candidates[i], reps));
  // Each candidate's median round, not its fastest: a plan can run a whole
  // batch far faster than it usually does, and the fastest of three rounds
  // let such a batch pick it (docs/gemm_notes.md #88).
  std::vector<double> best(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    auto& t = rounds[i];
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    best[i] = t[t.size() / 2];
  }
  size_t win = size_t(std::min_element(best.begin(), best.end()) - best.begin());
  if (best[win] > kTuneMargin * best[0]) win = 0;  // candidates[0] is the heuristic plan
  GemmPlan chosen = candidates[win];
  chosen.us = best[win];
  return chosen;
}

}  // namespace

// The plan g runs with: PYWGTRAIN_GEMM_TILES / _SPLITS / _STREAM_K when set, else the
// device's measured plan for its shape (timed now if autotuning is on and the
// shape is new), else the heuristic.
GemmPlan gemm_plan(Recorder& r, const GemmProblem& g) {
  GemmTuning& tuning = r.device().gemm_tuning();
  const GemmSwitches& sw = r.device().gemm_switches();
  const GemmShape shape{g.m, g.n, g.k, g.ta, g.tb, g.tc};
  if (sw.plan_forced) {
    GemmPlan forced = heuristic_plan(sw, g.m, g.n, g.k, g.ta, g.tb);
    forced.workers = sw.stream_k_workers;
    return forced;
  }
  // float16 products: the heuristic (the tuner times and its table holds float32 products).
  if (g.elem != 4) return heuristic_plan(sw, g.m, g.n, g.k, g.ta, g.tb);
  if (auto known = tuning.find(shape); known && plan_supported(*known, g.ta, g.tb)) return *known;
  const GemmPlan heuristic = heuristic_plan(sw, g.m, g.n, g.k, g.ta, g.tb);
  if (!tuning.enabled() || !tunable(r.device(), g)) return heuristic;
  const GemmPlan plan = tune_plan(r, g, heuristic);
  tuning.add(shape, plan);
  return plan;
}

}  // namespace gemm_detail

using namespace gemm_detail;

std::vector<GemmPlan> gemm_tune_candidates(const Device& dev, uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb) {
  return tune_candidates(dev, packed_shape(m, n, k, ta, tb), heuristic_plan(dev.gemm_switches(), m, n, k, ta, tb));
}

void configure_gemm_tuning(Device& dev, bool enabled, const std::string& cache_dir) {
  // The signature: format, adapter, every embedded shader, the tuner's
  // candidate tiles and the heuristic plans of a grid of shapes (a changed
  // heuristic or candidate set re-tunes what it competes with).
  std::string sig = "pywgtrain gemm plans v3 | ";  // v3: a tc column
  // Bumped when the candidate set or the way a plan runs changes outside the
  // shaders, tiles and heuristic below (cached plans competed under the old
  // rules). 2: stream-K after whole waves of plain tiles; 3: LEAN_LOOP both
  // ways at every split count; 4: the median round decides, not the fastest;
  // 5: ragged M, N and K run aligned with edge shifts; 6: NT products run
  // swapped (C^T = B A^T), edges shifted to vec4-rounded ends; 7: TN products
  // on 64x128 tiles run warps on 4x8 thread blocks (with_mode_warps); 8: TN
  // stream-K on both warp blocks; 9: a 2% margin (kTuneMargin); 10: TN
  // stream-K on 4x8 only again (#103).
  constexpr int kPlanRules = 10;
  const AdapterSummary& a = dev.info();
  sig += a.name + " | " + a.vendor + " | " + a.driver + " | " + a.backend + " | " + std::to_string(a.vendor_id) + ":" +
         std::to_string(a.device_id) + " | slots " + std::to_string(dev.gemm_switches().slots);
  std::string material;
  for (const auto& [name, text] : embedded_shaders()) material += name + "\n" + text + "\n";
  for (const TileConfig& t : kTuneTiles)
    for (uint32_t v : {t.bm, t.bn, t.bk, t.tm, t.tn, t.warp_w}) material += std::to_string(v) + ",";
  material += "| rules " + std::to_string(kPlanRules) + " |";
  for (uint32_t m : {16u, 64u, 256u, 1024u, 4096u})
    for (uint32_t n : {64u, 768u, 3072u, 50304u})
      for (uint32_t k : {64u, 768u, 3072u, 16384u})
        for (bool ta : {false, true})
          for (bool tb : {false, true}) {
            const GemmPlan p = heuristic_plan(dev.gemm_switches(), m, n, k, ta, tb);
            for (uint32_t v : {p.t.bm, p.t.bn, p.t.bk, p.t.tm, p.t.tn, p.t.warp_w, p.t.lean_loop, p.splits})
              material += std::to_string(v) + ",";
          }
  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(material)));
  dev.gemm_tuning().configure(enabled, cache_dir, sig + " | " + hex);
}

}  // namespace pwt
