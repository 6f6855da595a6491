// Recording a GEMM plan: regions of the product bound in windows (operands
// past one storage binding cut into blocks), split-K, stream-K, ragged edges,
// padded and transposed operand copies, and the row split.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "gemm_internal.hpp"

namespace pwt::gemm_detail {

namespace sh = wgsl::gemm;

namespace {

// NT products with at least GemmSwitches::nt_as_nn_rows rows (4096), and N and K of at least
// kNtAsNnMinCols, run as NN on a transposed copy of B (record_gemm): with
// fewer rows the copy ate the gain (docs/gemm_notes.md #49).
constexpr uint32_t kNtAsNnMinCols = 256;
// NT products with fewer rows, at least kNtSwapMinRows of them, at least
// kNtSwapMinCols columns (a vocabulary projection) and kNtSwapMinMacs
// multiply-adds run as C^T = B A^T: NN on a transposed copy of A, storing C
// transposed (record_gemm), where the swapped product's last 128-wide tile
// column wastes no more than the direct product's last 64-high tile row;
// with more waste or fewer columns the swap lost (docs/gemm_notes.md #95).
constexpr uint32_t kNtSwapMinRows = 256;
constexpr uint64_t kNtSwapMinCols = 8192;
constexpr uint64_t kNtSwapMinMacs = uint64_t(1) << 30;
// Row sums ride along in the GEMM up to this many multiply-adds, where the
// separate pass costs more than the in-loop adds (docs/gemm_notes.md #17).
constexpr uint64_t kRowSumMaxMacs = uint64_t(1) << 30;

// The window of g's C that region reg writes, `inner` at the region's
// element (m0, n0): its rows (its columns, when tc). The epilogue's
// pre-activation and residual windows are C's rows too (row_window, the
// same offset inside before the region's n0 is added; never with tc).
RowWindow c_window(const Device& dev, const GemmProblem& g, const Region& reg) {
  if (g.tc) return block_window(dev, *g.c, 0, reg.n0, reg.nc, reg.m0, reg.mc, g.ldc, g.c_elem);
  RowWindow w = row_window(dev, *g.c, 0, reg.m0, reg.mc, g.ldc, g.c_elem);
  w.inner += reg.n0;
  return w;
}

// The residual's window for region reg: C's rows, at the residual's element size.
Range residual_window(const Device& dev, const GemmProblem& g, const EpilogueArgs& e, const Region& reg) {
  return row_window(dev, *e.residual, 0, reg.m0, reg.mc, g.ldc, e.half_residual ? 2 : 4).range;
}

// The ranges a reduce into region reg of g's C binds: `partials`, C's
// window (its offset inside the window into c_inner) and the epilogue's
// pre-activation and residual windows at C's indices.
SplitRanges split_ranges(const Device& dev, const GemmProblem& g, const EpilogueArgs& e, const Range& partials,
                         const Region& reg, uint32_t& c_inner) {
  const RowWindow cw = c_window(dev, g, reg);
  c_inner = cw.inner;
  SplitRanges sr;
  sr.partials = partials;
  sr.c = cw.range;
  if (has_preact(e.ep)) sr.preact = row_window(dev, *e.preact, 0, reg.m0, reg.mc, g.ldc, g.c_elem).range;
  if (has_residual(e.ep)) sr.residual = residual_window(dev, g, e, reg);
  return sr;
}

// A region's windows of A and B and the params every dispatch over it shares:
// its shape, the leading dimensions, the operand offsets inside the windows,
// alpha and beta, all of the region's K in one split. Callers add C's side.
struct RegionBinding {
  RowWindow a, b;
  GemmParams p;
};
RegionBinding bind_region(const Device& dev, const GemmProblem& g, const Region& reg) {
  RegionBinding rb;
  const uint32_t el = g.elem;
  rb.a =
      g.ta ? row_window(dev, *g.a, 0, reg.k0, reg.kc, g.lda, el) : row_window(dev, *g.a, 0, reg.m0, reg.mc, g.lda, el);
  rb.b =
      g.tb ? row_window(dev, *g.b, 0, reg.n0, reg.nc, g.ldb, el) : row_window(dev, *g.b, 0, reg.k0, reg.kc, g.ldb, el);
  GemmParams& p = rb.p;
  p.m = reg.mc;
  p.n = reg.nc;
  p.k = reg.kc;
  p.lda = uint32_t(g.lda);
  p.ldb = uint32_t(g.ldb);
  p.a_off = rb.a.inner + uint32_t(g.ta ? reg.m0 : reg.k0);
  p.b_off = rb.b.inner + uint32_t(g.tb ? reg.k0 : reg.n0);
  p.alpha = g.alpha;
  p.beta = g.beta;
  p.k_chunk = reg.kc;
  p.splits = 1;
  return rb;
}

// The plain-epilogue variant of g on tiles t, and a dispatch's A, B and C ranges.
GemmVariant plain_variant(const TileConfig& t, const GemmProblem& g) {
  GemmVariant v;
  v.t = t;
  v.ta = g.ta;
  v.tb = g.tb;
  v.tc = g.tc;
  v.half_ab = g.elem == 2;
  v.half_c = g.c_elem == 2;
  return v;
}
GemmRanges abc_ranges(const RegionBinding& rb, const Range& c) {
  GemmRanges ranges;
  ranges.a = rb.a.range;
  ranges.b = rb.b.range;
  ranges.c = c;
  return ranges;
}

// Split-K over region `reg` of g's C: each split writes its partial product
// (compact, nc wide; with tc transposed, mc wide) to the device workspace,
// the reduce pass sums them into C with the epilogue (bias from column n0
// on, the pre-activation at C's indices). With tc the reduce runs over C's
// own layout, the region's transpose, so both of its passes stay row-major.
void record_split_region(Recorder& r, const GemmProblem& g, const Region& reg, const TileConfig& t, uint32_t splits,
                         const EpilogueArgs& e) {
  Device& dev = r.device();
  // The partials bind as one range: at most a binding's worth of them (never
  // below the splits the bounded K loops need, which the callers' K blocks
  // keep within it).
  const uint64_t stride_cap = dev.limits().max_storage_binding / 4 / (uint64_t(reg.mc) * reg.nc);
  splits = uint32_t(std::clamp<uint64_t>(splits, 1, std::max<uint64_t>(stride_cap, ceil_div(reg.kc, kMaxKPerSplit))));
  const uint32_t k_chunk = uint32_t(ceil_div(ceil_div(reg.kc, splits), t.bk) * t.bk);  // whole K tiles per split
  splits = uint32_t(ceil_div(reg.kc, k_chunk));
  const uint64_t stride = uint64_t(reg.mc) * reg.nc;
  const Range ws{dev.workspace(stride * splits * 4), 0, stride * splits * 4};
  // Partials: compact (nc wide), unscaled; alpha, beta and the epilogue come in the reduce.
  RegionBinding rb = bind_region(dev, g, reg);
  GemmParams& p = rb.p;
  p.ldc = g.tc ? reg.mc : reg.nc;
  p.alpha = 1.0f;
  p.beta = 0.0f;
  p.k_chunk = k_chunk;
  p.split_stride = uint32_t(stride);
  p.splits = splits;
  GemmVariant partial = plain_variant(t, g);
  partial.half_c = false;  // the partials are float32
  dispatch_gemm(r, partial, p, abc_ranges(rb, ws), uint32_t(ceil_div(reg.nc, t.bn)), uint32_t(ceil_div(reg.mc, t.bm)),
                splits);
  GemmParams q;
  const SplitRanges sr = split_ranges(dev, g, e, ws, reg, q.c_off);
  q.m = g.tc ? reg.nc : reg.mc;
  q.n = g.tc ? reg.mc : reg.nc;
  q.ldc = uint32_t(g.ldc);
  q.alpha = g.alpha;
  q.beta = g.beta;
  q.bias_off = reg.n0;
  q.split_stride = uint32_t(stride);
  q.splits = splits;
  record_split_reduce(r, q, sr, e, nullptr, false, g.c_elem == 2);
}

}  // namespace

// The layout of stream-K for an m x n x k product on tiles t, or nothing
// where it does not apply: more workers than its K steps or one dispatch allows,
// the shader's step indices past 32 bits, partials past one binding, or a
// workgroup's range past half of kMaxKPerSplit (bounded loops: the range's
// K steps plus, per tile it meets, the segment loop and the stores; lavapipe
// counts them all, and 777x300x2304 on one worker came back with the last
// third of its tiles missing).
std::optional<StreamK> stream_k_layout(const Device& dev, uint32_t m, uint32_t n, uint32_t k, const TileConfig& t,
                                       uint32_t workers) {
  if (!workers || workers > dev.limits().max_workgroups_per_dim) return std::nullopt;
  const uint64_t tiles_m = ceil_div(m, t.bm), tiles_n = ceil_div(n, t.bn);
  // The plain rows' K loop stays within the bounded loops' kMaxKPerSplit.
  const uint64_t plain_rows =
      k > kMaxKPerSplit ? 0 : std::min(tiles_m * tiles_n / workers * workers / tiles_n, tiles_m - 1);
  const uint64_t tiles = (tiles_m - plain_rows) * tiles_n, steps = ceil_div(k, t.bk), total = tiles * steps;
  if (total < workers || ceil_div(total, workers) * t.bk > kMaxKPerSplit / 2 || total * workers >= (uint64_t(1) << 32))
    return std::nullopt;
  // gemm.wgsl sk_worker_of: the workgroup whose range holds step x.
  auto worker_of = [&](uint64_t x) { return ((x + 1) * workers - 1) / total; };
  StreamK sk;
  sk.first_row = uint32_t(plain_rows * t.bm);
  sk.tiles = tiles;
  for (uint64_t tile = 0; tile < tiles; ++tile)
    sk.slots = std::max(sk.slots, worker_of((tile + 1) * steps - 1) - worker_of(tile * steps) + 1);
  if (sk.partial_floats(t) * 4 > dev.limits().max_storage_binding) return std::nullopt;
  return sk;
}

namespace {

// Region reg of g in one dispatch of tiles t, unsplit, epilogue e in-kernel.
void record_region(Recorder& r, const GemmProblem& g, const Region& reg, const TileConfig& t, const EpilogueArgs& e) {
  Device& dev = r.device();
  RegionBinding rb = bind_region(dev, g, reg);
  const RowWindow cw = c_window(dev, g, reg);
  GemmParams& p = rb.p;
  p.ldc = uint32_t(g.ldc);
  p.c_off = cw.inner;
  p.bias_off = reg.n0;
  GemmRanges ranges = abc_ranges(rb, cw.range);
  if (has_bias(e.ep)) ranges.bias = whole(*e.bias);
  if (has_preact(e.ep)) ranges.preact = row_window(dev, *e.preact, 0, reg.m0, reg.mc, g.ldc, g.c_elem).range;
  if (e.ep == Epilogue::RowSum) ranges.row_sums = whole(*e.row_sums);
  if (has_residual(e.ep)) ranges.residual = residual_window(dev, g, e, reg);
  GemmVariant v = plain_variant(t, g);
  v.ep = e.ep;
  v.act = e.act;
  v.half_bias = e.half_bias;
  v.half_residual = e.half_residual;
  dispatch_gemm(r, v, p, ranges, uint32_t(ceil_div(reg.nc, t.bn)), uint32_t(ceil_div(reg.mc, t.bm)));
}

// The whole product g (bindable at once) by stream-K with layout sk: the
// rows before sk.first_row as plain tiles, the rest by stream-K, then the
// fixup into C.
void record_stream_k(Recorder& r, const GemmProblem& g, const TileConfig& t, uint32_t workers, const StreamK& sk,
                     const EpilogueArgs& e) {
  Device& dev = r.device();
  Region reg = whole_region(g);
  if (sk.first_row) {
    reg.mc = sk.first_row;
    record_region(r, g, reg, t, e);
    reg.m0 = sk.first_row;
    reg.mc = g.m - sk.first_row;
  }
  const uint64_t bytes = sk.partial_floats(t) * 4;
  const Range ws{dev.workspace(bytes), 0, bytes};
  RegionBinding rb = bind_region(dev, g, reg);
  GemmParams& p = rb.p;
  p.splits = uint32_t(sk.slots);
  p.sk_workers = workers;
  p.ldc = t.bn;  // rows of a partial slot (vec_loads' C_VEC test)
  GemmVariant v = plain_variant(t, g);
  v.stream_k = true;
  v.tc = false;      // its partial slots hold the product's tiles; the fixup transposes
  v.half_c = false;  // and are float32
  dispatch_gemm(r, v, p, abc_ranges(rb, ws), workers, 1);
  GemmParams q = p;
  const SplitRanges sr = split_ranges(dev, g, e, ws, reg, q.c_off);
  q.ldc = uint32_t(g.ldc);
  q.bias_off = 0;
  record_split_reduce(r, q, sr, e, &t, g.tc, g.c_elem == 2);
}

// Ragged large products (e.g. 4097^3): a last tile row or column holding a
// few rows would cost a whole extra wave of full-K workgroups. The aligned
// part runs as usual; each thin strip runs as its own split-K product on
// small tiles. Plain epilogue, everything bindable at once, C packed (and
// not transposed).
bool record_ragged(Recorder& r, const GemmProblem& g, const TileConfig& t) {
  const uint32_t m = g.m, n = g.n, k = g.k;
  if (g.tc) return false;
  const uint32_t rm = m % t.bm, rn = n % t.bn;
  const bool thin_m = rm && rm <= t.bm / 8 && m / t.bm >= 8, thin_n = rn && rn <= t.bn / 8 && n / t.bn >= 8;
  if (!(thin_m || thin_n) || k < kSplitMinK) return false;
  Device& dev = r.device();
  const uint32_t m_main = m - (thin_m ? rm : 0), n_main = n - (thin_n ? rn : 0);
  Region main_part;
  main_part.mc = m_main;
  main_part.nc = n_main;
  main_part.kc = k;
  RegionBinding rb = bind_region(dev, g, main_part);
  RowWindow cw = row_window(dev, *g.c, 0, 0, m_main, n, g.c_elem);
  rb.p.ldc = n;
  rb.p.c_off = cw.inner;
  dispatch_gemm(r, plain_variant(t, g), rb.p, abc_ranges(rb, cw.range), uint32_t(ceil_div(n_main, t.bn)),
                uint32_t(ceil_div(m_main, t.bm)));
  GemmProblem strips = g;
  strips.ldc = n;
  auto strip = [&](uint32_t m0, uint32_t mc, uint32_t n0, uint32_t nc) {
    const TileConfig ts = choose_tiles(dev.gemm_switches(), mc, nc, k, g.ta, g.tb);
    Region reg;
    reg.m0 = m0;
    reg.mc = mc;
    reg.n0 = n0;
    reg.nc = nc;
    reg.kc = k;
    record_split_region(r, strips, reg, ts, choose_splits(dev.gemm_switches(), mc, nc, k, ts), EpilogueArgs{});
  };
  if (thin_m) strip(m_main, rm, 0, n);       // bottom rows, corner included
  if (thin_n) strip(0, m_main, n_main, rn);  // right columns above them
  return true;
}

// Whether an NT product with fewer rows than GemmSwitches::nt_as_nn_rows
// runs swapped (C^T = B A^T): PYWGTRAIN_GEMM_NT_SWAP_COLS=N (for experiments
// and tests) swaps every one with at least N columns.
bool nt_swapped(const GemmSwitches& sw, uint64_t m, uint64_t n, uint64_t k) {
  if (sw.nt_swap_cols) return n >= *sw.nt_swap_cols;
  const bool same_waste = 2 * ceil_div(m, 128) == ceil_div(m, 64);
  return m >= kNtSwapMinRows && n >= kNtSwapMinCols && m * n * k >= kNtSwapMinMacs && same_waste;
}

}  // namespace

Blocks blocks(const Device& dev, const GemmProblem& g, const TileConfig& t) {
  // Rows of each stored matrix are one of M, N, K; bound each block size by
  // every operand whose rows run along that dimension.
  const uint64_t c_rows = rows_per_binding(dev, g.ldc, "C", g.c_elem);
  uint64_t m_cap = uint64_t(dev.limits().max_workgroups_per_dim) * t.bm;
  uint64_t n_cap = uint64_t(dev.limits().max_workgroups_per_dim) * t.bn;
  if (g.tc)
    n_cap = std::min(n_cap, c_rows);
  else
    m_cap = std::min(m_cap, c_rows);
  uint64_t k_cap = UINT64_MAX;
  if (!g.ta)
    m_cap = std::min(m_cap, rows_per_binding(dev, g.lda, "A", g.elem));
  else
    k_cap = std::min(k_cap, rows_per_binding(dev, g.lda, "A", g.elem));
  if (g.tb)
    n_cap = std::min(n_cap, rows_per_binding(dev, g.ldb, "B", g.elem));
  else
    k_cap = std::min(k_cap, rows_per_binding(dev, g.ldb, "B", g.elem));
  const uint64_t mb = block_along(g.m, m_cap, t.bm), nb = block_along(g.n, n_cap, t.bn);
  // Bounded K loops (dispatch_util.hpp): a K block takes at most as many
  // kMaxKPerSplit splits as one pass may have and as fit the workspace binding
  // beside an mb x nb output block; longer K runs as several blocks.
  const uint64_t pass_splits = std::clamp<uint64_t>(dev.limits().max_storage_binding / 4 / (mb * nb), 1, kMaxSplits);
  k_cap = std::min(k_cap, kMaxKPerSplit * pass_splits);
  return {mb, nb, block_along(g.k, k_cap, t.bk)};
}

namespace {

// Ragged M in NN and NT (A's rows contiguous): the whole 64-row tile rows
// and the last few rows can run faster as two products on plans of their own
// than as one whose last tile row is mostly empty (docs/gemm_notes.md #96). Where the tuner has timed all three
// shapes (products of at least kRowSplitMinRows rows and kRowSplitMinMacs
// multiply-adds: tuning two more shapes costs too much for smaller ones),
// the split runs when its two plans beat the whole product's by kTuneMargin.
// PYWGTRAIN_GEMM_ROW_SPLIT=1 (=0) always (never) splits. The
// lower part binds views of A, C and the epilogue's per-element operands
// from its first row, so those offsets must be aligned.
constexpr uint32_t kRowSplitTile = 64;
constexpr uint32_t kRowSplitMinRows = 256;
constexpr uint64_t kRowSplitMinMacs = uint64_t(1) << 30;
bool record_row_split(Recorder& r, const GemmProblem& g, const EpilogueArgs& e) {
  const uint32_t low_rows = g.m % kRowSplitTile, top_rows = g.m - low_rows;
  const std::optional<bool> forced = r.device().gemm_switches().row_split;
  if (g.ta || e.ep == Epilogue::RowSum || !low_rows || !top_rows || (forced && !*forced)) return false;
  const uint64_t align = std::max<uint32_t>(r.device().limits().storage_offset_alignment, 4);
  const uint64_t a_at = uint64_t(top_rows) * g.lda * 4, c_at = uint64_t(top_rows) * g.ldc * 4;
  if (a_at % align || c_at % align) return false;
  GemmProblem top = g, low = g;
  top.m = top_rows;
  low.m = low_rows;
  GemmPlan top_plan, low_plan;
  if (forced) {
    top_plan = gemm_plan(r, top);
    low_plan = gemm_plan(r, low);
  } else {
    if (g.m < kRowSplitMinRows || uint64_t(g.m) * g.n * g.k < kRowSplitMinMacs) return false;
    const GemmPlan whole = gemm_plan(r, g);
    if (!whole.us) return false;  // not timed: the heuristic's plan, or forced ones
    top_plan = gemm_plan(r, top);
    low_plan = gemm_plan(r, low);
    if (!top_plan.us || !low_plan.us || top_plan.us + low_plan.us >= kTuneMargin * whole.us) return false;
  }
  auto rest = [](const Buffer* b, uint64_t at) { return std::make_unique<Buffer>(*b, at, b->bytes() - at); };
  const auto a_low = rest(g.a, a_at), c_low = rest(g.c, c_at);
  std::unique_ptr<Buffer> preact_low, residual_low;
  EpilogueArgs e_low = e;
  if (e.preact) e_low.preact = (preact_low = rest(e.preact, c_at)).get();
  if (e.residual) e_low.residual = (residual_low = rest(e.residual, c_at)).get();
  low.a = a_low.get();
  low.c = c_low.get();
  record_planned(r, top, e, top_plan);
  record_planned(r, low, e_low, low_plan);
  return true;
}

}  // namespace

void record_gemm(Recorder& r, const GemmProblem& g, EpilogueArgs e) {
  Device& dev = r.device();
  const uint32_t m = g.m, n = g.n, k = g.k;
  const bool ta = g.ta, tb = g.tb;
  const uint64_t lda = g.lda, ldb = g.ldb;
  const Buffer &a = *g.a, &b = *g.b, &c = *g.c;
  // NT (x @ W.T, a linear layer's forward) loads both operands k-major, as
  // scalars; NN loads B n-major as vec4s. Products with many rows repay
  // transposing B into the device workspace first: the copy reads and writes
  // B once, the product reads it M / BM times.
  if (!ta && tb && m >= dev.gemm_switches().nt_as_nn_rows && n >= kNtAsNnMinCols && k >= kNtAsNnMinCols)
    if (const auto bt = transposed_copy(r, b, ldb, n, k, 1, g.elem)) {
      GemmProblem nn = g;
      nn.b = bt.get();
      nn.tb = false;
      nn.ldb = (uint64_t(n) + 3) & ~uint64_t(3);
      return record_gemm(r, nn, e);
    }
  // float16 operands: the tiled product on its plan (gemm_plan: forced or
  // heuristic). The GEMV rows, the swapped product and the row split move
  // float32 operands; they only change speed.
  if (g.elem == 2) return record_planned(r, g, e, gemm_plan(r, g));
  const uint64_t cap_floats = dev.limits().max_storage_binding / 4;
  const uint64_t slack = std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / 4;
  if (e.ep == Epilogue::Plain && !ta && lda + slack > cap_floats && ldb == (tb ? k : n)) {
    // One row of A (K floats) exceeds a binding: each row of C is a GEMV of
    // that row of A with op(B), which binds both in pieces along K.
    for (uint64_t m0 = 0; m0 < m; ++m0) {
      GemvProblem row;
      row.x = &a;
      row.x_base = m0 * lda;
      row.b = &b;
      row.y = &c;
      row.y_base = m0 * g.ldc;
      row.n = n;
      row.k = k;
      row.tb = tb;
      row.alpha = g.alpha;
      row.beta = g.beta;
      record_gemv(r, row);
    }
    return;
  }
  // Fewer rows and many columns: C^T = B A^T instead, NN on a transposed
  // copy of A, the small operand (4 MB at 256 x 4096, where B is 64 MB), with
  // C stored transposed (gemm.wgsl TRANS_C).
  if (!ta && tb && e.ep == Epilogue::Plain && nt_swapped(dev.gemm_switches(), m, n, k))
    if (const auto at = transposed_copy(r, a, lda, m, k, 0)) {
      GemmProblem swapped = g;
      swapped.a = &b;
      swapped.lda = ldb;
      swapped.b = at.get();
      swapped.ldb = (uint64_t(m) + 3) & ~uint64_t(3);
      swapped.tb = false;
      swapped.tc = true;
      swapped.m = n;
      swapped.n = m;
      return record_planned(r, swapped, e, gemm_plan(r, swapped));
    }
  if (record_row_split(r, g, e)) return;
  record_planned(r, g, e, gemm_plan(r, g));
}

void record_planned(Recorder& r, const GemmProblem& g, EpilogueArgs e, const GemmPlan& plan) {
  Device& dev = r.device();
  // A transposed C is written only by the swapped NT path, with the plain
  // epilogue: the bias and row-sum offsets below index C's columns.
  if (g.tc && e.ep != Epilogue::Plain) throw std::logic_error("gemm: a transposed C takes the plain epilogue only");
  const uint32_t m = g.m, n = g.n, k = g.k;
  const bool ta = g.ta, tb = g.tb;
  const uint64_t lda = g.lda, ldb = g.ldb, ldc = g.ldc;
  const Buffer &a = *g.a, &b = *g.b, &c = *g.c;
  const TileConfig t = plan.t;
  const Blocks blk = blocks(dev, g, t);
  const uint64_t mb = blk.m, nb = blk.n, kb = blk.k;
  const bool whole_problem = kb == k && mb == m && nb == n;
  // Bounded K loops: never fewer splits than keep each within kMaxKPerSplit.
  const uint32_t whole_splits = uint32_t(std::max<uint64_t>(plan.splits, ceil_div(k, kMaxKPerSplit)));
  // Stream-K where the plan asks for it and it applies; else the plan's tiles and splits.
  const std::optional<StreamK> sk =
      plan.workers && whole_problem ? stream_k_layout(dev, m, n, k, t, plan.workers) : std::nullopt;
  if (e.ep == Epilogue::RowSum && (!whole_problem || whole_splits > 1 || sk || uint64_t(m) * n * k > kRowSumMaxMacs)) {
    // The in-kernel row sums need the whole K in one workgroup and one grid,
    // and they slow the main loop (docs/gemm_notes.md #17): large products
    // take a plain GEMM and a separate column-sum pass (A is K x M).
    record_gemm(r, g, EpilogueArgs{});
    return bias_grad(r, a, *e.row_sums, k, m, g.beta);
  }
  // Large products whose m-major A or n-major B has a leading dimension that
  // is not a multiple of 4 (4095^3, 4097^3) cannot load it as vec4s: they
  // run on a padded copy when it fits one binding (the copy costs less than
  // the 128-bit loads save, docs/gemm_notes.md #45). After the
  // row-sum fallback above, whose column-sum pass reads A packed.
  const uint64_t binding = dev.limits().max_storage_binding;
  auto padded_fits = [&](uint64_t ld) { return uint64_t(k) * ((ld + 3) & ~uint64_t(3)) * 4 <= binding; };
  const bool pad_a = g.elem == 4 && t.lean_loop && ta && lda % 4 && n >= 1024 && padded_fits(lda);
  const bool pad_b = g.elem == 4 && t.lean_loop && !tb && ldb % 4 && m >= 1024 && padded_fits(ldb);
  if (pad_a || pad_b) {
    const uint64_t lda4 = pad_a ? (lda + 3) & ~uint64_t(3) : lda, ldb4 = pad_b ? (ldb + 3) & ~uint64_t(3) : ldb;
    std::unique_ptr<Buffer> a_padded, b_padded;
    GemmProblem padded = g;
    if (pad_a) {
      a_padded = std::make_unique<Buffer>(r.device_ptr(), dev.repack_space(0, k * lda4 * 4), k * lda4 * 4);
      record_repack(r, a, *a_padded, k, uint32_t(lda), uint32_t(lda4));
      padded.a = a_padded.get();
      padded.lda = lda4;
    }
    if (pad_b) {
      b_padded = std::make_unique<Buffer>(r.device_ptr(), dev.repack_space(1, k * ldb4 * 4), k * ldb4 * 4);
      record_repack(r, b, *b_padded, k, uint32_t(ldb), uint32_t(ldb4));
      padded.b = b_padded.get();
      padded.ldb = ldb4;
    }
    return record_planned(r, padded, e, plan);
  }
  if (whole_problem) {
    if (sk) return record_stream_k(r, g, t, plan.workers, *sk, e);
    if (whole_splits > 1) {
      return record_split_region(r, g, whole_region(g), t, whole_splits, e);
    }
    if (e.ep == Epilogue::Plain && ldc == n && record_ragged(r, g, t)) return;
  }
  // Operands past the binding limit along K, or K past one pass of splits:
  // the blocks accumulate into C (beta = 1 after the first), so a fused
  // epilogue runs afterwards as its own elementwise pass over the complete
  // sum. A block with K past kMaxKPerSplit (or few tiles) runs split-K.
  // The bias + residual epilogue only adds, so the first K block applies it
  // and the others accumulate onto its result.
  const bool k_blocks = kb < k;
  if (k_blocks && g.c_elem == 2) {
    // The K blocks add into C: float16 would round once per block. They add
    // into a float32 copy instead, narrowed into C once (C is packed here).
    if (g.tc || ldc != n) throw std::logic_error("gemm: a float16 C in K blocks must be packed");
    if (e.ep != Epilogue::Plain)
      throw ArgumentError("a float16 GEMM with a fused epilogue (bias, activation or its gradient) needs its K (" +
                          std::to_string(k) + ") within one storage binding of A and B; this product splits K into " +
                          std::to_string(ceil_div(k, kb)) + " blocks");
    Buffer wide(r.device_ptr(), uint64_t(m) * n * 4, "pywgtrain.half_product");
    if (g.beta != 0.0f) cast(r, c, wide, uint64_t(m) * n, false);
    GemmProblem w = g;
    w.c = &wide;
    w.c_elem = 4;
    record_planned(r, w, e, plan);
    return cast(r, wide, c, uint64_t(m) * n, true);
  }
  const bool first_block_epilogue = e.ep == Epilogue::BiasResidual;
  std::unique_ptr<Buffer> scratch;  // released after recording: wgpu keeps it alive for the encoder
  const Buffer* target = &c;
  if (k_blocks && e.ep != Epilogue::Plain && !first_block_epilogue) {
    if (e.ep == Epilogue::BiasAct) {  // needs a pre-activation buffer of its own
      scratch = std::make_unique<Buffer>(r.device_ptr(), uint64_t(m) * n * 4, "pywgtrain.preact_scratch");
      e.preact = scratch.get();
      e.ep = Epilogue::BiasActTrain;
    } else if (e.ep == Epilogue::ActGrad) {
      scratch = std::make_unique<Buffer>(r.device_ptr(), uint64_t(m) * n * 4, "pywgtrain.product_scratch");
    }
    target = e.ep == Epilogue::BiasActTrain ? e.preact : scratch.get();
  }
  for (uint64_t m0 = 0; m0 < m; m0 += mb) {
    const uint64_t mc = std::min(mb, m - m0);
    for (uint64_t n0 = 0; n0 < n; n0 += nb) {
      const uint64_t nc = std::min(nb, n - n0);
      for (uint64_t k0 = 0; k0 < k; k0 += kb) {
        const uint64_t kc = std::min(kb, k - k0);
        const float beta = k0 == 0 ? g.beta : 1.0f;
        const Epilogue in_kernel = !k_blocks || (first_block_epilogue && k0 == 0) ? e.ep : Epilogue::Plain;
        const uint32_t splits =
            whole_problem ? whole_splits : choose_splits(dev.gemm_switches(), uint32_t(mc), uint32_t(nc), kc, t);
        GemmProblem block = g;
        block.c = target;
        block.beta = beta;
        Region reg;
        reg.m0 = uint32_t(m0);
        reg.mc = uint32_t(mc);
        reg.n0 = uint32_t(n0);
        reg.nc = uint32_t(nc);
        reg.k0 = k0;
        reg.kc = uint32_t(kc);
        EpilogueArgs be = e;
        be.ep = in_kernel;
        if (splits > 1)
          record_split_region(r, block, reg, t, splits, be);
        else
          record_region(r, block, reg, t, be);
      }
    }
  }
  if (!k_blocks || e.ep == Epilogue::Plain || first_block_epilogue) return;
  if (e.ep == Epilogue::ActGrad) return activation_backward(r, *scratch, *e.preact, c, uint64_t(m) * n, e.act);
  // preact holds op(A) op(B); add the bias in place and write act() to C.
  namespace ln = wgsl::linear;
  KernelDesc d;
  d.shader = "linear";
  d.entry = "bias_act";
  d.bindings = {ln::result, ln::ep, ln::bias, ln::zio};
  d.constants = {{"ACT", u32_literal(uint32_t(e.act))}};
  d.aliases = {{"UT", "f32"}, {"PT", "f32"}, {"RT", "f32"}};  // float32 only: float16 epilogues never split K
  const Kernel& bk = dev.pipelines().get(d);
  const uint64_t rows_per = rows_per_piece(dev, n);
  for (uint64_t m0 = 0; m0 < m; m0 += rows_per) {
    const uint64_t mc = std::min(rows_per, m - m0);
    EwParams p;
    p.n = uint32_t(mc * n);
    p.cols = n;
    auto [gx, gy] = grid_1d(dev, ceil_div(mc * n, ln::WG));
    r.dispatch(bk,
               {{ln::result, floats(c, m0 * n, mc * n)},
                {ln::bias, whole(*e.bias)},
                {ln::zio, floats(*e.preact, m0 * n, mc * n)}},
               p, gx, gy);
  }
}

}  // namespace pwt::gemm_detail
