// Fused attention launchers (attention.wgsl): forward (O and the
// row log-sum-exp) and the FlashAttention-2 backward (delta pass, dK/dV per
// key block, dQ per query block). The inner block loop of each kernel is
// split over dispatches so that no thread runs more than kMaxTrips loop
// iterations (lavapipe leaves loops after 65535); later forward dispatches
// resume from the O / lse of earlier ones, later backward ones accumulate.
// float16 operands (`half`): the kernels' element alias ET is f16 (math stays
// f32); the partial results of a split loop then live in f32 scratch (the
// device workspace) and only the last dispatch rounds them into the output.
#include <algorithm>
#include <string>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {
namespace {

namespace sh = wgsl::attention;
constexpr uint32_t kBlock = sh::B;                  // rows and columns of a tile
constexpr uint32_t kMaxHeadDim = 128;               // DCH <= 2 (accumulators for two 64-column chunks)
constexpr uint32_t kSharedFloats = 2 * sh::B * 64;  // workgroup memory (sm): two tiles of B rows x 64 columns
constexpr uint64_t kMaxTrips = 32768;               // loop iterations per thread and dispatch (tensor_ops.cpp)

// attention.wgsl VEC: q, k, v (and dO) are also read through vec4 views
// (bindings 14-17), one 128-bit load per staged vec4, where every view's
// offset and strides and the head size are multiples of 4.
bool vec_views(uint32_t d, std::initializer_list<const AttnView*> views) {
  if (d % 4) return false;
  for (const AttnView* v : views)
    if (v->off % 4 || v->sb % 4 || v->sh % 4 || v->st % 4) return false;
  return true;
}

const Kernel& attn_kernel(Device& dev, const std::string& entry, uint32_t d, bool half, bool vec = false,
                          bool causal = true, bool kbias = false) {
  KernelDesc kd;
  kd.shader = "attention";
  kd.entry = entry;
  if (entry == "attn_forward")  // dout is bound to q: ld() names it, the forward never reads it
    kd.bindings = {sh::q_in, sh::k_in, sh::v_in, sh::out, sh::lse_out, sh::ap,   sh::dout,
                   sh::q4,   sh::k4,   sh::v4,   sh::g4,  sh::acc_ws,  sh::kbias};
  else if (entry == "attn_delta")
    kd.bindings = {sh::ap, sh::o_in, sh::dout, sh::delta_out};
  else if (entry == "attn_decode")
    kd.bindings = {sh::q_in, sh::out, sh::ap, sh::kc, sh::vc, sh::pos_in};
  else if (entry == "attn_dkdv")
    kd.bindings = {sh::q_in, sh::k_in, sh::v_in, sh::ap, sh::dout, sh::lse_in, sh::delta_in, sh::dk,
                   sh::dv,   sh::q4,   sh::k4,   sh::v4, sh::g4,   sh::acc_ws, sh::kbias};
  else
    kd.bindings = {sh::q_in, sh::k_in, sh::v_in, sh::ap, sh::dout, sh::lse_in, sh::delta_in,
                   sh::dq,   sh::q4,   sh::k4,   sh::v4, sh::g4,   sh::acc_ws, sh::kbias};
  kd.constants = {{"HD", std::to_string(d) + "u"},
                  {"VEC", vec ? "true" : "false"},
                  {"HALF", half ? "true" : "false"},
                  {"CAUSAL", causal ? "true" : "false"},
                  {"KBIAS", kbias ? "true" : "false"}};
  kd.aliases = {{"ET", half ? "f16" : "f32"}};
  // Every storage access in attention.wgsl is guarded (row < T, column < HD,
  // row index < B*H*T) and bind_view / bind_rows check that the last element
  // of each view lies inside its binding: no injected bounds checks needed.
  kd.trusted = true;
  return dev.pipelines().get(kd);
}

uint64_t bh(const AttnShape& s) { return uint64_t(s.batch) * s.heads; }

void check_shape(const Device& dev, const AttnShape& s) {
  if (s.batch == 0 || s.heads == 0 || s.t == 0 || s.tk == 0 || s.d == 0)
    throw ArgumentError("attention: batch, heads, T, S and D must be >= 1");
  if (s.d > kMaxHeadDim)
    throw ArgumentError("attention: head size D = " + std::to_string(s.d) + " exceeds the supported maximum of " +
                        std::to_string(kMaxHeadDim));
  if (bh(s) * std::max(s.t, s.tk) > UINT32_MAX) throw ArgumentError("attention: B * H * T exceeds 2^32 - 1 rows");
  const auto& lim = dev.limits();
  if (lim.max_workgroup_storage < kSharedFloats * 4)
    throw ArgumentError("attention: the kernels need " + std::to_string(kSharedFloats * 4) +
                        " bytes of workgroup memory, the device offers " + std::to_string(lim.max_workgroup_storage));
  if (lim.max_storage_buffers_per_stage < 14)
    throw ArgumentError("attention: the backward binds 14 storage buffers, the device allows " +
                        std::to_string(lim.max_storage_buffers_per_stage));
}

// The binding of a strided operand of `rows` rows and `elem`-byte elements: elements 0 .. its last
// element (whole words), after checking it lies in the buffer.
Range bind_view(const Device& dev, const Buffer& buf, const AttnView& v, const AttnShape& s, uint32_t rows,
                bool written, uint32_t elem, const char* what) {
  if (written && v.st < s.d)
    throw ArgumentError(std::string("attention: ") + what + " has a row stride of " + std::to_string(v.st) +
                        " < D = " + std::to_string(s.d) + " (its rows would overlap)");
  const uint64_t last =
      v.off + uint64_t(s.batch - 1) * v.sb + uint64_t(s.heads - 1) * v.sh + uint64_t(rows - 1) * v.st + s.d - 1;
  const Range r = elements(buf, 0, last + 1, elem);
  if ((last + 1) * elem > buf.bytes())
    throw ArgumentError(std::string("attention: ") + what + " reaches element " + std::to_string(last) +
                        ", its buffer holds " + std::to_string(buf.bytes() / elem) + " elements of " +
                        std::to_string(elem) + " bytes");
  if (r.size > dev.limits().max_storage_binding)
    throw ArgumentError(std::string("attention: ") + what + " spans " + std::to_string(r.size) +
                        " bytes, more than one storage binding (" + std::to_string(dev.limits().max_storage_binding) +
                        " bytes)");
  return r;
}

// acc_ws of a kernel whose block loop runs in `dispatches` dispatches: with float16 outputs and
// more than one dispatch, f32 scratch for `per_row` floats per row (of `rows`) of every head
// (attention.wgsl ws_index); otherwise never touched (the writable placeholder).
Range bind_scratch(Device& dev, const AttnShape& s, uint32_t rows, bool half, uint32_t dispatches, uint32_t per_row) {
  if (!half || dispatches < 2) return Range{dev.placeholder(true), 0, 16};
  const uint64_t bytes = bh(s) * rows * per_row * 4;
  if (bytes > dev.limits().max_storage_binding)
    throw ArgumentError("attention: float16 operands with " + std::to_string(rows) + " rows run the block loop in " +
                        std::to_string(dispatches) + " dispatches, whose float32 partial results (" +
                        std::to_string(bytes) + " bytes) exceed one storage binding (" +
                        std::to_string(dev.limits().max_storage_binding) + " bytes)");
  return Range{dev.workspace(bytes), 0, bytes};
}

Range bind_rows(const Device& dev, const Buffer& buf, const AttnShape& s, const char* what) {
  check_floats(buf, bh(s) * s.t, what);
  if (bh(s) * s.t * 4 > dev.limits().max_storage_binding)
    throw ArgumentError(std::string("attention: ") + what + " exceeds one storage binding");
  return floats(buf, 0, bh(s) * s.t);
}

// An AttnParams view: (off, sb, sh, st).
wgsl::vec4u view(const AttnView& v) {
  wgsl::vec4u u;
  u[0] = uint32_t(v.off);
  u[1] = v.sb;
  u[2] = v.sh;
  u[3] = v.st;
  return u;
}

// Inner blocks one dispatch may loop over: the per-block loop trips of each
// kernel (counted as if no loop were unrolled) within kMaxTrips.
uint32_t blocks_per_dispatch(const std::string& entry, uint32_t d, uint32_t max_blocks) {
  const uint64_t dch = (d + 63) / 64;
  const uint64_t nt = 25 * dch + 1;  // S-type product: chunks x (2 stagings of 4 + 16 vec4 steps)
  const uint64_t pn = 21 * dch + 1;  // P-type product: chunks x (staging of 4 + 16 vec4 steps)
  uint64_t per = entry == "attn_forward" ? nt + pn + 40
                 : entry == "attn_dkdv"  ? 2 * nt + 2 * pn + 40
                                         : 2 * nt + pn + 40;
  uint64_t n = std::max<uint64_t>(1, (kMaxTrips - 512) / per);
  if (max_blocks) n = std::min<uint64_t>(n, max_blocks);
  return uint32_t(n);
}

// Calls fn(bh0, count) over chunks of the B*H heads that fit the y grid.
template <typename Fn>
void for_each_bh(const Device& dev, const AttnShape& s, Fn fn) {
  const uint64_t cap = dev.limits().max_workgroups_per_dim;
  for (uint64_t b0 = 0; b0 < bh(s); b0 += cap) fn(uint32_t(b0), uint32_t(std::min<uint64_t>(cap, bh(s) - b0)));
}

// The kbias binding: [batch][tk] floats, or a placeholder never read (KBIAS false).
Range bind_kbias(Device& dev, const Buffer* kbias, const AttnShape& s) {
  if (!kbias) return Range{dev.placeholder(), 0, 16};
  check_floats(*kbias, uint64_t(s.batch) * s.tk, "attention kbias");
  return floats(*kbias, 0, uint64_t(s.batch) * s.tk);
}

// The AttnParams fields every kernel of a call shares.
AttnParams shape_params(const AttnShape& s, float scale) {
  AttnParams p;
  p.t = s.t;
  p.tk = s.tk;
  p.heads = s.heads;
  p.blocks = uint32_t(ceil_div(s.t, kBlock));
  p.kblocks = uint32_t(ceil_div(s.tk, kBlock));
  p.scale = scale;
  return p;
}

// Key blocks any query reaches: under the causal mask none past the last query block.
uint32_t reached_key_blocks(const AttnShape& s, const AttnParams& p) {
  return s.causal ? std::min(p.kblocks, p.blocks) : p.kblocks;
}

}  // namespace

void attention_forward(Recorder& r, const Buffer& q, const AttnView& qv, const Buffer& k, const AttnView& kv,
                       const Buffer& v, const AttnView& vv, const Buffer& out, const AttnView& ov, const Buffer& lse,
                       const AttnShape& s, float scale, uint32_t max_blocks, bool half, const Buffer* kbias) {
  Device& dev = r.device();
  check_shape(dev, s);
  check_no_alias("attention", out, "out", {{&q, "q"}, {&k, "k"}, {&v, "v"}});
  check_no_alias("attention", lse, "lse", {{&q, "q"}, {&k, "k"}, {&v, "v"}});
  const uint32_t elem = half ? 2 : 4;
  const Range rq = bind_view(dev, q, qv, s, s.t, false, elem, "q");
  const Range rk = bind_view(dev, k, kv, s, s.tk, false, elem, "k");
  const Range rv = bind_view(dev, v, vv, s, s.tk, false, elem, "v");
  const Range ro = bind_view(dev, out, ov, s, s.t, true, elem, "out");
  const Range rl = bind_rows(dev, lse, s, "lse");
  const bool vec = vec_views(s.d, {&qv, &kv, &vv});
  const Kernel& kern = attn_kernel(dev, "attn_forward", s.d, half, vec, s.causal, kbias != nullptr);
  const Range rb = bind_kbias(dev, kbias, s);
  const Range unused{dev.placeholder(), 0, 16};
  const Range q4 = vec ? rq : unused, k4 = vec ? rk : unused, v4 = vec ? rv : unused;
  AttnParams p = shape_params(s, scale);
  const uint32_t nb = p.blocks, nkb = reached_key_blocks(s, p);
  const uint32_t per = blocks_per_dispatch("attn_forward", s.d, max_blocks);
  const Range ws = bind_scratch(dev, s, s.t, half, uint32_t(ceil_div(nkb, per)), s.d);
  p.q = view(qv);
  p.k = view(kv);
  p.v = view(vv);
  p.o = view(ov);
  // Key blocks [b0, b1) per dispatch; under the causal mask query blocks before b0 see none of them.
  for (uint32_t b0 = 0; b0 < nkb; b0 += per) {
    p.blk0 = b0;
    p.blk1 = std::min(nkb, b0 + per);
    for_each_bh(dev, s, [&](uint32_t bh0, uint32_t count) {
      p.bh0 = bh0;
      r.dispatch(kern,
                 {{sh::q_in, rq},
                  {sh::k_in, rk},
                  {sh::v_in, rv},
                  {sh::out, ro},
                  {sh::lse_out, rl},
                  {sh::dout, rq},
                  {sh::q4, q4},
                  {sh::k4, k4},
                  {sh::v4, v4},
                  {sh::g4, q4},
                  {sh::acc_ws, ws},
                  {sh::kbias, rb}},
                 p, s.causal ? nb - b0 : nb, count);
    });
  }
}

void attention_backward(Recorder& r, const Buffer& q, const AttnView& qv, const Buffer& k, const AttnView& kv,
                        const Buffer& v, const AttnView& vv, const Buffer& out, const AttnView& ov, const Buffer& dout,
                        const AttnView& gv, const Buffer& lse, const Buffer& delta, const Buffer& dq,
                        const AttnView& dqv, const Buffer& dk, const AttnView& dkv, const Buffer& dv,
                        const AttnView& dvv, const AttnShape& s, float scale, float beta, uint32_t max_blocks,
                        bool half, const Buffer* kbias) {
  Device& dev = r.device();
  check_shape(dev, s);
  const std::initializer_list<std::pair<const Buffer*, const char*>> inputs = {
      {&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&dout, "dout"}, {&lse, "lse"}};
  check_no_alias("attention", delta, "delta", inputs);
  check_no_alias("attention", dq, "dq", inputs);
  check_no_alias("attention", dk, "dk", inputs);
  check_no_alias("attention", dv, "dv", inputs);
  const uint32_t elem = half ? 2 : 4;
  const Range rq = bind_view(dev, q, qv, s, s.t, false, elem, "q");
  const Range rk = bind_view(dev, k, kv, s, s.tk, false, elem, "k");
  const Range rv = bind_view(dev, v, vv, s, s.tk, false, elem, "v");
  const Range ro = bind_view(dev, out, ov, s, s.t, false, elem, "out");
  const Range rg = bind_view(dev, dout, gv, s, s.t, false, elem, "dout");
  const Range rdq = bind_view(dev, dq, dqv, s, s.t, true, elem, "dq");
  const Range rdk = bind_view(dev, dk, dkv, s, s.tk, true, elem, "dk");
  const Range rdv = bind_view(dev, dv, dvv, s, s.tk, true, elem, "dv");
  const Range rl = bind_rows(dev, lse, s, "lse");
  const Range rd = bind_rows(dev, delta, s, "delta");
  const Range rb = bind_kbias(dev, kbias, s);
  AttnParams p = shape_params(s, scale);
  const uint32_t nb = p.blocks, nkb = p.kblocks, reached = reached_key_blocks(s, p);
  const uint32_t per_kv = blocks_per_dispatch("attn_dkdv", s.d, max_blocks);
  const uint32_t per_q = blocks_per_dispatch("attn_dq", s.d, max_blocks);
  // The scratch of dK, dV and then of dQ is the same workspace (every dK/dV dispatch precedes the
  // dQ ones), taken before anything is recorded (a size error leaves the recording as it was);
  // dK/dV's, the larger, first, so that dQ's never replaces the buffer dK/dV's range names.
  const Range ws_kv = bind_scratch(dev, s, s.tk, half, uint32_t(ceil_div(nb, per_kv)), 2 * s.d);
  const Range ws_q = bind_scratch(dev, s, s.t, half, uint32_t(ceil_div(reached, per_q)), s.d);
  const bool vec = vec_views(s.d, {&qv, &kv, &vv, &gv});
  const Range unused{dev.placeholder(), 0, 16};
  const Range q4 = vec ? rq : unused, k4 = vec ? rk : unused, v4 = vec ? rv : unused, g4 = vec ? rg : unused;
  p.beta = beta;
  p.q = view(qv);
  p.k = view(kv);
  p.v = view(vv);
  p.o = view(ov);
  p.g = view(gv);
  p.dq = view(dqv);
  p.dk = view(dkv);
  p.dv = view(dvv);

  // delta = rowsum(dO * O): a thread per row.
  p.bh0 = 0;
  p.blocks = uint32_t(bh(s) * s.t);
  auto [gx, gy] = grid_1d(dev, ceil_div(bh(s) * s.t, sh::DELTA_WG));
  r.dispatch(attn_kernel(dev, "attn_delta", s.d, half), {{sh::o_in, ro}, {sh::dout, rg}, {sh::delta_out, rd}}, p, gx,
             gy);

  p.blocks = nb;
  // The operands both gradient passes read, plus the outputs of one.
  auto with_inputs = [&](std::vector<Operand> outputs) {
    outputs.insert(outputs.end(), {{sh::q_in, rq},
                                   {sh::k_in, rk},
                                   {sh::v_in, rv},
                                   {sh::dout, rg},
                                   {sh::lse_in, rl},
                                   {sh::delta_in, rd},
                                   {sh::q4, q4},
                                   {sh::k4, k4},
                                   {sh::v4, v4},
                                   {sh::g4, g4},
                                   {sh::kbias, rb}});
    return outputs;
  };
  // dK, dV: a workgroup per key block; query blocks [b0, b1) per dispatch. Under the causal mask
  // they reach key blocks < b1 only; the last dispatch also writes the key blocks no query
  // reaches (S > T), whose gradient is 0.
  const Kernel& kkv = attn_kernel(dev, "attn_dkdv", s.d, half, vec, s.causal, kbias != nullptr);
  for (uint32_t b0 = 0; b0 < nb; b0 += per_kv) {
    p.blk0 = b0;
    p.blk1 = std::min(nb, b0 + per_kv);
    const uint32_t grid = !s.causal || p.blk1 == nb ? nkb : std::min(nkb, p.blk1);
    for_each_bh(dev, s, [&](uint32_t bh0, uint32_t count) {
      p.bh0 = bh0;
      r.dispatch(kkv, with_inputs({{sh::dk, rdk}, {sh::dv, rdv}, {sh::acc_ws, ws_kv}}), p, grid, count);
    });
  }
  // dQ: a workgroup per query block; key blocks [b0, b1) per dispatch.
  const Kernel& kq = attn_kernel(dev, "attn_dq", s.d, half, vec, s.causal, kbias != nullptr);
  for (uint32_t b0 = 0; b0 < reached; b0 += per_q) {
    p.blk0 = b0;
    p.blk1 = std::min(reached, b0 + per_q);
    for_each_bh(dev, s, [&](uint32_t bh0, uint32_t count) {
      p.bh0 = bh0;
      r.dispatch(kq, with_inputs({{sh::dq, rdq}, {sh::acc_ws, ws_q}}), p, s.causal ? nb - b0 : nb, count);
    });
  }
}

void attention_decode(Recorder& r, const Buffer& qkv, const Buffer& k_cache, const Buffer& v_cache, const Buffer& pos,
                      const Buffer& out, uint32_t batch, uint32_t heads, uint32_t capacity, uint32_t d, float scale) {
  Device& dev = r.device();
  const AttnShape s{batch, heads, 1, 1, d, false};
  check_shape(dev, s);
  if (capacity == 0 || capacity > sh::DEC_KEYS)
    throw ArgumentError("attention_decode: cache capacity " + std::to_string(capacity) + " outside [1, " +
                        std::to_string(sh::DEC_KEYS) + "]");
  if (bh(s) > dev.limits().max_workgroups_per_dim)
    throw ArgumentError("attention_decode: B * H = " + std::to_string(bh(s)) + " exceeds the grid's " +
                        std::to_string(dev.limits().max_workgroups_per_dim) + " workgroups");
  check_ints(pos, 1, "attention_decode pos");
  check_no_alias("attention_decode", out, "out", {{&qkv, "qkv"}, {&k_cache, "k_cache"}, {&v_cache, "v_cache"}});
  check_no_alias("attention_decode", k_cache, "k_cache", {{&qkv, "qkv"}, {&v_cache, "v_cache"}, {&pos, "pos"}});
  check_no_alias("attention_decode", v_cache, "v_cache", {{&qkv, "qkv"}, {&pos, "pos"}});
  const uint32_t c = heads * d;
  // qkv [B, 1, 3C]: q, k, v side by side; out [B, 1, C]; caches [B, H, capacity, D].
  const AttnView qv{0, 3 * c, d, d}, kv{c, 3 * c, d, d}, vv{2 * c, 3 * c, d, d}, ov{0, c, d, d};
  const AttnView cv{0, heads * capacity * d, capacity * d, d};
  const Range rq = bind_view(dev, qkv, vv, s, 1, false, 4, "qkv");  // v's view ends last: the binding covers q and k
  const Range ro = bind_view(dev, out, ov, s, 1, true, 4, "out");
  const Range rk = bind_view(dev, k_cache, cv, s, capacity, true, 4, "k_cache");
  const Range rv = bind_view(dev, v_cache, cv, s, capacity, true, 4, "v_cache");
  AttnParams p;
  p.t = capacity;
  p.heads = heads;
  p.scale = scale;
  p.q = view(qv);
  p.k = view(kv);
  p.v = view(vv);
  p.o = view(ov);
  p.dk = view(cv);
  p.dv = view(cv);
  r.dispatch(attn_kernel(dev, "attn_decode", d, false),
             {{sh::q_in, rq}, {sh::out, ro}, {sh::kc, rk}, {sh::vc, rv}, {sh::pos_in, floats(pos, 0, 1)}}, p,
             uint32_t(bh(s)), 1);
}

}  // namespace pwt
