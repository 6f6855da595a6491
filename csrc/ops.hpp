// Kernel launchers: each validates sizes, picks a kernel variant from the
// pipeline cache, splits work that exceeds binding or dispatch limits, and
// records into the caller's Recorder. Nothing here waits on the GPU but the
// GEMM autotuner, which times a shape the first time it comes (gemm_tuner.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "recorder.hpp"

namespace pwt {

enum class Activation : uint32_t { None = 0, Relu = 1, GeluTanh = 2, GeluErf = 3, Silu = 4 };

// C[M,N] = alpha * op(A) op(B) + beta * C, row-major f32, op(A) is M x K.
void gemm(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k,
          bool trans_a, bool trans_b, float alpha, float beta);
// The same on float16 A, B and C (gemm.wgsl with AB = CT = f16; accumulation in f32). Needs the
// device's shader-f16 feature (ArgumentError naming it otherwise).
void gemm_half(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k,
               bool trans_a, bool trans_b, float alpha, float beta);

// Turns GEMM autotuning on or off for dev (Device::gemm_tuning) and points
// its plan cache at cache_dir ("": memory only). The cache file is named by
// the adapter, the embedded shaders and the heuristic's own plans, so a new
// driver, kernel or heuristic starts a fresh table (gemm_tuner.cpp).
void configure_gemm_tuning(Device& dev, bool enabled, const std::string& cache_dir);

// The plans the tuner would time for a packed m x n x k product, the
// heuristic's first: what tests read to check the candidate set without
// depending on which one a timing picks.
std::vector<GemmPlan> gemm_tune_candidates(const Device& dev, uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb);

// C[i] = alpha * op(A[i]) op(B[i]) + beta * C[i] for i < batch; the matrices of
// each operand packed one after another (bmm.cpp).
void gemm_batched(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& c, uint32_t batch, uint32_t m,
                  uint32_t n, uint32_t k, bool trans_a, bool trans_b, float alpha, float beta);

// The fused linear-layer products below take `half`: float16 A, B, bias,
// outputs and pre-activations (accumulation and epilogue arithmetic in f32,
// each stored value rounded once: the activation reads the f32
// pre-activation, where torch's reads the float16-rounded linear output).

// Y = act(op(A) op(B) + bias); when `preact` is given it receives op(A) op(B) + bias.
void gemm_bias_act(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& bias, const Buffer& y,
                   const Buffer* preact, uint32_t m, uint32_t n, uint32_t k, bool trans_a, bool trans_b, Activation act,
                   bool half = false);

// Y = op(A) op(B) + bias + residual (residual M x N like Y, in another GPU
// buffer): a linear layer and the residual connection around it in one pass.
// half_out: Y and the residual are float16 too (else float32, also after float16 operands).
void gemm_bias_residual(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& bias, const Buffer& residual,
                        const Buffer& y, uint32_t m, uint32_t n, uint32_t k, bool trans_a, bool trans_b,
                        bool half = false, bool half_out = false);

// A linear layer's parameter gradients from dZ [rows, out] and its input
// X [rows, in]: dW = dZ^T X and db = column sums of dZ, each + beta * itself;
// db comes out of the same GEMM when K (= rows) is not split.
void linear_weight_grads(Recorder& r, const Buffer& dz, const Buffer& x, const Buffer& dw, const Buffer& db,
                         uint32_t rows, uint32_t out_features, uint32_t in_features, float beta);
// dZ = (op(A) op(B)) * act'(Z): a layer's input gradient carried through the
// activation of the layer below in the GEMM's epilogue (Z: that layer's pre-activation).
void gemm_act_grad(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& preact, const Buffer& c, uint32_t m,
                   uint32_t n, uint32_t k, bool ta, bool tb, Activation act, bool half = false);
// dZ = dY * act'(Z), elementwise over n values (half: all three float16).
void activation_backward(Recorder& r, const Buffer& dy, const Buffer& z, const Buffer& dz, uint64_t n, Activation act,
                         bool half = false);
// db[cols] = column sums of dZ[rows, cols] (+ beta * db), summed in f32 (half: dZ and db float16).
void bias_grad(Recorder& r, const Buffer& dz, const Buffer& db, uint32_t rows, uint32_t cols, float beta,
               bool half = false);

// weight_decay: AdamW's decoupled decay; l2: Adam's weight decay, added to the gradient.
struct AdamWConfig {
  float lr, beta1, beta2, eps, weight_decay, l2;
};
// AdamW's per-dispatch uniform block.
using AdamWUniform = AdamParams;
AdamWUniform adamw_uniform(uint32_t n, const AdamWConfig& cfg, uint64_t step);
// One AdamW step (step >= 1) over n parameters; `clip` (if given) holds
// [norm, coefficient] from grad_norm and scales the gradient as it is read;
// `param_half` (if given): n float16 values, each updated parameter rounded
// (as cast() rounds) in the same dispatch.
void adamw(Recorder& r, const Buffer& param, const Buffer& grad, const Buffer& exp_avg, const Buffer& exp_avg_sq,
           uint64_t n, const AdamWConfig& cfg, uint64_t step, const Buffer* clip, const Buffer* param_half = nullptr);
// Capturable AdamW (optim.wgsl): `state` holds kAdamSlotWords u32 per
// parameter slot (step, bias corrections and this step's coefficients as float
// bits), `hyper` each group's lr, `found_inf` a flag that skips the step.
// adamw_prepare advances slots first_slot.. with group `group`'s lr (unless
// skipped); adamw_device updates n parameters with slot `slot`'s coefficients.
constexpr uint32_t kAdamSlotWords = 8;
void adamw_prepare(Recorder& r, const Buffer& state, uint32_t first_slot, uint32_t slots, const Buffer& found_inf,
                   const AdamWConfig& cfg, const Buffer& hyper, uint32_t group);
void adamw_device(Recorder& r, const Buffer& param, const Buffer& grad, const Buffer& exp_avg, const Buffer& exp_avg_sq,
                  uint64_t n, const AdamWConfig& cfg, const Buffer& state, uint32_t slot, const Buffer& found_inf,
                  const Buffer* clip, const Buffer* param_half = nullptr);
// GradScaler (optim.wgsl): `scaler` holds [scale, growth tracker, found any].
// g *= 1/scale over n gradients, setting found_inf[0] and scaler[2] on a
// non-finite one; `first` resets found_inf before (the first span of an unscale_).
void scaler_unscale(Recorder& r, const Buffer& grad, uint64_t n, const Buffer& scaler, const Buffer& found_inf,
                    bool first);
// Growth/backoff (or the scale `new_scale` points to) and a cleared found flag.
void scaler_update(Recorder& r, const Buffer& scaler, float growth_factor, float backoff_factor,
                   uint32_t growth_interval, const float* new_scale);

// Global L2 norm over several gradient vectors into out[0]; out[1] =
// max_norm / (norm + 1e-6). `scratch` must hold grad_norm_scratch_floats().
void grad_norm(Recorder& r, const std::vector<const Buffer*>& grads, const std::vector<uint64_t>& counts,
               const Buffer& scratch, const Buffer& out, float max_norm);
uint64_t grad_norm_scratch_floats(const Device& dev, const std::vector<uint64_t>& counts);
// g *= min(1, out[1]) in place, skipped on the GPU when the norm is within bounds.
void scale_by_clip(Recorder& r, const Buffer& grad, uint64_t n, const Buffer& norm_out);

// Fused softmax cross-entropy (cross_entropy.cpp). Forward: per-row statistics
// (row_stats, 2 floats a row: the max m and log(sum(exp(x - m)))), loss (0
// where label == ignore_index) and counted flag; out = the sum or mean over
// counted rows, scale = the gradient scale (1 / count for the mean, else 1).
// half: float16 logits (and dlogits in the backward), read as f32; the loss and
// the row buffers stay f32.
void cross_entropy_forward(Recorder& r, const Buffer& logits, const Buffer& labels, const Buffer& row_stats,
                           const Buffer& row_loss, const Buffer& row_valid, const Buffer& out, const Buffer& scale,
                           uint32_t rows, uint32_t cols, int32_t ignore_index, bool mean, bool half = false);
// dlogits = (softmax - onehot) * upstream * scale (+ beta * dlogits), recomputed from the
// logits and the forward's row_stats; `per_row`: upstream holds one value per row
// (reduction 'none') and `scale` is not read; `scale` is the forward's.
void cross_entropy_backward(Recorder& r, const Buffer& logits, const Buffer& labels, const Buffer& row_stats,
                            const Buffer& upstream, const Buffer& scale, const Buffer& dlogits, uint32_t rows,
                            uint32_t cols, int32_t ignore_index, bool per_row, float beta, bool half = false);

// Fused causal self-attention (attention.cpp, attention.wgsl). An operand view:
// element (b, h, t, d) of a [B, H, T, D] operand lies at element
// off + b*sb + h*sh + t*st + d of its buffer (d contiguous), so q, k, v (and
// dq, dk, dv) may be column blocks of one [B, T, 3C] buffer.
struct AttnView {
  uint64_t off;
  uint32_t sb, sh, st;
};
// Sizes of an attention call: queries (q, out, dout, dq) are [batch, heads, t, d]
// views, keys and values (k, v, dk, dv) [batch, heads, tk, d] ones; causal: query
// i sees keys 0..i (the top-left triangle, torch's is_causal), else every key.
struct AttnShape {
  uint32_t batch, heads, t, tk, d;
  bool causal;
};
// out = softmax(q k^T * scale [+ causal mask]) v per (b, h); lse [B*H, T] receives the
// natural-log log-sum-exp of each row's scaled scores (the backward reads it).
// D <= 128. max_blocks > 0 caps the inner blocks per dispatch (tests; 0: automatic).
// half: q, k, v and out hold float16 (f32 math; lse stays float32). kbias (optional): float32
// [batch][tk], added to the scaled scores of key j in every head and query (a key padding mask).
void attention_forward(Recorder& r, const Buffer& q, const AttnView& qv, const Buffer& k, const AttnView& kv,
                       const Buffer& v, const AttnView& vv, const Buffer& out, const AttnView& ov, const Buffer& lse,
                       const AttnShape& s, float scale, uint32_t max_blocks, bool half = false,
                       const Buffer* kbias = nullptr);
// dq, dk, dv (+ beta * themselves; beta 0 or 1) from dout, the forward's out and
// lse; `delta` is scratch of B*H*T floats. dq, dk, dv may share one buffer
// when their elements do not overlap; no output may share a buffer with an input.
// half: q, k, v, out, dout and dq, dk, dv hold float16 (lse and delta float32).
void attention_backward(Recorder& r, const Buffer& q, const AttnView& qv, const Buffer& k, const AttnView& kv,
                        const Buffer& v, const AttnView& vv, const Buffer& out, const AttnView& ov, const Buffer& dout,
                        const AttnView& gv, const Buffer& lse, const Buffer& delta, const Buffer& dq,
                        const AttnView& dqv, const Buffer& dk, const AttnView& dkv, const Buffer& dv,
                        const AttnView& dvv, const AttnShape& s, float scale, float beta, uint32_t max_blocks,
                        bool half = false, const Buffer* kbias = nullptr);
// One decode step's attention (attn_decode): qkv [B, 1, 3C] (C = heads * d) holds
// the new token's q, k, v; k and v are written to row pos[0] (int32, on the
// device, < capacity) of k_cache / v_cache [B, heads, capacity, d], and
// out [B, 1, C] = softmax(q K^T * scale) V over cache rows 0..pos[0].
// capacity <= wgsl::attention::DEC_KEYS.
void attention_decode(Recorder& r, const Buffer& qkv, const Buffer& k_cache, const Buffer& v_cache, const Buffer& pos,
                      const Buffer& out, uint32_t batch, uint32_t heads, uint32_t capacity, uint32_t d, float scale);
// Fused LayerNorm over the rows of x [rows, cols] (layernorm.cpp). Forward: y = (x - mean) * rstd
// * weight + bias (weight / bias may be null: 1 / 0), mean and rstd = 1 / sqrt(var + eps) (biased
// variance, as torch) saved per row for the backward. Rows past one binding run in row blocks.
// half: x (and the backward's dx) hold float16; y, weight, bias and the statistics are float32.
void layer_norm_forward(Recorder& r, const Buffer& x, const Buffer* weight, const Buffer* bias, const Buffer& y,
                        const Buffer& mean, const Buffer& rstd, uint32_t rows, uint32_t cols, float eps,
                        bool half = false);
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight (+ beta * dx);
// dweight = sum over rows of dy * xhat (+ beta_weight * dweight), dbias = sum of dy (+ beta_bias * dbias),
// reduced deterministically (per-slot partial rows in scratch, then a column pass). Any of dx,
// dweight, dbias may be null (not all three); dweight needs weight.
void layer_norm_backward(Recorder& r, const Buffer& x, const Buffer* weight, const Buffer& mean, const Buffer& rstd,
                         const Buffer& dy, const Buffer* dx, const Buffer* dweight, const Buffer* dbias, uint32_t rows,
                         uint32_t cols, float beta, float beta_weight, float beta_bias, bool half = false);

// Dropout (dropout.cpp). rng_take: key[0..4) = state[0..4) ([seed_lo, seed_hi, counter_lo,
// counter_hi], uint32), then state's 64-bit counter += 1, on the GPU (a captured graph replays it).
void rng_take(Recorder& r, const Buffer& state, const Buffer& key);
// y[i] = x[i] * mask(key, i) / (1 - p) (+ beta * y[i]), i < n, p in [0, 1): element i is kept when
// Philox-4x32-10 word i % 4 of counter (i / 4, key counter), key (seed) is >= round(p * 2^32).
// The backward is the same call on dy -> dx with the same key.
// half: x and y hold float16 (the same mask as for float32).
void dropout(Recorder& r, const Buffer& x, const Buffer& key, const Buffer& y, uint64_t n, double p, float beta,
             bool half = false);
// round(p * 2^32) (at most 2^32 - 1): elements whose random word is below it are dropped.
uint32_t dropout_threshold(double p);

// Casts (cast.cpp): dst[i] = src[i] for i < n, float32 -> float16 (to_half; round to nearest
// even, overflow to inf) or float16 -> float32 (exact). Both bound from their first byte.
void cast(Recorder& r, const Buffer& src, const Buffer& dst, uint64_t n, bool to_half);

}  // namespace pwt
