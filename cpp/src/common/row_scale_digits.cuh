// Token digits of rows quantized to FP8 by each row's own (dynamic) scale, W4AFP8's per-row activation scales
// (issue 47), made where the rows are written: stages/expand_rows.cu's and stages/fc1_activation.cu's per-row digits
// kernels. A block takes a row: warp w holds groups w, w + warps, ... (at most kRowDigitsGroupsPerWarp), lane l k
// 4l .. 4l + 3 of each, as the quantization sees them (fp8_quantize.cuh: the 16-bit value, times the pre-quant scale in
// fp32); the row's amax over the block (fp8::block_max), its scale fp8::dynamic_scale(amax); then each group's record
// (token_digits.cuh) of the values quantized by that scale and dequantized, rounded to T: the bytes
// mb_expand_rows_fp8_dequantized / mb_fc1_activation_fp8_dequantized (per-row scale) then mb_token_digits write, in
// one launch where those take two and a round trip of the 16-bit rows.
#pragma once

#include "common/fp8_quantize.cuh"
#include "common/token_digits.cuh"

namespace mb {

constexpr int kRowDigitsMaxWarps = 32;
constexpr int kRowDigitsGroupsPerWarp = 4;
constexpr int64_t kRowDigitsMaxCols = int64_t{kRowDigitsMaxWarps} * kRowDigitsGroupsPerWarp * kDigitGroup;  // 16384

// The block of a row of `cols` values: a warp a 128-column group, at most kRowDigitsMaxWarps warps.
inline int row_digits_threads(int64_t cols) {
  const int64_t groups = digit_groups(cols);
  return 32 * static_cast<int>(groups < kRowDigitsMaxWarps ? groups : kRowDigitsMaxWarps);
}

// The checks the per-row digits' writers add to check_digits_rows: no static scale beside the per-row one, and rows
// within the block's kRowDigitsMaxCols columns.
inline mb_status check_row_scale_digits(const char* who, const char* name, int64_t cols, const float* static_scale) {
  MB_REQUIRE(static_scale == nullptr, "%s: fp8_row_scale takes no fp8_static_scale (a row's scale is its own)", who);
  MB_REQUIRE(cols <= kRowDigitsMaxCols, "%s: with fp8_row_scale %s must be at most %lld, got %lld", who, name,
             static_cast<long long>(kRowDigitsMaxCols), static_cast<long long>(cols));
  return MB_OK;
}

// Calls f(std::integral_constant<int, G>{}) with the groups a warp holds for rows of `cols` values (1, 2 or 4).
template <typename F>
mb_status by_row_digits_groups(int64_t cols, F&& f) {
  const int64_t per_warp = (digit_groups(cols) + kRowDigitsMaxWarps - 1) / kRowDigitsMaxWarps;
  if (per_warp <= 1) return f(std::integral_constant<int, 1>{});
  if (per_warp <= 2) return f(std::integral_constant<int, 2>{});
  return f(std::integral_constant<int, kRowDigitsGroupsPerWarp>{});
}

// The calling warp's groups of a row of `cols` values (group warp + i * warps in x[i], lane l its k 4l .. 4l + 3):
// load(col, v) writes columns col .. col + 3 as the quantization sees them, called where col < cols; zeros past the
// row. Returns the lane's largest |x|, for fp8::block_max.
template <int G, typename Load>
__device__ __forceinline__ float load_row_groups(int64_t cols, float (&x)[G][4], Load&& load) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < G; ++i) {
    const int64_t col = (warp + i * static_cast<int64_t>(warps)) * kDigitGroup + 4 * lane;
#pragma unroll
    for (int k = 0; k < 4; ++k) x[i][k] = 0.0f;
    if (col >= cols) continue;
    load(col, x[i]);
#pragma unroll
    for (int k = 0; k < 4; ++k) amax = fmaxf(amax, fabsf(x[i][k]));
  }
  return amax;
}

// A group's record from the calling lane's four values x (as the quantization sees them; zeros past the row) by the
// row's scale s (y = 1 / s): each value quantized and dequantized (fp8::dequantized), rounded to T as the 16-bit
// rows store it. Every lane of the warp calls it.
template <typename T>
__device__ __forceinline__ DigitWords row_scaled_digit_words(const float (&x)[4], float s, float y, DigitOrder order) {
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = to_f32(from_f32<T>(fp8::dequantized(x[i], s, y)));
  return digit_words(v, order);
}

// Each of the calling warp's groups (load_row_groups' x) quantized by the row's scale s: store(g, words) with group g's
// record (row_scaled_digit_words), g below `groups`.
template <typename T, int G, typename Store>
__device__ __forceinline__ void store_row_groups(int64_t groups, const float (&x)[G][4], float s, DigitOrder order,
                                                 Store&& store) {
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const float y = __frcp_rn(s);
#pragma unroll
  for (int i = 0; i < G; ++i) {
    const int64_t g = warp + i * static_cast<int64_t>(warps);
    if (g >= groups) break;  // the warp's: g is the same in every lane
    store(g, row_scaled_digit_words<T>(x[i], s, y, order));
  }
}

}  // namespace mb
