// Expand rows: permuted_input[p] = input[t] (* prequant_scale, AWQ's FC1 pre-quant scale, fused
// here so the activations are read once), permuted_weights[p] = topk_weights[e], for every expanded
// row e = t*K + j and its permuted row p = unpermuted_to_permuted[e]. Each thread moves 16-byte
// vectors when the row length and the pointers allow it (VEC > 1), else single elements.
// A warp owns a (token, column chunk) unit: each lane loads all of its vectors of the chunk (up to
// kBatch, lane-strided so every load is a coalesced 512-byte warp access), scales them once, and
// stores them into each of the token's K permuted rows. At prefill a chunk is the whole row (up to
// 32 * kBatch vectors); when the tokens are few (decode), mb::stage_launch() narrows the chunks so
// that the copy still spreads over the SMs, and blockIdx.z splits a token's K rows among warps.
// Reading each token's row once and storing it K times (not a warp per permuted row, which would
// read every input row K times) keeps this bandwidth-bound copy at one read per token. The stores
// stay plain: inside the layer the evict-first ones (mb::streams_past_l2) are slower.
// zero_out (the [T, H] output that GEMM2's finalize epilogue accumulates into) is zeroed here, each
// token's row by the warps of its unit, so the layer needs no separate memset launch before GEMM2. The
// layer passes it here after the fused map build only; past 256 tokens the three-step map build zeroes
// the output beside its scans (routing_prologue_three_step.cu), off this bandwidth-bound copy.
//
// FP8 (issue 46): mb_expand_rows_fp8 writes the permuted rows as e4m3 bytes and scales
// (common/fp8_quantize.cuh's rule), a block per token: the block quantizes the token's row once (one read,
// one amax) and stores its bytes and scales into each of the token's K permuted rows; at decode sizes
// blockIdx.z splits the K rows among blocks, each of which recomputes the row's scale (an L2 read). The
// block reads and quantizes its token's row before it waits on its predecessor (the map build), and waits at its
// first store or map read (PermutedRows::maps_ready): the layer's rows were written before the map build, which
// waited for them before its trigger (common.cuh, chain_start), and the read no longer queues behind the decode
// GEMM1's early weight loads, which start once this kernel has waited (1-2 us less a decode layer on an H200,
// docs/performance.md). W4AFP8 layers (expand_rows=prequant_fused) pass the AWQ FC1 pre-quant scale, which
// multiplies each element before it is quantized (fp8_quantize.cuh): the seed's pre-quant fusion, the scaled row
// never stored in 16 bits. Rows of at most 4096 columns without a pre-quant scale may take a warp per token instead
// (expand_rows_fp8_warp_kernel: no barrier, fewer instructions an element, the same bytes), where the call's step
// tactic says so (mb_step_tactic: warp_rows, the plan's past a few permuted rows an SM; block_rows the block kernel).
// The unfused alternative, mb_expand_rows_fp8_prequantized, copies rows mb_quantize_fp8
// already quantized: a block per token, each thread holding kBatch 16-byte pieces of the row and storing them K
// times.
//
// W4AFP8 (issue 47), whose GEMMs are W4A16's on 16-bit rows: mb_expand_rows_fp8_dequantized stores each row as the
// 16-bit values of its FP8 quantization (fp8_quantize.cuh, dequantized), the pre-quant product and the quantization
// those of mb_expand_rows_fp8. By a static scale through the 16-bit expansion's kernel (the quantization of an element
// needs no other element's); by each row's dynamic scale through mb_expand_rows_fp8's kernels, whose destinations
// (fp8::OutRow) then store the values instead of the bytes and no scales.
//
// Token digits (issue 47): mb_expand_rows_digits writes the permuted rows as the weight-only decode GEMM's token
// digits (common/token_digits.cuh) where GEMM1 runs the digits tile, instead of 16-bit rows that a digits step
// would then read back and split (one launch and one round trip of the rows fewer). A warp per (token, 128-column
// group): it reads the group's 128 values (times the pre-quant scale, rounded to dtype as the 16-bit expansion stores
// them), computes the group's record once, and stores it into each of the token's K permuted rows: the bytes
// mb_expand_rows then mb_token_digits write. With an FP8 static scale (W4AFP8) the group's values are the ones
// mb_expand_rows_fp8_dequantized writes: the bytes it then mb_token_digits write. With each row's own FP8 scale
// (fp8_row_scale) a block per token (common/row_scale_digits.cuh): the bytes mb_expand_rows_fp8_dequantized by row
// scales then mb_token_digits write. As the FP8 expansion, a warp reads its first group and computes its record (a
// block its row's scale) before it waits on its predecessor (the map build), and waits at its first store or map
// read: the same contract (mb_expand_rows_digits' input complete before its predecessor starts).
#include "common/common.cuh"
#include "common/fp8_quantize.cuh"
#include "common/row_scale_digits.cuh"
#include "common/token_digits.cuh"

namespace {

constexpr int kBatch = 8;         // vectors per lane in flight: 8 x 16 B, a 2048-wide bf16 row per warp

// FP8: the rows quantized by fp8_scale (a device scalar) and stored dequantized (fp8::dequantized), the pre-quant
// product taken in fp32 as the FP8 expansion takes it, not rounded to T first.
template <typename T, int VEC, bool SCALE, bool FP8>
__global__ void __launch_bounds__(mb::kStageThreads)
expand_rows_kernel(const T* __restrict__ input, const int32_t* __restrict__ unpermuted_to_permuted,
                   const float* __restrict__ topk_weights, const float* __restrict__ prequant_scale,
                   const float* __restrict__ fp8_scale, int num_tokens, int hidden, int top_k, int vpl,
                   int64_t chunks, T* __restrict__ permuted_input, float* __restrict__ permuted_weights,
                   T* __restrict__ zero_out) {
  using R = mb::Raw<T, VEC>;
  // After the wait, a decode GEMM1 may start loading its weights; it waits for these rows
  // (mb::launch_after_trigger, mb::chain_start).
  mb::chain_start();
  const int lane = threadIdx.x % 32;
  const int64_t nvec = hidden / VEC;
  // Warps stride over the tokens, blockIdx.y over a row's column chunks.
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * mb::kStageWarps + threadIdx.x / 32; t < num_tokens;
       t += static_cast<int64_t>(gridDim.x) * mb::kStageWarps) {
    const int64_t e0 = t * top_k;
    if (blockIdx.y == 0 && blockIdx.z == 0) {
      for (int j = lane; j < top_k; j += 32) permuted_weights[unpermuted_to_permuted[e0 + j]] = topk_weights[e0 + j];
    }
    const R* src = reinterpret_cast<const R*>(input + t * hidden);
    R* zero = zero_out != nullptr && blockIdx.z == 0 ? reinterpret_cast<R*>(zero_out + t * hidden) : nullptr;
    for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
      const int64_t v0 = c * 32 * vpl + lane;  // this lane's vectors: v0, v0 + 32, ...
      auto mine = [&](int i) { return i < vpl && v0 + i * 32 < nvec; };
      R x[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (mine(i)) x[i] = src[v0 + i * 32];
      }
      if (zero != nullptr) {
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          if (mine(i)) zero[v0 + i * 32] = R{};
        }
      }
      if constexpr (SCALE || FP8) {
        const float q = FP8 ? *fp8_scale : 1.0f, y = FP8 ? __frcp_rn(q) : 1.0f;
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          if (!mine(i)) continue;
          float f[VEC], s[VEC];
          if constexpr (SCALE) mb::load_f32<float, VEC>(prequant_scale + (v0 + i * 32) * VEC, s);
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            f[k] = mb::raw_f32<T>(x[i], k);
            if constexpr (SCALE) f[k] = __fmul_rn(f[k], s[k]);
            if constexpr (FP8) f[k] = mb::fp8::dequantized(f[k], q, y);
          }
          x[i] = mb::raw_from_f32<T, VEC>(f);
        }
      }
      // The token's permuted rows (this block's share of them, blockIdx.z), 32 at a time: lane jj
      // loads slot j0 + jj's, then shuffles.
      for (int j0 = 0; j0 < top_k; j0 += 32) {
        const int p_l = j0 + lane < top_k ? unpermuted_to_permuted[e0 + j0 + lane] : 0;
        const int n = top_k - j0 < 32 ? top_k - j0 : 32;
        for (int jj = blockIdx.z; jj < n; jj += gridDim.z) {
          const int64_t p = __shfl_sync(0xffffffffu, p_l, jj);
          R* dst = reinterpret_cast<R*>(permuted_input + p * hidden);
#pragma unroll
          for (int i = 0; i < kBatch; ++i) {
            if (mine(i)) dst[v0 + i * 32] = x[i];  // the bits, no conversion
          }
        }
      }
    }
  }
}

// A warp per (token t, group g) item, warps striding over the items; zero_out's row t, group g zeroed by the same warp.
constexpr int kDigitWarps = 8;

// FP8: the values quantized by fp8_scale and stored dequantized first, as mb_expand_rows_fp8_dequantized writes them.
template <typename T, bool SCALE, bool FP8>
__global__ void __launch_bounds__(kDigitWarps * 32)
expand_rows_digits_kernel(const T* __restrict__ input, const int32_t* __restrict__ unpermuted_to_permuted,
                          const float* __restrict__ topk_weights, const float* __restrict__ prequant_scale,
                          const float* __restrict__ fp8_scale, int num_tokens, int hidden, int top_k,
                          mb::DigitOrder order, uint8_t* __restrict__ permuted_digits,
                          float* __restrict__ permuted_weights,
                          T* __restrict__ zero_out) {
  const float q8 = FP8 ? *fp8_scale : 1.0f, y8 = FP8 ? __frcp_rn(q8) : 1.0f;
  const int lane = threadIdx.x & 31;
  const int64_t groups = mb::digit_groups(hidden), items = static_cast<int64_t>(num_tokens) * groups;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kDigitWarps;
  bool waited = false;  // each thread waits (and triggers) at its first store or map read, its first group read before
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * kDigitWarps + (threadIdx.x >> 5); it < items; it += warps) {
    const int64_t t = it / groups, g = it - t * groups;
    const int64_t col = g * mb::kDigitGroup + 4 * lane;
    float x[4] = {0.f, 0.f, 0.f, 0.f};  // zeros past a half group at the end of the row
    if (col < hidden) {
      const uint2 raw = *reinterpret_cast<const uint2*>(input + t * hidden + col);
      const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < 4; ++i) x[i] = mb::to_f32(v[i]);
      if constexpr (SCALE && !FP8) {
        const float4 s = *reinterpret_cast<const float4*>(prequant_scale + col);
        const float f[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) x[i] = mb::to_f32(mb::from_f32<T>(x[i] * f[i]));  // as mb_expand_rows stores it
      }
      if constexpr (FP8) {  // as mb_expand_rows_fp8_dequantized stores it
        float f[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        if constexpr (SCALE) {
          const float4 s = *reinterpret_cast<const float4*>(prequant_scale + col);
          f[0] = s.x, f[1] = s.y, f[2] = s.z, f[3] = s.w;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          x[i] = mb::to_f32(mb::from_f32<T>(mb::fp8::dequantized(__fmul_rn(x[i], f[i]), q8, y8)));
        }
      }
    }
    const mb::DigitWords w = mb::digit_words(x, order);
    if (!waited) {
      mb::chain_start();
      waited = true;
    }
    if (zero_out != nullptr && col < hidden) *reinterpret_cast<uint2*>(zero_out + t * hidden + col) = uint2{0u, 0u};
    const int64_t e0 = t * top_k;
    // The token's permuted rows, 32 at a time: lane jj loads slot j0 + jj's map (and, group 0, its weight).
    for (int j0 = 0; j0 < top_k; j0 += 32) {
      const int n = top_k - j0 < 32 ? top_k - j0 : 32;
      const int p_l = lane < n ? __ldg(unpermuted_to_permuted + e0 + j0 + lane) : 0;
      if (g == 0 && lane < n) permuted_weights[p_l] = __ldg(topk_weights + e0 + j0 + lane);
      for (int jj = 0; jj < n; ++jj) {
        const int64_t p = __shfl_sync(0xffffffffu, p_l, jj);
        mb::store_digit_words(w, permuted_digits + (p * groups + g) * static_cast<int64_t>(mb::kDigitGroupBytes),
                              order);
      }
    }
  }
  if (!waited) mb::chain_start();  // no group: the trigger still follows a wait
}

// Per-row FP8 scales (W4AFP8 with dynamic activation scales: common/row_scale_digits.cuh): a block per token t,
// blocks striding over the tokens; its row's groups (times the pre-quant scale in fp32, as mb_expand_rows_fp8 takes
// them) read before the wait, the row's amax over the block, then each warp's groups' records stored into each of the
// token's K permuted rows, zero_out's row zeroed, the top-k weights by warp 0.
template <typename T, bool SCALE, int G>
__global__ void __launch_bounds__(mb::kRowDigitsMaxWarps * 32)
expand_rows_digits_row_scale_kernel(const T* __restrict__ input, const int32_t* __restrict__ unpermuted_to_permuted,
                                    const float* __restrict__ topk_weights, const float* __restrict__ prequant_scale,
                                    int num_tokens, int hidden, int top_k, mb::DigitOrder order,
                                    uint8_t* __restrict__ permuted_digits, float* __restrict__ permuted_weights,
                                    T* __restrict__ zero_out) {
  const int lane = threadIdx.x & 31;
  const int64_t groups = mb::digit_groups(hidden);
  bool waited = false;  // each thread waits (and triggers) after its first row's reads, before its first store
  for (int64_t t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    float x[G][4];
    const float amax = mb::load_row_groups<G>(hidden, x, [&](int64_t col, float (&v)[4]) {
      const uint2 raw = *reinterpret_cast<const uint2*>(input + t * hidden + col);
      const T* e = reinterpret_cast<const T*>(&raw);
      float s[4] = {1.0f, 1.0f, 1.0f, 1.0f};
      if constexpr (SCALE) mb::load_f32<float, 4>(prequant_scale + col, s);
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = __fmul_rn(mb::to_f32(e[k]), s[k]);
    });
    const float s = mb::fp8::dynamic_scale(mb::fp8::block_max(amax));
    if (!waited) {
      mb::chain_start();
      waited = true;
    }
    const int64_t e0 = t * top_k;
    if (threadIdx.x < 32) {
      for (int j = lane; j < top_k; j += 32) permuted_weights[unpermuted_to_permuted[e0 + j]] = topk_weights[e0 + j];
    }
    mb::store_row_groups<T, G>(groups, x, s, order, [&](int64_t g, const mb::DigitWords& w) {
      const int64_t col = g * mb::kDigitGroup + 4 * lane;
      if (zero_out != nullptr && col < hidden) *reinterpret_cast<uint2*>(zero_out + t * hidden + col) = uint2{0u, 0u};
      // The token's permuted rows, 32 at a time: lane jj loads slot j0 + jj's map, then shuffles it.
      for (int j0 = 0; j0 < top_k; j0 += 32) {
        const int n = top_k - j0 < 32 ? top_k - j0 : 32;
        const int p_l = lane < n ? __ldg(unpermuted_to_permuted + e0 + j0 + lane) : 0;
        for (int jj = 0; jj < n; ++jj) {
          const int64_t p = __shfl_sync(0xffffffffu, p_l, jj);
          mb::store_digit_words(w, permuted_digits + (p * groups + g) * static_cast<int64_t>(mb::kDigitGroupBytes),
                                order);
        }
      }
    });
  }
  if (!waited) mb::chain_start();  // no token: the trigger still follows a wait
}

// zero_out is zeroed while other warps may still read input rows: the two must not overlap.
mb_status check_disjoint(const char* who, const void* input, size_t input_bytes, const void* zero_out,
                         size_t zero_bytes) {
  const auto in0 = reinterpret_cast<uintptr_t>(input), out0 = reinterpret_cast<uintptr_t>(zero_out);
  MB_REQUIRE(out0 + zero_bytes <= in0 || in0 + input_bytes <= out0, "%s: zero_out must not overlap input", who);
  return MB_OK;
}

// ---- FP8 (issue 46) ------------------------------------------------------------------------------

namespace fp8 = mb::fp8;

// blockIdx.z's share of a token's K permuted rows: z splits them among blocks while tokens * warps per
// token leave fewer than mb::kMinStageWarps warps (decode sizes).
unsigned copy_split(int num_tokens, int threads, int top_k) {
  const bool few = static_cast<int64_t>(num_tokens) * (threads / 32) < mb::kMinStageWarps;
  return static_cast<unsigned>(few ? (top_k < 32 ? top_k : 32) : 1);
}

// The destination of a token's quantized row: its permuted rows of this block's share (j = blockIdx.z,
// + gridDim.z, ...), e4m3 with their scales or (kDequantized) 16-bit (fp8::OutRow), and (block z 0) the token's
// zero_out row.
template <typename T, bool kDequantized>
struct PermutedRows {
  const int32_t* unpermuted_to_permuted;
  int64_t e0;  // the token's first expanded row
  int top_k;
  int64_t cols, scale_cols;
  bool whole;
  void* rows;
  float* scales;
  T* zero;       // the token's zero_out row, or null
  bool* waited;  // whether the calling thread has waited for the predecessor (which wrote the maps)
  // The first write (or map read) of a thread waits: the token's row was read before (see the file comment).
  __device__ __forceinline__ void maps_ready() const {
    if (!*waited) {
      mb::chain_start();
      *waited = true;
    }
  }
  __device__ __forceinline__ void store(int64_t t0, const fp8::Bytes (&q)[fp8::kUnits],
                                        const float (&s)[fp8::kUnits]) const {
    maps_ready();
    const int64_t units = (cols + fp8::kVec - 1) / fp8::kVec;
    if (zero != nullptr) {
#pragma unroll
      for (int i = 0; i < fp8::kUnits; ++i) {
        if (fp8::unit_index(t0, i) < units) fp8::zero_unit<T>(zero, fp8::unit_index(t0, i), cols, whole);
      }
    }
    for (int j = blockIdx.z; j < top_k; j += gridDim.z) {
      const fp8::OutRow<T, kDequantized> dst(rows, scales, __ldg(unpermuted_to_permuted + e0 + j), cols, scale_cols);
#pragma unroll
      for (int i = 0; i < fp8::kUnits; ++i) {
        if (fp8::unit_index(t0, i) < units) dst.unit(fp8::unit_index(t0, i), cols, whole, q[i], s[i]);
      }
    }
  }
  __device__ __forceinline__ void scale(int64_t g, float s) const {
    if constexpr (!kDequantized) {
      maps_ready();
      for (int j = blockIdx.z; j < top_k; j += gridDim.z) {
        scales[static_cast<int64_t>(__ldg(unpermuted_to_permuted + e0 + j)) * scale_cols + g] = s;
      }
    }
  }
};

template <typename T, bool kDequantized>
__global__ void __launch_bounds__(fp8::kMaxThreads)
expand_rows_fp8_kernel(const T* __restrict__ input, const int32_t* __restrict__ unpermuted_to_permuted,
                       const float* __restrict__ topk_weights, const float* __restrict__ prequant_scale,
                       int num_tokens, int hidden, int top_k, fp8::Mode mode,
                       bool whole, const float* __restrict__ static_scale, int64_t scale_cols,
                       void* __restrict__ permuted_input, float* __restrict__ permuted_scales,
                       float* __restrict__ permuted_weights, T* __restrict__ zero_out) {
  bool waited = false;
  for (int64_t t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    const int64_t e0 = t * top_k;
    fp8::RowSource<T> src{input + t * hidden, hidden, whole};
    const PermutedRows<T, kDequantized> dst{
        unpermuted_to_permuted, e0, top_k, hidden, scale_cols, whole, permuted_input, permuted_scales,
        zero_out != nullptr && blockIdx.z == 0 ? zero_out + t * hidden : nullptr, &waited};
    fp8::quantize_row<T>(src, dst, hidden, mode, static_scale, prequant_scale, whole);
    if (blockIdx.z == 0) {
      dst.maps_ready();
      for (int j = threadIdx.x; j < top_k; j += blockDim.x) {
        permuted_weights[unpermuted_to_permuted[e0 + j]] = topk_weights[e0 + j];
      }
    }
  }
}

// Tokens of at most fp8::kWarpRowMaxPerLane * 32 whole units (4096 columns) without a pre-quant scale, where the plan
// says so (warp_rows: prefill): a warp per token, its units in the lanes' registers (unit lane + 32 i in lane `lane`),
// the row's amax (or each 128-column group's: 16 lanes) by shuffles, the scale's reciprocal once a row (a group), a
// unit's amax on its packed 16-bit values (fp8::quantize_unit_by, fp8::unit_amax_packed), then its bytes stored into
// each of the token's K permuted rows: no shared memory and no block barrier, where the block-per-token kernel meets
// two barriers a token, holds one row a block and spends fp8::quantize_unit's per-element pre-quant multiplies and
// reciprocals (the expansion ran at 1.7-3.0 TB/s at 4096 tokens on an H200). The same bytes. Each warp reads its first
// token's row before it waits on its predecessor (the map build), as the block kernel does.
template <typename T, int kPerLane, bool kDequantized>
__global__ void __launch_bounds__(fp8::kWarpRowThreads)
expand_rows_fp8_warp_kernel(const T* __restrict__ input, const int32_t* __restrict__ unpermuted_to_permuted,
                            const float* __restrict__ topk_weights, int num_tokens, int hidden, int top_k,
                            fp8::Mode mode, const float* __restrict__ static_scale, int64_t scale_cols,
                            void* __restrict__ permuted_input, float* __restrict__ permuted_scales,
                            float* __restrict__ permuted_weights, T* __restrict__ zero_out) {
  constexpr int kWarps = fp8::kWarpRowThreads / 32;
  const int lane = threadIdx.x % 32;
  const int64_t units = hidden / fp8::kVec;
  const float static_s = mode == fp8::kStatic ? *static_scale : 0.0f;
  const float static_y = mode == fp8::kStatic ? __frcp_rn(static_s) : 0.0f;
  bool waited = false;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; t < num_tokens;
       t += static_cast<int64_t>(gridDim.x) * kWarps) {
    uint4 x[kPerLane];
    fp8::load_warp_row(input + t * hidden, units, lane, x);
    // The units' bytes, and the scale each lane stores: the row's (lane 0) or its units' groups' (the group's first
    // lane, group_scale[i]).
    fp8::Bytes q[kPerLane];
    float group_scale[kPerLane];
    float row_s = static_s;
    if (mode == fp8::kPerRow) {
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) amax = fmaxf(amax, fp8::unit_amax_packed<T>(x[i]));  // zeros past the row
      amax = mb::lanes_max(amax);
      row_s = fp8::dynamic_scale(amax);
    }
    const float row_y = mode == fp8::kStatic ? static_y : __frcp_rn(row_s);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (mode == fp8::kPerGroup) {
        // i < kPerLane is the warp's bound, so every lane takes part in the shuffles; a partial last group's amax is
        // its elements' (zeros past the row).
        float g = fp8::unit_amax_packed<T>(x[i]);
        g = mb::lanes_max<fp8::kGroupLanes>(g);
        group_scale[i] = fp8::dynamic_scale(g);
        q[i] = fp8::quantize_unit_by<T>(x[i], group_scale[i], __frcp_rn(group_scale[i]));
      } else {
        q[i] = fp8::quantize_unit_by<T>(x[i], row_s, row_y);
      }
    }
    if (!waited) {  // the maps, the top-k weights and zero_out are the predecessors' (see the file comment)
      mb::chain_start();
      waited = true;
    }
    const int64_t e0 = t * top_k;
    if (zero_out != nullptr) {
      uint4* zero = reinterpret_cast<uint4*>(zero_out + t * hidden);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        if (lane + 32 * i < units) zero[lane + 32 * i] = uint4{0u, 0u, 0u, 0u};
      }
    }
    // The token's permuted rows, 32 at a time: lane jj loads slot j0 + jj's map and weight, then shuffles the map.
    for (int j0 = 0; j0 < top_k; j0 += 32) {
      const int n = top_k - j0 < 32 ? top_k - j0 : 32;
      const int p_l = lane < n ? __ldg(unpermuted_to_permuted + e0 + j0 + lane) : 0;
      if (lane < n) permuted_weights[p_l] = __ldg(topk_weights + e0 + j0 + lane);
      for (int jj = 0; jj < n; ++jj) {
        const int64_t p = __shfl_sync(0xffffffffu, p_l, jj);
        const fp8::OutRow<T, kDequantized> dst(permuted_input, permuted_scales, p, hidden, scale_cols);
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          const int64_t u = lane + 32 * i;
          if (u >= units) continue;
          dst.unit(u, hidden, true, q[i], mode == fp8::kPerGroup ? group_scale[i] : row_s);
          if (mode == fp8::kPerGroup && u % fp8::kGroupLanes == 0) dst.scale(u / fp8::kGroupLanes, group_scale[i]);
        }
        if (mode != fp8::kPerGroup && lane == 0) dst.scale(0, row_s);
      }
    }
  }
}

// Launches the warp-per-token kernel (MB_STEP_WARP_ROWS) where it takes the call (fp8::whole_units rows of at most
// 4096 columns, no pre-quant scale; refused elsewhere): a persistent grid of what fits on the GPU at once, or fewer
// blocks where the tokens need fewer. The planner gives it from 6 permuted rows an SM
// (planner/tactics/steps.py); fewer keep the block kernel, whose several warps a token keep more loads in flight:
// H200, bench/layer_steps_probe.py, the expansion and its predecessor at 256 tokens, Mixtral-8x7B (top-2, 512 rows) 8.0
// us on the block kernel against 10.3 on this one, GPT-OSS-20B (1024 rows) 11.2 against 10.4, DeepSeek-V2-Lite (1536)
// 13.7 against 11.1, Qwen3-30B-A3B (2048) 16.7 against 13.9; at 4096 tokens 10-30% less on every bench shape.
template <typename T, bool kDequantized>
mb_status launch_warp_tokens(const char* who, const T* input, const int32_t* unpermuted_to_permuted,
                             const float* topk_weights, const float* prequant_scale, int num_tokens, int hidden,
                             int top_k, fp8::Mode mode, bool whole, const float* static_scale, int64_t scale_cols,
                             void* permuted_input, float* permuted_scales, float* permuted_weights, T* zero_out,
                             cudaStream_t stream) {
  const int64_t per_lane = (hidden / fp8::kVec + 31) / 32;
  if (!whole || prequant_scale != nullptr || per_lane > fp8::kWarpRowMaxPerLane)
    return mb::fail(MB_ERR_UNSUPPORTED,
                    "%s: tactic warp_rows takes whole units, no pre-quant scale and rows of at most %d columns "
                    "(hidden %d)", who, fp8::kWarpRowMaxPerLane * 32 * fp8::kVec, hidden);
  auto go = [&](auto kernel) -> mb_status {
    constexpr int kWarps = fp8::kWarpRowThreads / 32;
    const int64_t blocks = (num_tokens + kWarps - 1) / kWarps;
    const int64_t resident = mb::resident_blocks(kernel, fp8::kWarpRowThreads, 0);
    return mb::check_launch("expand_rows_fp8_warp_kernel", mb::launch_after_trigger(
        kernel, dim3(static_cast<unsigned>(blocks < resident ? blocks : resident)), dim3(fp8::kWarpRowThreads), stream,
        input, unpermuted_to_permuted, topk_weights, num_tokens, hidden, top_k, mode, static_scale, scale_cols,
        permuted_input, permuted_scales, permuted_weights, zero_out));
  };
  if (per_lane <= 4) return go(expand_rows_fp8_warp_kernel<T, 4, kDequantized>);
  if (per_lane <= 8) return go(expand_rows_fp8_warp_kernel<T, 8, kDequantized>);
  if (per_lane <= 12) return go(expand_rows_fp8_warp_kernel<T, 12, kDequantized>);
  return go(expand_rows_fp8_warp_kernel<T, fp8::kWarpRowMaxPerLane, kDequantized>);
}

constexpr int kPrequantThreads = 256;

// Rows of `hidden` e4m3 bytes moved in pieces of W bytes (16, or 1 where the row length or a pointer does
// not allow 16); zero_out's row is zero_row_bytes long (a multiple of W).
template <int W>
__global__ void __launch_bounds__(kPrequantThreads)
expand_rows_fp8_prequantized_kernel(const uint8_t* __restrict__ input, const float* __restrict__ input_scales,
                                    int scale_cols, const int32_t* __restrict__ unpermuted_to_permuted,
                                    const float* __restrict__ topk_weights, int num_tokens, int hidden, int top_k,
                                    uint8_t* __restrict__ permuted_input, float* __restrict__ permuted_scales,
                                    float* __restrict__ permuted_weights, uint8_t* __restrict__ zero_out,
                                    int64_t zero_row_bytes) {
  using P = std::conditional_t<W == 16, uint4, uint8_t>;
  mb::chain_start();
  const int64_t pieces = hidden / W;
  for (int64_t t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    const int64_t e0 = t * top_k;
    if (blockIdx.z == 0) {
      for (int j = threadIdx.x; j < top_k; j += blockDim.x) {
        permuted_weights[unpermuted_to_permuted[e0 + j]] = topk_weights[e0 + j];
      }
      if (zero_out != nullptr) {
        P* zero = reinterpret_cast<P*>(zero_out + t * zero_row_bytes);
        for (int64_t c = threadIdx.x; c < zero_row_bytes / W; c += blockDim.x) zero[c] = P{};
      }
    }
    const P* src = reinterpret_cast<const P*>(input + t * hidden);
    for (int64_t t0 = 0; t0 < pieces; t0 += static_cast<int64_t>(kBatch) * blockDim.x) {
      P v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int64_t c = t0 + static_cast<int64_t>(i) * blockDim.x + threadIdx.x;
        if (c < pieces) v[i] = src[c];
      }
      for (int j = blockIdx.z; j < top_k; j += gridDim.z) {
        P* dst = reinterpret_cast<P*>(permuted_input + static_cast<int64_t>(__ldg(unpermuted_to_permuted + e0 + j)) *
                                                       hidden);
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const int64_t c = t0 + static_cast<int64_t>(i) * blockDim.x + threadIdx.x;
          if (c < pieces) dst[c] = v[i];
        }
      }
    }
    for (int j = blockIdx.z; j < top_k; j += gridDim.z) {
      float* dst = permuted_scales + static_cast<int64_t>(__ldg(unpermuted_to_permuted + e0 + j)) * scale_cols;
      for (int g = threadIdx.x; g < scale_cols; g += blockDim.x) dst[g] = input_scales[t * scale_cols + g];
    }
  }
}

// mb_expand_rows, and with fp8_scale non-NULL mb_expand_rows_fp8_dequantized.
mb_status expand_rows(const char* who, const void* input, int dtype, const int32_t* unpermuted_to_permuted,
                      const float* topk_weights, const float* prequant_scale, const float* fp8_scale, int num_tokens,
                      int hidden, int top_k, void* permuted_input, float* permuted_weights, void* zero_out,
                      cudaStream_t stream) {
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(hidden >= 1, "%s: hidden must be >= 1, got %d", who, hidden);
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  const int64_t rows = static_cast<int64_t>(num_tokens) * top_k;
  if (rows == 0) return mb::dispatch_dtype(dtype, who, [](auto) { return MB_OK; });
  MB_REQUIRE(input && unpermuted_to_permuted && topk_weights && permuted_input && permuted_weights,
             "%s: input, unpermuted_to_permuted, topk_weights, permuted_input and permuted_weights must be "
             "non-NULL", who);
  if (zero_out != nullptr) {
    const size_t bytes = static_cast<size_t>(num_tokens) * hidden * mb::dtype_size(dtype);
    MB_TRY(check_disjoint(who, input, bytes, zero_out, bytes));
  }
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int vec = mb::vec_width<T>(hidden, {input, permuted_input, prequant_scale, zero_out});
    const int64_t nvec = hidden / vec;
    mb::StageLaunch shape = mb::stage_launch(num_tokens, nvec, kBatch);
    // Decode sizes: too few (token, chunk) units to spread over the SMs, so each of a token's K
    // permuted rows gets its own warps, as in a per-row copy.
    if (static_cast<int64_t>(num_tokens) * shape.chunks < mb::kMinStageWarps) shape.grid.z = top_k < 32 ? top_k : 32;
    auto launch = [&](auto vec_const, auto scale_const, auto fp8_const) {
      constexpr int VEC = decltype(vec_const)::value;
      constexpr bool SCALE = decltype(scale_const)::value, FP8 = decltype(fp8_const)::value;
      return mb::check_launch("expand_rows_kernel", mb::launch_after_trigger(
          expand_rows_kernel<T, VEC, SCALE, FP8>, shape.grid, dim3(mb::kStageThreads), stream,
          static_cast<const T*>(input), unpermuted_to_permuted, topk_weights, prequant_scale, fp8_scale, num_tokens,
          hidden, top_k, shape.vpl, shape.chunks, static_cast<T*>(permuted_input), permuted_weights,
          static_cast<T*>(zero_out)));
    };
    constexpr int kWide = 16 / sizeof(T);
    using Wide = std::integral_constant<int, kWide>;
    using One = std::integral_constant<int, 1>;
    auto widths = [&](auto scale_const, auto fp8_const) {
      return vec == kWide ? launch(Wide{}, scale_const, fp8_const) : launch(One{}, scale_const, fp8_const);
    };
    if (fp8_scale) {
      return prequant_scale ? widths(std::true_type{}, std::true_type{}) : widths(std::false_type{}, std::true_type{});
    }
    return prequant_scale ? widths(std::true_type{}, std::false_type{}) : widths(std::false_type{}, std::false_type{});
  });
}

// The expansion's step tactics: block_rows (a block a token) or warp_rows (a warp a token).
mb_status check_tactic(const char* who, int tactic) {
  MB_REQUIRE(tactic == MB_STEP_BLOCK_ROWS || tactic == MB_STEP_WARP_ROWS,
             "%s: tactic %d is not one of the expansion's (block_rows 0, warp_rows 1)", who, tactic);
  return MB_OK;
}

// mb_expand_rows_fp8, and (kDequantized: the rows stored as 16-bit values, no scales) mb_expand_rows_fp8_dequantized
// with per-row scales.
template <bool kDequantized>
mb_status expand_rows_quantized(const char* who, const void* input, int dtype, const int32_t* unpermuted_to_permuted,
                                const float* topk_weights, const float* prequant_scale, int num_tokens, int hidden,
                                int top_k, const float* static_scale, int group, void* permuted_input,
                                float* permuted_scales, float* permuted_weights, void* zero_out, int tactic,
                                cudaStream_t stream) {
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_TRY(check_tactic(who, tactic));
  MB_REQUIRE(hidden >= 1, "%s: hidden must be >= 1, got %d", who, hidden);
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  fp8::Mode mode;
  MB_TRY(fp8::mode_of(static_scale, group, who, &mode));
  if (num_tokens == 0) return fp8::dispatch_half(dtype, who, [](auto) { return MB_OK; });
  MB_REQUIRE(input && unpermuted_to_permuted && topk_weights && permuted_input && permuted_weights,
             "%s: input, unpermuted_to_permuted, topk_weights, permuted_input and permuted_weights must be non-NULL",
             who);
  MB_REQUIRE(kDequantized || permuted_scales, "%s: permuted_scales must be non-NULL", who);
  if (zero_out != nullptr) {
    const size_t bytes = static_cast<size_t>(num_tokens) * hidden * mb::dtype_size(dtype);
    MB_TRY(check_disjoint(who, input, bytes, zero_out, bytes));
  }
  return fp8::dispatch_half(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool whole = kDequantized
        ? fp8::whole_units(hidden, {input, zero_out, prequant_scale, permuted_input}, {})
        : fp8::whole_units(hidden, {input, zero_out, prequant_scale}, {permuted_input});
    if (tactic == MB_STEP_WARP_ROWS)
      return launch_warp_tokens<T, kDequantized>(who, static_cast<const T*>(input), unpermuted_to_permuted,
                                                 topk_weights, prequant_scale, num_tokens, hidden, top_k, mode, whole,
                                                 static_scale, fp8::scale_cols(mode, hidden), permuted_input,
                                                 permuted_scales, permuted_weights, static_cast<T*>(zero_out), stream);
    const int threads = fp8::row_threads(hidden);
    const dim3 grid(mb::row_grid(num_tokens), 1, copy_split(num_tokens, threads, top_k));
    return mb::check_launch("expand_rows_fp8_kernel", mb::launch_after_trigger(
        expand_rows_fp8_kernel<T, kDequantized>, grid, dim3(threads), stream, static_cast<const T*>(input),
        unpermuted_to_permuted, topk_weights, prequant_scale, num_tokens, hidden, top_k, mode, whole,
        static_scale, fp8::scale_cols(mode, hidden), permuted_input, permuted_scales, permuted_weights,
        static_cast<T*>(zero_out)));
  });
}

}  // namespace

extern "C" mb_status mb_expand_rows(const void* input, int dtype, const int32_t* unpermuted_to_permuted,
                                    const float* topk_weights, const float* prequant_scale, int num_tokens,
                                    int hidden, int top_k, void* permuted_input, float* permuted_weights,
                                    void* zero_out, cudaStream_t stream) {
  return expand_rows("mb_expand_rows", input, dtype, unpermuted_to_permuted, topk_weights, prequant_scale, nullptr,
                     num_tokens, hidden, top_k, permuted_input, permuted_weights, zero_out, stream);
}

extern "C" mb_status mb_expand_rows_fp8_dequantized(const void* input, int dtype, const int32_t* unpermuted_to_permuted,
                                                    const float* topk_weights, const float* prequant_scale,
                                                    int num_tokens, int hidden, int top_k, const float* static_scale,
                                                    void* permuted_input, float* permuted_weights, void* zero_out,
                                                    int tactic, cudaStream_t stream) {
  const char* who = "mb_expand_rows_fp8_dequantized";
  if (static_scale == nullptr)
    return expand_rows_quantized<true>(who, input, dtype, unpermuted_to_permuted, topk_weights, prequant_scale,
                                       num_tokens, hidden, top_k, nullptr, 0, permuted_input, nullptr,
                                       permuted_weights, zero_out, tactic, stream);
  MB_TRY(check_tactic(who, tactic));
  if (tactic != MB_STEP_BLOCK_ROWS)
    return mb::fail(MB_ERR_UNSUPPORTED, "%s: with a static scale the 16-bit expansion's kernel runs: tactic "
                    "block_rows (0), got %d", who, tactic);
  return expand_rows(who, input, dtype, unpermuted_to_permuted, topk_weights, prequant_scale, static_scale,
                     num_tokens, hidden, top_k, permuted_input, permuted_weights, zero_out, stream);
}

extern "C" mb_status mb_expand_rows_digits(const void* input, int dtype, const int32_t* unpermuted_to_permuted,
                                           const float* topk_weights, const float* prequant_scale,
                                           const float* fp8_static_scale, int fp8_row_scale, int num_tokens,
                                           int hidden, int top_k, int group, uint8_t* permuted_digits,
                                           float* permuted_weights, void* zero_out, cudaStream_t stream) {
  const char* who = "mb_expand_rows_digits";
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_TRY(mb::check_digits_rows(who, "hidden", hidden, group, dtype));
  if (fp8_row_scale != 0) MB_TRY(mb::check_row_scale_digits(who, "hidden", hidden, fp8_static_scale));
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  if (num_tokens == 0) return MB_OK;
  MB_REQUIRE(input && unpermuted_to_permuted && topk_weights && permuted_digits && permuted_weights,
             "%s: input, unpermuted_to_permuted, topk_weights, permuted_digits and permuted_weights must be non-NULL",
             who);
  auto aligned = [](const void* p, uintptr_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; };
  MB_REQUIRE(aligned(input, 8) && aligned(zero_out, 8) && aligned(prequant_scale, 16) && aligned(permuted_digits, 16),
             "%s: input and zero_out must be 8-byte, prequant_scale and permuted_digits 16-byte aligned", who);
  if (zero_out != nullptr) {
    const size_t bytes = static_cast<size_t>(num_tokens) * hidden * mb::dtype_size(dtype);
    MB_TRY(check_disjoint(who, input, bytes, zero_out, bytes));
  }
  const int64_t items = static_cast<int64_t>(num_tokens) * mb::digit_groups(hidden);
  const unsigned blocks = mb::row_grid((items + kDigitWarps - 1) / kDigitWarps);
  auto launch = [&](auto tag, auto scale_const, auto fp8_const) {
    using T = decltype(tag);
    if (fp8_row_scale != 0) {  // each row its own scale (fp8_static_scale NULL, checked above)
      return mb::by_row_digits_groups(hidden, [&](auto groups_const) {
        return mb::check_launch("expand_rows_digits_row_scale_kernel", mb::launch_after_trigger(
            expand_rows_digits_row_scale_kernel<T, decltype(scale_const)::value, decltype(groups_const)::value>,
            dim3(mb::row_grid(num_tokens)), dim3(mb::row_digits_threads(hidden)), stream,
            static_cast<const T*>(input), unpermuted_to_permuted, topk_weights, prequant_scale, num_tokens, hidden,
            top_k, mb::digit_order(group), permuted_digits, permuted_weights, static_cast<T*>(zero_out)));
      });
    }
    return mb::check_launch("expand_rows_digits_kernel", mb::launch_after_trigger(
        expand_rows_digits_kernel<T, decltype(scale_const)::value, decltype(fp8_const)::value>, dim3(blocks),
        dim3(kDigitWarps * 32), stream, static_cast<const T*>(input), unpermuted_to_permuted, topk_weights,
        prequant_scale, fp8_static_scale, num_tokens, hidden, top_k, mb::digit_order(group), permuted_digits,
        permuted_weights, static_cast<T*>(zero_out)));
  };
  auto by_fp8 = [&](auto tag, auto scale_const) {
    return fp8_static_scale ? launch(tag, scale_const, std::true_type{}) : launch(tag, scale_const, std::false_type{});
  };
  auto by_scale = [&](auto tag) {
    return prequant_scale ? by_fp8(tag, std::true_type{}) : by_fp8(tag, std::false_type{});
  };
  return dtype == MB_FP16 ? by_scale(__half{}) : by_scale(__nv_bfloat16{});
}

// ---- FP8 (issue 46) ------------------------------------------------------------------------------

extern "C" mb_status mb_expand_rows_fp8(const void* input, int dtype, const int32_t* unpermuted_to_permuted,
                                        const float* topk_weights, const float* prequant_scale, int num_tokens,
                                        int hidden, int top_k,
                                        const float* static_scale, int group, uint8_t* permuted_input,
                                        float* permuted_scales, float* permuted_weights, void* zero_out,
                                        int tactic, cudaStream_t stream) {
  return expand_rows_quantized<false>("mb_expand_rows_fp8", input, dtype, unpermuted_to_permuted, topk_weights,
                                      prequant_scale, num_tokens, hidden, top_k, static_scale, group, permuted_input,
                                      permuted_scales, permuted_weights, zero_out, tactic, stream);
}

extern "C" mb_status mb_expand_rows_fp8_prequantized(const uint8_t* input_fp8, const float* input_scales,
                                                     int scale_cols, const int32_t* unpermuted_to_permuted,
                                                     const float* topk_weights, int num_tokens, int hidden,
                                                     int top_k, uint8_t* permuted_input, float* permuted_scales,
                                                     float* permuted_weights, void* zero_out, int zero_dtype,
                                                     cudaStream_t stream) {
  const char* who = "mb_expand_rows_fp8_prequantized";
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(hidden >= 1, "%s: hidden must be >= 1, got %d", who, hidden);
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  const int groups = (hidden + fp8::kGroup - 1) / fp8::kGroup;
  MB_REQUIRE(scale_cols == 1 || scale_cols == groups, "%s: scale_cols must be 1 or ceil(hidden / 128) = %d, got %d",
             who, groups, scale_cols);
  if (zero_out != nullptr) {
    MB_REQUIRE(zero_dtype == MB_FP32 || zero_dtype == MB_FP16 || zero_dtype == MB_BF16,
               "%s: zero_dtype %d is not one of fp32(0), fp16(1), bf16(2)", who, zero_dtype);
  }
  if (num_tokens == 0) return MB_OK;
  MB_REQUIRE(input_fp8 && input_scales && unpermuted_to_permuted && topk_weights && permuted_input &&
             permuted_scales && permuted_weights, "%s: input_fp8, input_scales, unpermuted_to_permuted, topk_weights, "
             "permuted_input, permuted_scales and permuted_weights must be non-NULL", who);
  const int64_t zero_row_bytes = zero_out != nullptr ? static_cast<int64_t>(hidden) * mb::dtype_size(zero_dtype) : 0;
  if (zero_out != nullptr) {
    MB_TRY(check_disjoint(who, input_fp8, static_cast<size_t>(num_tokens) * hidden, zero_out,
                          static_cast<size_t>(num_tokens) * zero_row_bytes));
  }
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool wide = hidden % 16 == 0 && aligned(input_fp8) && aligned(permuted_input) && aligned(zero_out);
  const int64_t pieces = wide ? hidden / 16 : hidden;
  const int64_t warps = (pieces + 32 * kBatch - 1) / (32 * kBatch);
  const int threads = static_cast<int>(warps * 32 < kPrequantThreads ? warps * 32 : kPrequantThreads);
  const dim3 grid(mb::row_grid(num_tokens), 1, copy_split(num_tokens, threads, top_k));
  auto launch = [&](auto kernel) {
    return mb::check_launch("expand_rows_fp8_prequantized_kernel", mb::launch_after_trigger(
        kernel, grid, dim3(threads), stream, input_fp8, input_scales, scale_cols, unpermuted_to_permuted,
        topk_weights, num_tokens, hidden, top_k, permuted_input, permuted_scales, permuted_weights,
        static_cast<uint8_t*>(zero_out), zero_row_bytes));
  };
  return wide ? launch(expand_rows_fp8_prequantized_kernel<16>) : launch(expand_rows_fp8_prequantized_kernel<1>);
}
