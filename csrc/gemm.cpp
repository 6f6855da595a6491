// The GEMM entry points (ops.hpp): argument checks, then GEMV for one row or
// column, else the tiled product with its epilogue (gemm_record.cpp).
#include <string>

#include "gemm_internal.hpp"

namespace pwt {

void check_floats(const Buffer& b, uint64_t count, const char* what) {
  if (b.bytes() < count * 4)
    throw ArgumentError(std::string(what) + " holds " + std::to_string(b.bytes() / 4) + " floats, needs " +
                        std::to_string(count));
}

void check_elements(const Buffer& b, uint64_t count, uint64_t size, const char* what) {
  if (size == 4) return check_floats(b, count, what);
  if (b.bytes() < count * size)
    throw ArgumentError(std::string(what) + " holds " + std::to_string(b.bytes() / size) + " float16 values, needs " +
                        std::to_string(count));
}

using namespace gemm_detail;

namespace {

// half: float16 operands and output (else float32).
void check_gemm(const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k,
                bool half = false) {
  if (m == 0 || n == 0 || k == 0)
    throw ArgumentError("gemm: M, N and K must be >= 1 (got " + std::to_string(m) + ", " + std::to_string(n) + ", " +
                        std::to_string(k) + ")");
  check_elements(a, uint64_t(m) * k, elem_bytes(half), "gemm operand A");
  check_elements(b, uint64_t(k) * n, elem_bytes(half), "gemm operand B");
  check_elements(c, uint64_t(m) * n, elem_bytes(half), "gemm output C");
}

// The problem of a float16 (half) or float32 product with packed operands.
GemmProblem typed_problem(const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k,
                          bool ta, bool tb, float alpha, float beta, bool half) {
  GemmProblem g = packed_problem(a, b, c, m, n, k, ta, tb, alpha, beta);
  if (half) g.elem = g.c_elem = 2;
  return g;
}

}  // namespace

void gemm(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k, bool ta,
          bool tb, float alpha, float beta) {
  check_gemm(a, b, c, m, n, k);
  if (m == 1 || n == 1) {
    GemvProblem g;
    g.y = &c;
    g.alpha = alpha;
    g.beta = beta;
    g.k = k;
    if (m == 1) {
      // op(A) is one row whichever way A is stored.
      g.x = &a;
      g.b = &b;
      g.n = n;
      g.tb = tb;
    } else {
      // C^T = op(B)^T op(A)^T: the single column of op(B) is the vector and
      // op(A)^T is the matrix, stored N x K style exactly when A is not transposed.
      g.x = &b;
      g.b = &a;
      g.n = m;
      g.tb = !ta;
    }
    record_gemv(r, g);
  } else {
    record_gemm(r, packed_problem(a, b, c, m, n, k, ta, tb, alpha, beta), EpilogueArgs{});
  }
}

void gemm_half(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k,
               bool ta, bool tb, float alpha, float beta) {
  check_gemm(a, b, c, m, n, k, true);
  record_gemm(r, typed_problem(a, b, c, m, n, k, ta, tb, alpha, beta, true), EpilogueArgs{});
}

void gemm_bias_act(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& bias, const Buffer& y,
                   const Buffer* preact, uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb, Activation act,
                   bool half) {
  check_gemm(a, b, y, m, n, k, half);
  check_elements(bias, n, elem_bytes(half), "bias");
  if (preact) check_elements(*preact, uint64_t(m) * n, elem_bytes(half), "pre-activation output");
  EpilogueArgs e;
  e.ep = preact ? Epilogue::BiasActTrain : Epilogue::BiasAct;
  e.act = act;
  e.bias = &bias;
  e.preact = preact;
  e.half_bias = half;
  record_gemm(r, typed_problem(a, b, y, m, n, k, ta, tb, 1.0f, 0.0f, half), e);
}

void gemm_bias_residual(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& bias, const Buffer& residual,
                        const Buffer& y, uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb, bool half,
                        bool half_out) {
  if (half_out && !half) throw ArgumentError("gemm_bias_residual: a float16 output needs float16 operands");
  check_gemm(a, b, y, m, n, k, half);
  check_elements(y, uint64_t(m) * n, elem_bytes(half_out), "output y");
  check_elements(bias, n, elem_bytes(half), "bias");
  check_elements(residual, uint64_t(m) * n, elem_bytes(half_out), "residual");
  check_no_alias("gemm_bias_residual", y, "the output y", {{&residual, "residual"}});
  EpilogueArgs e;
  e.ep = Epilogue::BiasResidual;
  e.bias = &bias;
  e.residual = &residual;
  e.half_bias = half;
  e.half_residual = half_out;
  GemmProblem g = typed_problem(a, b, y, m, n, k, ta, tb, 1.0f, 0.0f, half);
  g.c_elem = half_out ? 2 : 4;  // float16 layers add a float32 residual into a float32 sum (torch's promotion)
  record_gemm(r, g, e);
}

void linear_weight_grads(Recorder& r, const Buffer& dz, const Buffer& x, const Buffer& dw, const Buffer& db,
                         uint32_t rows, uint32_t out_features, uint32_t in_features, float beta) {
  check_gemm(dz, x, dw, out_features, in_features, rows);
  check_floats(db, out_features, "bias gradient");
  EpilogueArgs e;
  e.ep = Epilogue::RowSum;
  e.row_sums = &db;
  record_gemm(r, packed_problem(dz, x, dw, out_features, in_features, rows, true, false, 1.0f, beta), e);
}

void gemm_act_grad(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& preact, const Buffer& c, uint32_t m,
                   uint32_t n, uint32_t k, bool ta, bool tb, Activation act, bool half) {
  check_gemm(a, b, c, m, n, k, half);
  check_elements(preact, uint64_t(m) * n, elem_bytes(half), "pre-activation");
  EpilogueArgs e;
  e.ep = Epilogue::ActGrad;
  e.act = act;
  e.preact = &preact;
  record_gemm(r, typed_problem(a, b, c, m, n, k, ta, tb, 1.0f, 0.0f, half), e);
}

}  // namespace pwt
