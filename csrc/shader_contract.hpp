// The host <-> shader contract, written once: every uniform block the host
// fills (one C++ struct per WGSL struct, same name, same fields, offsets
// checked), every binding of every shader (named as the WGSL variable, with
// its number and access), and the constants host and shader share (workgroup
// sizes, items per thread, tile sizes: defined here, emitted into the shader
// as WGSL `const` declarations by the pipeline cache, never written in the
// .wgsl). tests/test_contract.py parses shaders/*.wgsl and checks that they
// agree with the tables below (uniform_layouts(), shader_interfaces()).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pwt {

enum class Bind { ReadOnly, ReadWrite, Uniform };

// One binding of a shader: number, access, the WGSL variable and its type
// (the uniform's struct name, or "array<f32>" and the like).
struct Slot {
  uint32_t binding;
  Bind kind;
  const char* var;
  const char* type;
};

// WGSL host-shareable types as C++ types with the same size and alignment.
namespace wgsl {
using u32 = uint32_t;
using i32 = int32_t;
using f32 = float;
struct alignas(16) vec4u {
  uint32_t v[4] = {};
  uint32_t& operator[](size_t i) { return v[i]; }
  uint32_t operator[](size_t i) const { return v[i]; }
};
template <typename T, size_t N>
struct array {  // array<T, N> in a uniform block: T must have a 16-byte stride
  static_assert(sizeof(T) % 16 == 0, "uniform arrays need a 16-byte element stride");
  T v[N] = {};
  T& operator[](size_t i) { return v[i]; }
  const T& operator[](size_t i) const { return v[i]; }
};

template <typename T>
struct TypeName;
template <>
struct TypeName<u32> {
  static std::string get() { return "u32"; }
};
template <>
struct TypeName<i32> {
  static std::string get() { return "i32"; }
};
template <>
struct TypeName<f32> {
  static std::string get() { return "f32"; }
};
template <>
struct TypeName<vec4u> {
  static std::string get() { return "vec4<u32>"; }
};
template <typename T, size_t N>
struct TypeName<array<T, N>> {
  static std::string get() { return "array<" + TypeName<T>::get() + ", " + std::to_string(N) + ">"; }
};
}  // namespace wgsl

struct UniformField {
  std::string name;
  std::string type;  // WGSL spelling
  uint32_t offset;
  uint32_t size;
};
struct UniformLayout {
  std::string name;
  uint32_t size;
  std::vector<UniformField> fields;
};
template <typename P>
struct UniformTraits;  // defined for each uniform block below

// ---- Uniform blocks: F(field, WGSL type, byte offset), then the size ----
// (Tables below are laid out by hand: clang-format would pack their rows.)
// clang-format off

#define PWT_FIELDS_GemmParams(F)                                                                                  \
  F(m, u32, 0) F(n, u32, 4) F(k, u32, 8) F(lda, u32, 12) F(ldb, u32, 16) F(ldc, u32, 20) F(a_off, u32, 24)        \
  F(b_off, u32, 28) F(c_off, u32, 32) F(alpha, f32, 36) F(beta, f32, 40) F(bias_off, u32, 44) F(k_chunk, u32, 48) \
  F(split_stride, u32, 52) F(splits, u32, 56) F(sk_workers, u32, 60)
#define PWT_FIELDS_GemvParams(F)                                                                                 \
  F(n, u32, 0) F(k, u32, 4) F(ldb, u32, 8) F(x_off, u32, 12) F(b_off, u32, 16) F(y_off, u32, 20) F(alpha, f32, 24) \
  F(beta, f32, 28) F(k_chunk, u32, 32) F(split_stride, u32, 36)
#define PWT_FIELDS_BmmParams(F)                                                                                   \
  F(m, u32, 0) F(n, u32, 4) F(k, u32, 8) F(batch, u32, 12) F(a_off, u32, 16) F(b_off, u32, 20) F(c_off, u32, 24)  \
  F(_pad0, u32, 28) F(a_stride, u32, 32) F(b_stride, u32, 36) F(c_stride, u32, 40) F(_pad1, u32, 44)             \
  F(alpha, f32, 48) F(beta, f32, 52) F(_pad2, u32, 56) F(_pad3, u32, 60)
#define PWT_FIELDS_AttnParams(F)                                                                                  \
  F(t, u32, 0) F(heads, u32, 4) F(bh0, u32, 8) F(blocks, u32, 12) F(blk0, u32, 16) F(blk1, u32, 20)               \
  F(scale, f32, 24) F(beta, f32, 28) F(q, vec4u, 32) F(k, vec4u, 48) F(v, vec4u, 64) F(o, vec4u, 80)              \
  F(g, vec4u, 96) F(dq, vec4u, 112) F(dk, vec4u, 128) F(dv, vec4u, 144) F(tk, u32, 160) F(kblocks, u32, 164)     \
  F(_pad0, u32, 168) F(_pad1, u32, 172)
#define PWT_FIELDS_XentParams(F)                                                                                  \
  F(rows, u32, 0) F(cols, u32, 4) F(row0, u32, 8) F(x_off, u32, 12) F(ignore_index, i32, 16) F(per_row, u32, 20)  \
  F(beta, f32, 24) F(_pad, u32, 28)
#define PWT_FIELDS_XentFinalParams(F) F(rows, u32, 0) F(mean, u32, 4)
#define PWT_FIELDS_DropParams(F)                                                                                  \
  F(n, u32, 0) F(first_lo, u32, 4) F(first_hi, u32, 8) F(threshold, u32, 12) F(scale, f32, 16) F(beta, f32, 20)   \
  F(_pad0, u32, 24) F(_pad1, u32, 28)
#define PWT_FIELDS_LnParams(F)                                                                                    \
  F(rows, u32, 0) F(cols, u32, 4) F(x_off, u32, 8) F(s_off, u32, 12) F(tpr, u32, 16) F(seg_rows, u32, 20)         \
  F(flags, u32, 24) F(eps, f32, 28) F(beta, f32, 32) F(beta_w, f32, 36) F(beta_b, f32, 40) F(parts, u32, 44)   \
  F(y_off, u32, 48)
#define PWT_FIELDS_EwParams(F) F(n, u32, 0) F(cols, u32, 4) F(bias_off, u32, 8) F(_pad, u32, 12)
#define PWT_FIELDS_ColParams(F) F(rows, u32, 0) F(cols, u32, 4) F(beta, f32, 8) F(block_rows, u32, 12)
#define PWT_FIELDS_AdamParams(F)                                                                                  \
  F(n, u32, 0) F(beta1, f32, 4) F(beta2, f32, 8) F(eps, f32, 12) F(decay, f32, 16) F(step_size, f32, 20)          \
  F(bc2_sqrt, f32, 24) F(half_copy, u32, 28) F(l2, f32, 32) F(_pad0, u32, 36) F(_pad1, u32, 40) F(_pad2, u32, 44)
#define PWT_FIELDS_AdamDevParams(F)                                                                               \
  F(n, u32, 0) F(slot, u32, 4) F(group, u32, 8) F(half_copy, u32, 12) F(beta1, f32, 16) F(beta2, f32, 20)              \
  F(eps, f32, 24) F(weight_decay, f32, 28) F(one_minus_beta1, f32, 32) F(one_minus_beta2, f32, 36)                \
  F(l2, f32, 40) F(_pad2, f32, 44)
#define PWT_FIELDS_ScaleParams(F) F(n, u32, 0)
#define PWT_FIELDS_ScalerParams(F)                                                                                \
  F(n, u32, 0) F(growth_interval, u32, 4) F(growth_factor, f32, 8) F(backoff_factor, f32, 12)                     \
  F(new_scale, f32, 16) F(set_scale, u32, 20) F(_pad0, u32, 24) F(_pad1, u32, 28)
#define PWT_FIELDS_CastParams(F) F(n, u32, 0)
#define PWT_FIELDS_ReducePartialParams(F) F(n, u32, 0) F(out_off, u32, 4)
#define PWT_FIELDS_ReduceFinalParams(F) F(count, u32, 0) F(out_off, u32, 4) F(scale, f32, 8) F(max_norm, f32, 12)
#define PWT_FIELDS_FlatParams(F) F(n, u32, 0) F(a, f32, 4) F(b, f32, 8) F(beta, f32, 12)
#define PWT_FIELDS_NdParams(F)                                                                                    \
  F(n, u32, 0) F(ndim, u32, 4) F(beta, f32, 8) F(_pad, u32, 12) F(offs, vec4u, 16) F(shape, PWT_VEC4U_ARRAY(2), 32) \
  F(strides, PWT_VEC4U_ARRAY(6), 64)
#define PWT_FIELDS_AxisParams(F)                                                                                  \
  F(outer, u32, 0) F(len, u32, 4) F(inner, u32, 8) F(x_row, u32, 12) F(x_col, u32, 16) F(out_row, u32, 20)        \
  F(x_off, u32, 24) F(out_off, u32, 28) F(j0, u32, 32) F(combine, u32, 36) F(scale, f32, 40) F(beta, f32, 44)    \
  F(parts, u32, 48) F(part_len, u32, 52) F(_pad0, u32, 56) F(_pad1, u32, 60)
#define PWT_FIELDS_GatherParams(F)                                                                                \
  F(rows, u32, 0) F(cols, u32, 4) F(vocab, u32, 8) F(v0, u32, 12) F(vcount, u32, 16) F(src_off, u32, 20)          \
  F(idx_off, u32, 24) F(dst_off, u32, 28) F(ignore_index, i32, 32) F(first, u32, 36) F(beta, f32, 40)             \
  F(_pad, u32, 44)
#define PWT_FIELDS_TokenParams(F) F(rows, u32, 0) F(cols, u32, 4) F(hist_cols, u32, 8) F(_pad, u32, 12)
#define PWT_FIELDS_EmbBwdParams(F)                                                                                \
  F(rows, u32, 0) F(cols, u32, 4) F(v0, u32, 8) F(vcount, u32, 12) F(src_off, u32, 16) F(idx_off, u32, 20)        \
  F(dst_off, u32, 24) F(seg, u32, 28) F(segs, u32, 32) F(_pad0, u32, 36) F(beta, f32, 40) F(_pad, u32, 44)

// (name, size in bytes) of every uniform block.
#define PWT_UNIFORMS(U)                                                                                           \
  U(GemmParams, 64) U(GemvParams, 40) U(BmmParams, 64) U(AttnParams, 176) U(XentParams, 32) U(XentFinalParams, 8) \
  U(DropParams, 32) U(LnParams, 52) U(EwParams, 16) U(ColParams, 16) U(AdamParams, 48) U(AdamDevParams, 48) U(ScaleParams, 4) U(ScalerParams, 32) U(CastParams, 4)          \
  U(ReducePartialParams, 8) U(ReduceFinalParams, 16) U(FlatParams, 16) U(NdParams, 160) U(AxisParams, 64)         \
  U(GatherParams, 48) U(EmbBwdParams, 48) U(TokenParams, 16)

// clang-format on

#define PWT_VEC4U_ARRAY(n) array<wgsl::vec4u, n>
#define PWT_DECLARE_FIELD(field, type, offset) wgsl::type field{};
#define PWT_CHECK_OFFSET(field, type, offset) \
  static_assert(offsetof(Self, field) == offset, "offset of " #field " differs from its WGSL offset");
#define PWT_DESCRIBE_FIELD(field, type, offset) \
  UniformField{#field, wgsl::TypeName<wgsl::type>::get(), offset, uint32_t(sizeof(wgsl::type))},
#define PWT_DECLARE_UNIFORM(S, SIZE)                                                           \
  struct S {                                                                                   \
    PWT_FIELDS_##S(PWT_DECLARE_FIELD)                                                          \
  };                                                                                           \
  static_assert(sizeof(S) == SIZE, #S " differs in size from its WGSL struct");                \
  struct S##OffsetChecks {                                                                     \
    using Self = S;                                                                            \
    PWT_FIELDS_##S(PWT_CHECK_OFFSET)                                                           \
  };                                                                                           \
  template <>                                                                                  \
  struct UniformTraits<S> {                                                                    \
    static constexpr const char* name = #S;                                                    \
    static UniformLayout layout() { return {#S, SIZE, {PWT_FIELDS_##S(PWT_DESCRIBE_FIELD)}}; } \
  };

PWT_UNIFORMS(PWT_DECLARE_UNIFORM)

// ---- Shaders: bindings and shared constants, per shaders/<stem>.wgsl ----
// clang-format off
// READ / WRITE (storage, read / read_write): (variable, binding, WGSL type);
// UNIFORM: (variable, binding, uniform block); CONST: (name, u32 value).

// The op codes of the tensor kernels, written once: each becomes a WGSL
// constant of its shader (the switch cases on OP), the C++ enums of
// tensor_ops.hpp, and Python's op names (pywgtrain/_opcodes.py reads them
// from _core.shader_constants(): U_EXP is UNARY["exp"]).
#define PWT_UNARY_OPS(CONST)                                                                                      \
  CONST(U_COPY, 0) CONST(U_NEG, 1) CONST(U_ABS, 2) CONST(U_EXP, 3) CONST(U_LOG, 4) CONST(U_SQRT, 5)              \
  CONST(U_RSQRT, 6) CONST(U_TANH, 7) CONST(U_SIGMOID, 8) CONST(U_RELU, 9) CONST(U_GELU_ERF, 10)                   \
  CONST(U_GELU_TANH, 11) CONST(U_SILU, 12) CONST(U_POW_SCALAR, 13) /* x^a */ CONST(U_CLAMP, 14) /* [a, b] */      \
  CONST(U_ADD_SCALAR, 15) /* x + a */ CONST(U_MUL_SCALAR, 16) /* x * a */ CONST(U_RSUB_SCALAR, 17) /* a - x */    \
  CONST(U_RDIV_SCALAR, 18) /* a / x */ CONST(U_SQRT_STD, 19) /* sqrt, gradient 0 where the result is 0 (std) */  \
  CONST(U_SOFTPLUS, 20) /* log(1 + exp(a x)) / a, x where a x > b */
#define PWT_BINARY_OPS(CONST)                                                                                     \
  CONST(B_ADD, 0) CONST(B_SUB, 1) CONST(B_MUL, 2) CONST(B_DIV, 3) CONST(B_MAXIMUM, 4) CONST(B_MINIMUM, 5)        \
  CONST(B_POW, 6) /* comparisons give 1.0 / 0.0: */ CONST(B_GT, 7) CONST(B_LT, 8) CONST(B_GE, 9) CONST(B_LE, 10) \
  CONST(B_EQ, 11) CONST(B_NE, 12) CONST(B_EQ_NAN, 13) /* a == b, or both NaN (max()'s tie mask) */
#define PWT_REDUCE_OPS(CONST) CONST(R_SUM, 0) CONST(R_MAX, 1)

#define PWT_SHADER_gemm(READ, WRITE, UNIFORM, CONST)                                                              \
  READ(a, 0, "array<AB>") READ(b, 1, "array<AB>") WRITE(c, 2, "array<CT>") UNIFORM(p, 3, GemmParams)              \
  READ(bias, 4, "array<BT>") WRITE(preact, 5, "array<CT>") READ(partials, 6, "array<f32>")                      \
  WRITE(row_sums, 7, "array<f32>") READ(a4, 8, "array<vec4<AB>>") READ(b4, 9, "array<vec4<AB>>")                  \
  WRITE(c4, 10, "array<vec4<CT>>") WRITE(preact4, 11, "array<vec4<CT>>") READ(residual, 12, "array<RT>")       \
  READ(partials4, 13, "array<vec4<f32>>") /* splitk_reduce4: the partials as vec4s */                             \
  READ(b2, 14, "array<vec2<AB>>") /* B as pairs of elements (B_PAIR) */                                            \
  CONST(EW_WG, 256) /* threads of the elementwise entries (split-K reduce, repack), one element each */        \
  CONST(TRANSPOSE_TILE, 32) /* transpose: square tile per workgroup */                                          \
  CONST(TRANSPOSE_ROWS, 8)  /* transpose: thread rows (TRANSPOSE_TILE x TRANSPOSE_ROWS threads) */             \
  /* EPILOGUE (emitted per kernel) selects one of these in epilogue() */                                        \
  CONST(EPILOGUE_PLAIN, 0) CONST(EPILOGUE_BIAS_ACT, 1) CONST(EPILOGUE_BIAS_ACT_TRAIN, 2)                          \
  CONST(EPILOGUE_ACT_GRAD, 3) CONST(EPILOGUE_ROWSUM, 4) CONST(EPILOGUE_BIAS_RESIDUAL, 5)
#define PWT_SHADER_gemv(READ, WRITE, UNIFORM, CONST)                                                              \
  READ(x, 0, "array<f32>") READ(b, 1, "array<f32>") WRITE(y, 2, "array<f32>") UNIFORM(p, 3, GemvParams)           \
  READ(b4, 4, "array<vec4<f32>>") READ(x4, 5, "array<vec4<f32>>")
#define PWT_SHADER_bmm(READ, WRITE, UNIFORM, CONST)                                                               \
  READ(a, 0, "array<f32>") READ(b, 1, "array<f32>") WRITE(c, 2, "array<f32>") UNIFORM(p, 3, BmmParams)            \
  CONST(TILE, 64) /* rows and columns of C per workgroup */
#define PWT_SHADER_attention(READ, WRITE, UNIFORM, CONST)                                                         \
  READ(q_in, 0, "array<ET>") READ(k_in, 1, "array<ET>") READ(v_in, 2, "array<ET>") WRITE(out, 3, "array<ET>")     \
  WRITE(lse_out, 4, "array<f32>") UNIFORM(ap, 5, AttnParams) READ(o_in, 6, "array<ET>")                           \
  READ(dout, 7, "array<ET>") READ(lse_in, 8, "array<f32>") WRITE(delta_out, 9, "array<f32>")                      \
  READ(delta_in, 10, "array<f32>") WRITE(dq, 11, "array<ET>") WRITE(dk, 12, "array<ET>")                          \
  WRITE(dv, 13, "array<ET>") READ(q4, 14, "array<vec4<ET>>") READ(k4, 15, "array<vec4<ET>>")                      \
  READ(v4, 16, "array<vec4<ET>>") READ(g4, 17, "array<vec4<ET>>") WRITE(kc, 18, "array<f32>")                    \
  WRITE(vc, 19, "array<f32>") READ(pos_in, 20, "array<i32>") WRITE(acc_ws, 21, "array<f32>")                      \
  READ(kbias, 22, "array<f32>") /* KBIAS: [B][S] added to every score of key s (a key padding mask) */              \
  CONST(B, 64)        /* rows and columns of a tile */                                                            \
  CONST(DELTA_WG, 256) /* threads of attn_delta, one row each */                                                  \
  CONST(DEC_WG, 256)  /* threads of attn_decode (a workgroup per head) */                                         \
  CONST(DEC_KEYS, 2048) /* attn_decode's largest cache: its scores sit in workgroup memory */
#define PWT_SHADER_cross_entropy(READ, WRITE, UNIFORM, CONST)                                                     \
  READ(logits, 0, "array<LT>") READ(labels, 1, "array<i32>") WRITE(row_stats, 2, "array<vec2<f32>>")                     \
  WRITE(row_loss, 3, "array<f32>") WRITE(row_valid, 4, "array<f32>") UNIFORM(xp, 5, XentParams)                   \
  READ(stats_in, 6, "array<vec2<f32>>") READ(upstream, 7, "array<f32>") READ(scale_in, 8, "array<f32>")                   \
  WRITE(dlogits, 9, "array<LT>") READ(fin_loss, 10, "array<f32>") READ(fin_valid, 11, "array<f32>")              \
  WRITE(fin_out, 12, "array<f32>") UNIFORM(fp, 13, XentFinalParams) WRITE(fin_scale, 14, "array<f32>")           \
  CONST(WG, 256) /* threads per workgroup: along a row, or a row each (the *_short entries) */
#define PWT_SHADER_dropout(READ, WRITE, UNIFORM, CONST)                                                           \
  READ(src, 0, "array<ET>") READ(key, 1, "array<u32>") WRITE(dst, 2, "array<ET>") UNIFORM(dp, 3, DropParams)      \
  WRITE(state, 4, "array<u32>") WRITE(key_out, 5, "array<u32>")                                                   \
  CONST(WG, 256) /* threads per dropout workgroup, 4 elements (one Philox block) each */
#define PWT_SHADER_cast(READ, WRITE, UNIFORM, CONST)                                                              \
  READ(src, 0, "array<u32>") WRITE(dst, 1, "array<u32>") UNIFORM(cp, 2, CastParams)                               \
  CONST(WG, 256) /* threads per workgroup: an output word (f32_to_f16) or element (f16_to_f32) each */
#define PWT_SHADER_layernorm(READ, WRITE, UNIFORM, CONST)                                                         \
  READ(x, 0, "array<XT>") READ(weight, 1, "array<f32>") READ(bias, 2, "array<f32>") WRITE(y, 3, "array<f32>")     \
  WRITE(mean_out, 4, "array<f32>") WRITE(rstd_out, 5, "array<f32>") UNIFORM(lp, 6, LnParams)                      \
  READ(dy, 7, "array<f32>") READ(mean_in, 8, "array<f32>") READ(rstd_in, 9, "array<f32>")                         \
  WRITE(dx, 10, "array<XT>") WRITE(parts, 11, "array<f32>") READ(parts_in, 12, "array<f32>")                      \
  WRITE(dweight, 13, "array<f32>") WRITE(dbias, 14, "array<f32>")                                                 \
  CONST(WG, 256)  /* threads per row workgroup (forward, backward) */                                             \
  CONST(COLS, 16) /* columns per ln_param_grads workgroup (16 x 16 threads) */                                    \
  CONST(HAS_W, 1) CONST(HAS_B, 2) CONST(WANT_DX, 4) CONST(WANT_PARTS, 8) CONST(WANT_DW, 16) CONST(WANT_DB, 32)
#define PWT_SHADER_linear(READ, WRITE, UNIFORM, CONST)                                                            \
  READ(upstream, 0, "array<UT>") READ(preact, 1, "array<PT>") WRITE(result, 2, "array<RT>")                    \
  UNIFORM(ep, 3, EwParams) READ(bias, 4, "array<f32>") WRITE(zio, 5, "array<f32>") UNIFORM(cp, 6, ColParams)      \
  CONST(WG, 256)  /* threads of the elementwise entries, one element each */                                      \
  CONST(COLS, 16) /* columns per bias_grad workgroup */                                                           \
  CONST(LANES, 16) /* row lanes per bias_grad column */                                                          \
  CONST(PART_COLS, 64) /* columns per colsum_partial workgroup */                                                 \
  CONST(PART_LANES, 4) /* row lanes per colsum_partial column */
#define PWT_SHADER_optim(READ, WRITE, UNIFORM, CONST)                                                             \
  WRITE(param, 0, "array<f32>") READ(grad, 1, "array<f32>") WRITE(exp_avg, 2, "array<f32>")                       \
  WRITE(exp_avg_sq, 3, "array<f32>") UNIFORM(ap, 4, AdamParams) READ(clip, 5, "array<f32>")                       \
  WRITE(grads, 6, "array<f32>") UNIFORM(sp, 7, ScaleParams) READ(hyper, 8, "array<f32>")                          \
  WRITE(adam_state, 9, "array<u32>") WRITE(found_inf, 10, "array<f32>") UNIFORM(dp, 11, AdamDevParams)           \
  WRITE(scaler, 12, "array<f32>") UNIFORM(gp, 13, ScalerParams) WRITE(param_half, 14, "array<u32>")              \
  CONST(WG, 256) /* threads per workgroup; the AdamW updates take two elements each */
#define PWT_SHADER_reduce(READ, WRITE, UNIFORM, CONST)                                                            \
  READ(src, 0, "array<f32>") WRITE(dst, 1, "array<f32>") UNIFORM(pp, 2, ReducePartialParams)                      \
  UNIFORM(fp, 3, ReduceFinalParams) READ(src4, 4, "array<vec4<f32>>")                                             \
  CONST(WG, 256)   /* threads per workgroup */                                                                    \
  CONST(ITEMS, 16) /* elements per thread in the partial pass */
#define PWT_SHADER_elementwise(READ, WRITE, UNIFORM, CONST)                                                       \
  READ(in0, 0, "array<T0>") READ(in1, 1, "array<T1>") READ(in2, 2, "array<T2>") WRITE(res, 3, "array<TR>")        \
  UNIFORM(np, 4, NdParams) UNIFORM(fp, 5, FlatParams) READ(in0_bits, 6, "array<u32>")                             \
  WRITE(res_bits, 7, "array<u32>") WRITE(res_words, 8, "array<atomic<u32>>")                                      \
  CONST(WG, 256) /* threads per workgroup */                                                                    \
  CONST(EPT, 4) /* elements per thread (the kernels spell out four) */ PWT_UNARY_OPS(CONST) PWT_BINARY_OPS(CONST)
#define PWT_SHADER_axis(READ, WRITE, UNIFORM, CONST)                                                              \
  READ(src, 0, "array<ST>") READ(src2, 1, "array<f32>") READ(idx_in, 2, "array<i32>") WRITE(res, 3, "array<RT>") \
  WRITE(idx_out, 4, "array<i32>") UNIFORM(ap, 5, AxisParams)                                                      \
  CONST(WG, 256)   /* threads per workgroup: along a row (reduce_rows, softmax), or one element each */          \
  CONST(COLS, 16)  /* columns per reduce_cols workgroup */                                                        \
  CONST(LANES, 16) /* lanes along len per reduce_cols column */                                                   \
  PWT_REDUCE_OPS(CONST)
#define PWT_SHADER_embedding(READ, WRITE, UNIFORM, CONST)                                                         \
  READ(src, 0, "array<f32>") READ(idx, 1, "array<i32>") WRITE(dst, 2, "array<f32>") WRITE(dst2, 3, "array<f32>")  \
  UNIFORM(gp, 4, GatherParams) WRITE(tok_out, 5, "array<i32>") WRITE(hist, 6, "array<i32>")                       \
  WRITE(pos_io, 7, "array<i32>") UNIFORM(tp, 8, TokenParams)                                                      \
  CONST(WG, 256) /* threads of the flat entries (and of next_token's one workgroup) */                                                                \
  CONST(VB, 1024) /* dweight rows per embedding_backward (scan) workgroup: its ids are scanned once per VB rows */ \
  CONST(CB, 64)  /* columns per embedding_backward (scan) workgroup, one per thread */
#define PWT_SHADER_embedding_backward(READ, WRITE, UNIFORM, CONST)                                                \
  READ(src, 0, "array<f32>") READ(idx, 1, "array<i32>") WRITE(dst, 2, "array<f32>") UNIFORM(ep, 4, EmbBwdParams)  \
  CONST(WG, 256) /* threads of emb_bwd_combine, one element each */                                               \
  CONST(CB, 64)  /* columns per emb_bwd_segments workgroup, one per thread (VB is emitted per kernel) */

#define PWT_SHADERS(S) \
  S(gemm) S(gemv) S(bmm) S(attention) S(cross_entropy) S(cast) S(dropout) S(layernorm) S(linear) S(optim) S(reduce) \
  S(elementwise) S(axis) S(embedding) S(embedding_backward)

// clang-format on

// Each shader's names live in wgsl::<stem>: wgsl::gemm::c is the Slot of
// gemm.wgsl's `c`, wgsl::reduce::ITEMS its constant.
#define PWT_READ_SLOT(var, n, type) constexpr Slot var{n, Bind::ReadOnly, #var, type};
#define PWT_WRITE_SLOT(var, n, type) constexpr Slot var{n, Bind::ReadWrite, #var, type};
#define PWT_UNIFORM_SLOT(var, n, S) constexpr Slot var{n, Bind::Uniform, #var, UniformTraits<S>::name};
#define PWT_CONSTANT(name, value) constexpr uint32_t name = value;
#define PWT_NO_SLOT(var, n, type)
#define PWT_NO_CONSTANT(name, value)
#define PWT_LIST_SLOT(var, n, type) var,
#define PWT_LIST_CONSTANT(name, value) {#name, value},

struct ShaderInterface {
  std::string shader;  // file stem under shaders/
  std::vector<Slot> slots;
  std::vector<std::pair<std::string, uint32_t>> constants;
};

#define PWT_DECLARE_SHADER(stem)                                                                          \
  namespace wgsl::stem {                                                                                  \
  PWT_SHADER_##stem(PWT_READ_SLOT, PWT_WRITE_SLOT, PWT_UNIFORM_SLOT, PWT_CONSTANT) inline ShaderInterface \
      interface() {                                                                                       \
    return {#stem,                                                                                        \
            {PWT_SHADER_##stem(PWT_LIST_SLOT, PWT_LIST_SLOT, PWT_LIST_SLOT, PWT_NO_CONSTANT)},            \
            {PWT_SHADER_##stem(PWT_NO_SLOT, PWT_NO_SLOT, PWT_NO_SLOT, PWT_LIST_CONSTANT)}};               \
  }                                                                                                       \
  }

PWT_SHADERS(PWT_DECLARE_SHADER)

// Everything above as data (the pipeline cache, tests/test_contract.py).
std::vector<UniformLayout> uniform_layouts();
std::vector<ShaderInterface> shader_interfaces();
// One binding or constant of a shader in plain values (for Python).
struct ContractBinding {
  std::string shader, var;
  uint32_t binding;
  std::string access;  // WGSL spelling: "uniform", "read" or "read_write"
  std::string type;
};
struct ContractConstant {
  std::string shader, name;
  uint32_t value;
};
std::vector<ContractBinding> contract_bindings();
std::vector<ContractConstant> contract_constants();
// The interface of shaders/<stem>.wgsl, or nullptr for a file without one (a
// file only ever included by others).
const ShaderInterface* shader_interface(const std::string& stem);

}  // namespace pwt
