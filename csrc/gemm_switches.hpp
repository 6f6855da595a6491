// The GEMM's switches for experiments and A/B runs (PYWGTRAIN_GEMM_* other
// than _AUTOTUNE, PYWGTRAIN_GEMV_*; docs/gemm_notes.md), read once when a
// Device opens (Device::gemm_switches), so no GEMM call reads the environment.
#pragma once
#include <cstdint>
#include <optional>

#include "gemm_tuning.hpp"

namespace pwt {

struct GemmSwitches {
  // PYWGTRAIN_GEMM_TILES: one tile configuration for every product.
  std::optional<TileConfig> tiles;
  // PYWGTRAIN_GEMM_SPLITS: split-K partials for every product (0: chosen per shape).
  uint32_t splits = 0;
  // PYWGTRAIN_GEMM_STREAM_K: stream-K over this many workgroups where it applies (0: off).
  uint32_t stream_k_workers = 0;
  // Any of the three above set: the plan is forced, never tuned.
  bool plan_forced = false;
  // PYWGTRAIN_GEMM_NT_ROWS: NT products of at least this many rows run as NN
  // on a transposed copy of B (gemm_record.cpp record_gemm).
  uint64_t nt_as_nn_rows = 4096;
  // PYWGTRAIN_GEMM_NT_SWAP_COLS: NT products of fewer rows and at least this
  // many columns run as C^T = B A^T (unset: gemm_record.cpp's rule).
  std::optional<uint64_t> nt_swap_cols;
  // PYWGTRAIN_GEMM_ROW_SPLIT: products of ragged M always (true) or never
  // (false) run as their whole tile rows and the rest (unset: by tuned times).
  std::optional<bool> row_split;
  // PYWGTRAIN_GEMM_GROUP_M: tile rows consecutive workgroups walk down one
  // tile column (gemm.wgsl GROUP_M; 1 is row-major).
  uint32_t group_m = 8;
  // PYWGTRAIN_GEMM_SLOTS: concurrent 64x128 workgroups of the GPU, for the
  // wave model; WebGPU does not report the multiprocessor count. The
  // default is the H100's (docs/gemm_notes.md #46).
  uint64_t slots = 264;
  // "0" turns one off, for A/B runs: aligned dispatches (PYWGTRAIN_GEMM_ALIGNED),
  // transposed B's k pairs (_PAIR), the GEMM's 128-bit tile loads and stores
  // (_VEC), the GEMV's 128-bit column and row forms (PYWGTRAIN_GEMV_VEC4, _T_VEC4).
  bool aligned = true, pair = true, vec = true, gemv_vec4 = true, gemv_t_vec4 = true;
  // PYWGTRAIN_GEMM_F16_FMA=1: float16 products multiply each K tile with f16
  // FMAs into f16 partial sums added to f32 accumulators (gemm.wgsl
  // HALF_FMA); unset or 0: f32 accumulation throughout.
  bool f16_fma = false;
  // PYWGTRAIN_GEMM_TUNE_ROUNDS: rounds of timing per candidate plan when a
  // shape is tuned (1 to 9; the median round counts). Tests of the tuner on
  // CPU adapters take 1: they check what is tuned and kept, not which wins.
  uint32_t tune_rounds = 3;

  // The switches the environment sets; ArgumentError names a malformed one.
  static GemmSwitches from_env();
};

}  // namespace pwt
