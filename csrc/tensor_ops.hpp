// Tensor kernels under the autograd: element-wise (unary, broadcast binary,
// where, strided copy, fill), reductions along an axis, softmax, embedding
// gather / scatter-add and the NLL pick of cross-entropy, each with its
// backward. All are recorded dispatches only (no copies or clears), so a
// captured step graph replays them. f32 unless said; ids and labels int32.
// The element-wise kernels also take float16 operands (a HalfMask): they load
// f16 as f32, compute in f32 and round once when they store an f16 result.
//
// The op codes come from shader_contract.hpp's tables: the launchers pass
// them to the shaders as the pipeline constant OP, which the shaders compare
// with the same table's constants.
//
// Every launcher checks buffer sizes and arguments and throws ArgumentError
// (a Python ValueError). Operands larger than one storage binding are split
// into bound sub-ranges (element offsets passed in the uniform), except where
// a single row must fit one binding (softmax, nll_pick, embedding rows); see
// each function. An output that shares a GPU buffer with an input (in-place,
// or views of one arena) is refused with ArgumentError: WebGPU cannot bind a
// buffer read-only and writable in one dispatch.
#pragma once
#include <cstdint>
#include <vector>

#include "recorder.hpp"
#include "shader_contract.hpp"

namespace pwt {

// Which operands of an element-wise kernel hold float16 (2-byte) elements, by operand slot:
// in0 (x / a / src), in1 (y / b), in2 (dy / cond), res (the output). The rest are float32.
using HalfMask = uint32_t;
constexpr HalfMask kHalf0 = 1, kHalf1 = 2, kHalf2 = 4, kHalfRes = 8, kHalfAll = 15;

#define PWT_ENUMERATOR(name, value) name = value,
#define PWT_COUNT(name, value) +1
// Op codes: the tables in shader_contract.hpp (also the shaders' and Python's).
enum class UnaryOp : uint32_t { PWT_UNARY_OPS(PWT_ENUMERATOR) };
constexpr uint32_t kUnaryOps = 0 PWT_UNARY_OPS(PWT_COUNT);

// y[i] = f(x[i]; a, b) + beta * y[i], i < n (beta 0 or 1: 1 accumulates into y). half: kHalf0 (x), kHalfRes (y).
void unary(Recorder& r, UnaryOp op, const Buffer& x, const Buffer& y, uint64_t n, float a, float b, float beta,
           HalfMask half = 0);
// dx[i] = dy[i] * f'(x[i]) + beta * dx[i]; `y` is the forward output (exp, sigmoid, tanh, sqrt, rsqrt use it;
// pass x again for the others). Clamp' is 1 inside [a, b] inclusive; Relu'(0) = 0; Abs' = sign(x).
// Relu, Clamp and SqrtStd select dy or 0 (as torch: 0 also for dy = inf or NaN); Relu passes dy at a NaN
// input and Clamp gives 0 there (torch's threshold_backward and clamp_backward). Relu and Clamp keep NaN.
// half: x, y, dy, dx in slot order.
void unary_backward(Recorder& r, UnaryOp op, const Buffer& x, const Buffer& y, const Buffer& dy, const Buffer& dx,
                    uint64_t n, float a, float b, float beta, HalfMask half = 0);

enum class BinaryOp : uint32_t { PWT_BINARY_OPS(PWT_ENUMERATOR) };
constexpr uint32_t kBinaryOps = 0 PWT_BINARY_OPS(PWT_COUNT);
constexpr uint32_t kMaxDims = 6;

// Broadcast element-wise: out (contiguous, shape `shape`, ndim <= kMaxDims)[i] =
// op(a[idx_a(i)], b[idx_b(i)]) + beta * out[i], idx_x(i) = sum_d coord_d(i) * x_strides[d]
// (strides in elements, 0 for broadcast dims). half: kHalf0 (a), kHalf1 (b), kHalfRes (out).
void binary(Recorder& r, BinaryOp op, const Buffer& a, const Buffer& b, const Buffer& out,
            const std::vector<uint32_t>& shape, const std::vector<uint32_t>& a_strides,
            const std::vector<uint32_t>& b_strides, float beta, HalfMask half = 0);
// g[i] = dy[i] * d op(a, b) / d operand + beta * g[i] for operand `which` (0: a, 1: b), at the output
// shape (the caller reduces broadcast dims). Maximum/Minimum as torch: the gradient goes to the larger
// (smaller) operand, half to each on ties, whole to both where either is NaN (the loser gets exactly 0).
// Pow: d/da = b * a^(b-1) (0 where b == 0), d/db = a^b * log(a) (0 where a == 0 and b >= 0), as torch.
// Comparisons: 0. dy and g are contiguous at `shape`. half: a, b, dy, g in slot order.
void binary_backward(Recorder& r, BinaryOp op, uint32_t which, const Buffer& a, const Buffer& b, const Buffer& dy,
                     const Buffer& g, const std::vector<uint32_t>& shape, const std::vector<uint32_t>& a_strides,
                     const std::vector<uint32_t>& b_strides, float beta, HalfMask half = 0);
// out[i] = cond[idx_c(i)] != 0 ? a[idx_a(i)] : b[idx_b(i)] (+ beta * out[i]); out contiguous.
// half: kHalf0 (a), kHalf1 (b), kHalf2 (cond), kHalfRes (out).
void where(Recorder& r, const Buffer& cond, const Buffer& a, const Buffer& b, const Buffer& out,
           const std::vector<uint32_t>& shape, const std::vector<uint32_t>& c_strides,
           const std::vector<uint32_t>& a_strides, const std::vector<uint32_t>& b_strides, float beta,
           HalfMask half = 0);
// Over the index space `shape`: dst[dst_off + sum coord_d * dst_strides[d]] =
// src[src_off + sum coord_d * src_strides[d]] (+ beta * dst[...]). dst positions must not overlap
// (a 0 dst stride over a dimension longer than 1 is refused). half: kHalf0 (src), kHalfRes (dst); offsets
// and strides count elements of each. With beta 0 and equal element types the copy moves raw bits (NaN
// payloads and int32 values kept); otherwise it converts (a strided cast).
void strided_copy(Recorder& r, const Buffer& src, uint64_t src_off, const std::vector<uint32_t>& src_strides,
                  const Buffer& dst, uint64_t dst_off, const std::vector<uint32_t>& dst_strides,
                  const std::vector<uint32_t>& shape, float beta, HalfMask half = 0);
// out[i] = value (rounded to float16 when `half`), i < n.
void fill(Recorder& r, const Buffer& out, uint64_t n, float value, bool half = false);

enum class ReduceOp : uint32_t { PWT_REDUCE_OPS(PWT_ENUMERATOR) };
constexpr uint32_t kReduceOps = 0 PWT_REDUCE_OPS(PWT_COUNT);

// x viewed as [outer, len, inner] -> out[outer, inner] = scale * reduce_j x[o, j, i] (+ beta * out).
// Max writes int32 `argmax` (first index of the max; a NaN wins, first NaN) when argmax != nullptr;
// argmax with Sum is refused. inner == 1: a workgroup per row; inner > 1: 16 columns x 16 lanes along len.
// A [len, inner] slice larger than one binding is reduced in len blocks that accumulate into out
// (Max then needs scale == 1 and beta == 0). half: x holds float16 (out stays float32).
void reduce_axis(Recorder& r, ReduceOp op, const Buffer& x, const Buffer& out, const Buffer* argmax, uint32_t outer,
                 uint32_t len, uint32_t inner, float scale, float beta, bool half = false);
// dx[o, j, i] = (argmax[o, i] == j ? dy[o, i] : 0) + beta * dx[o, j, i]
void max_backward(Recorder& r, const Buffer& dy, const Buffer& argmax, const Buffer& dx, uint32_t outer, uint32_t len,
                  uint32_t inner, float beta);

// Row-wise over the last axis of [rows, cols]: softmax or log_softmax (max-subtracted). One row must fit a binding.
// half: x holds float16 (y stays float32).
void softmax(Recorder& r, const Buffer& x, const Buffer& y, uint32_t rows, uint32_t cols, bool log, bool half = false);
// softmax: dx = y * (dy - sum_j dy*y); log_softmax: dx = dy - exp(y) * sum_j dy   (+ beta * dx)
// half: dx holds float16 (y and dy stay float32).
void softmax_backward(Recorder& r, const Buffer& y, const Buffer& dy, const Buffer& dx, uint32_t rows, uint32_t cols,
                      bool log, float beta, bool half = false);

// out[i, :] = weight[ids[i], :], i < n_ids; ids outside [0, vocab) give NaN rows.
void embedding(Recorder& r, const Buffer& weight, const Buffer& ids, const Buffer& out, uint32_t n_ids, uint32_t vocab,
               uint32_t dim);
// Greedy decoding's next token: tok[r] = argmax of logits [rows, cols] row r (first of
// equal maxima, NaN largest), hist[r, pos[0] + 1] = tok[r] (where < hist_cols), then
// pos[0] += 1; tok, hist, pos int32. Nothing is read back: decode steps chain on the device.
void next_token(Recorder& r, const Buffer& logits, const Buffer& tok, const Buffer& hist, const Buffer& pos,
                uint32_t rows, uint32_t cols, uint32_t hist_cols);
// dweight[v, :] = beta * dweight[v, :] + sum over i with ids[i] == v of dy[i, :]: deterministic (bit-identical
// across runs), no atomics. Out-of-range ids contribute nothing. The ids are cut into consecutive segments
// (several for tables of up to 8M floats, so small vocabularies still fill the GPU): each segment sums in
// increasing i into a scratch partial table, then the partials are added in segment order and beta * dweight
// added last. Tables too large for the scratch use one segment per run of up to 16,384 ids, runs in order.
void embedding_backward(Recorder& r, const Buffer& dy, const Buffer& ids, const Buffer& dweight, uint32_t n_ids,
                        uint32_t vocab, uint32_t dim, float beta);

// out[i] = labels[i] == ignore_index ? 0 : -x[i, labels[i]]; mask[i] = labels[i] == ignore_index ? 0 : 1;
// a label outside [0, cols) other than ignore_index gives NaN.
void nll_pick(Recorder& r, const Buffer& x, const Buffer& labels, const Buffer& out, const Buffer& mask, uint32_t rows,
              uint32_t cols, int32_t ignore_index);
// dx[i, j] = (j == labels[i] && labels[i] != ignore_index ? -dy[i] : 0) + beta * dx[i, j]
void nll_pick_backward(Recorder& r, const Buffer& dy, const Buffer& labels, const Buffer& dx, uint32_t rows,
                       uint32_t cols, int32_t ignore_index, float beta);

}  // namespace pwt
