// Reading the GEMM's experiment switches (gemm_switches.hpp) from the
// environment, once per Device.
#include "gemm_switches.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "env.hpp"
#include "errors.hpp"

namespace pwt {

namespace {

// Whether the variable `name` is "0".
bool env_switched_off(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string(v) == "0";
}

// PYWGTRAIN_GEMM_TILES="BM,BN,BK,TM,TN[,WARP_W[,LEAN_LOOP]]": checked against
// what gemm.wgsl can run, so a bad value is refused rather than compiled.
TileConfig parse_tiles(const char* forced) {
  TileConfig t{};
  int used = 0;
  const int fields = std::sscanf(forced, "%u,%u,%u,%u,%u%n,%u%n,%u%n", &t.bm, &t.bn, &t.bk, &t.tm, &t.tn, &used,
                                 &t.warp_w, &used, &t.lean_loop, &used);
  if (fields < 5 || forced[used] != '\0' || t.lean_loop > 1)
    throw ArgumentError(std::string("PYWGTRAIN_GEMM_TILES: expected BM,BN,BK,TM,TN[,WARP_W[,LEAN_LOOP]] (LEAN_LOOP 0 "
                                    "or 1), got '") +
                        forced + "'");
  const uint32_t wg_x = t.tn ? t.bn / t.tn : 0, wg_y = t.tm ? t.bm / t.tm : 0, threads = wg_x * wg_y;
  auto whole_slots = [&](uint32_t rows) {
    return threads && rows * t.bk / 4 >= threads && (rows * t.bk / 4) % threads == 0;
  };
  if (t.tm % 4 || t.tn % 4 || !whole_slots(t.bm) || !whole_slots(t.bn) || t.bm % 16 || t.bn % 16)
    throw ArgumentError(
        "PYWGTRAIN_GEMM_TILES: TM and TN must be multiples of 4, BM and BN of 16, and each thread must "
        "load a whole number (>= 1) of vec4s of both tiles (BM*BK/4 and BN*BK/4 multiples of "
        "(BM/TM)*(BN/TN))");
  const bool warps_ok =
      !t.warp_w || t.warp_w == wg_x || (32 % t.warp_w == 0 && wg_x % t.warp_w == 0 && wg_y % (32 / t.warp_w) == 0);
  if (!warps_ok)
    throw ArgumentError("PYWGTRAIN_GEMM_TILES: WARP_W " + std::to_string(t.warp_w) + " must divide 32 and BN/TN (" +
                        std::to_string(wg_x) + "), and 32/WARP_W must divide BM/TM (" + std::to_string(wg_y) + ")");
  return t;
}

}  // namespace

GemmSwitches GemmSwitches::from_env() {
  GemmSwitches s;
  const char* tiles = std::getenv("PYWGTRAIN_GEMM_TILES");
  const char* splits = std::getenv("PYWGTRAIN_GEMM_SPLITS");
  const char* stream_k = std::getenv("PYWGTRAIN_GEMM_STREAM_K");
  if (tiles && *tiles) s.tiles = parse_tiles(tiles);
  if (splits) s.splits = uint32_t(std::max(std::atoi(splits), 0));
  s.stream_k_workers = uint32_t(std::min<uint64_t>(env_count("PYWGTRAIN_GEMM_STREAM_K", 0), UINT32_MAX));
  s.plan_forced = (tiles && *tiles) || (splits && *splits) || (stream_k && *stream_k);
  s.nt_as_nn_rows = env_count("PYWGTRAIN_GEMM_NT_ROWS", s.nt_as_nn_rows);
  if (const char* v = std::getenv("PYWGTRAIN_GEMM_NT_SWAP_COLS"); v && *v)
    s.nt_swap_cols = env_count("PYWGTRAIN_GEMM_NT_SWAP_COLS", 0);
  if (const char* v = std::getenv("PYWGTRAIN_GEMM_ROW_SPLIT"); v && *v) {
    if (std::string(v) != "0" && std::string(v) != "1")
      throw ArgumentError(std::string("PYWGTRAIN_GEMM_ROW_SPLIT must be 0 or 1, got '") + v + "'");
    s.row_split = std::string(v) == "1";
  }
  s.group_m = uint32_t(std::clamp<uint64_t>(env_count("PYWGTRAIN_GEMM_GROUP_M", s.group_m), 1, 1u << 16));
  if (const char* v = std::getenv("PYWGTRAIN_GEMM_SLOTS"); v && std::atol(v) > 0) s.slots = uint64_t(std::atol(v));
  s.aligned = !env_switched_off("PYWGTRAIN_GEMM_ALIGNED");
  s.pair = !env_switched_off("PYWGTRAIN_GEMM_PAIR");
  s.vec = !env_switched_off("PYWGTRAIN_GEMM_VEC");
  s.gemv_vec4 = !env_switched_off("PYWGTRAIN_GEMV_VEC4");
  s.gemv_t_vec4 = !env_switched_off("PYWGTRAIN_GEMV_T_VEC4");
  s.tune_rounds = uint32_t(env_count("PYWGTRAIN_GEMM_TUNE_ROUNDS", s.tune_rounds));
  if (s.tune_rounds < 1 || s.tune_rounds > 9)
    throw ArgumentError("PYWGTRAIN_GEMM_TUNE_ROUNDS must be from 1 to 9, got " + std::to_string(s.tune_rounds));
  if (const char* v = std::getenv("PYWGTRAIN_GEMM_F16_FMA"); v && *v) {
    if (std::string(v) != "0" && std::string(v) != "1")
      throw ArgumentError(std::string("PYWGTRAIN_GEMM_F16_FMA must be 0 or 1, got '") + v + "'");
    s.f16_fma = std::string(v) == "1";
  }
  return s;
}

}  // namespace pwt
