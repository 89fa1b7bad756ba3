// FP8 (e4m3) quantization of activation rows, shared by the stage kernels that write an FP8 GEMM's input:
// stages/quantize_fp8.cu (mb_quantize_fp8), stages/expand_rows.cu (mb_expand_rows_fp8) and
// stages/fc1_activation.cu (mb_fc1_activation_fp8). They compute bit for bit what
// moe_build/weights/fp8.py's quantize_rows computes:
//   q = e4m3(x / s), x the fp32 value of an fp16/bf16 element, x / s the IEEE fp32 quotient (quotient() below
//   computes the correctly rounded quotient; no compiler flag changes it), rounded to nearest even and saturated
//   to +-448
//   (cvt.rn.satfinite: what quantize_rows' clamp(-448, 448) and round-to-nearest-even cast give);
//   s the static scale, or dynamic max(amax, 1e-12) / 448 (again an IEEE division), amax the largest |x| of
//   the row (kPerRow) or of its 128-column group (kPerGroup; the last group may be partial).
// With an AWQ pre-quant scale p (fp32 [cols], W4AFP8's GEMM inputs) x is the element times p[c] instead, one fp32
// multiply: the exact product of a 16-bit value and an fp32 one rounded once to fp32, which is what the fp64
// reference's product gives when quantize_rows converts it to fp32 (moe_build/reference.py, _woq_input). Without
// one x is the element itself (the kernels multiply by 1, which changes no value).
// Inputs are finite: for NaN and inf there is no contract (fmaxf skips a NaN in amax, where torch's amax
// propagates it; the sign of a NaN from inf / inf differs between a CPU and a GPU).
//
// A block quantizes a row. Its threads own units of kVec = 8 consecutive elements, moved with one 16-byte
// load and one 8-byte store where the row allows it (`whole`), else element by element (a row length that
// is not a multiple of 8, or unaligned pointers). A tile is kUnits * blockDim.x units: unit
// t0 + i * blockDim.x + threadIdx.x for i < kUnits, so each load instruction of a warp is coalesced, a
// thread has kUnits loads in flight, and a 128-column group is 16 consecutive lanes of one warp (its amax
// is a 4-step shuffle reduction). kPerRow needs the whole row's amax before the first store: the first tile
// (16384 columns at 512 threads) stays in registers across the block reduction, so rows up to that width
// are read once; the units of longer rows past the first tile are read again (from L2) after it.
// The mode and the unit width are arguments, not template parameters: a kernel holds one copy of its
// source's loads and math (the activation kernel's are large, and it has one kernel per activation).
#pragma once

#include <cuda_fp8.h>

#include "common/common.cuh"

namespace mb {
namespace fp8 {

constexpr float kMax = 448.0f;         // largest finite e4m3
constexpr float kAmaxFloor = 1e-12f;   // an all-zero row or group gets this amax, not a zero scale
constexpr int kGroup = 128;            // the per-group scales' column group
constexpr int kVec = 8;                // elements per unit: 16 bytes of fp16/bf16, 8 bytes of e4m3
constexpr int kGroupLanes = kGroup / kVec;  // units (lanes of one warp) per group
constexpr int kUnits = 4;              // units per thread per tile
constexpr int kMaxThreads = 512;

enum Mode { kStatic = 0, kPerRow = 1, kPerGroup = 2 };

// The kernels that quantize a row a warp (stages/expand_rows.cu's, stages/fc1_activation.cu's): their block, and the
// most units a lane holds (16 x 32 units: rows of up to 4096 columns).
constexpr int kWarpRowThreads = 256;
constexpr int kWarpRowMaxPerLane = 16;

// ---- host side --------------------------------------------------------------------------------

// The mode of a call's (static_scale, group); MB_ERR_INVALID_ARGUMENT for a group other than 0 and 128, or a
// static scale with group 128.
inline mb_status mode_of(const float* static_scale, int group, const char* who, Mode* mode) {
  MB_REQUIRE(group == 0 || group == kGroup, "%s: group must be 0 (per row) or 128, got %d", who, group);
  MB_REQUIRE(static_scale == nullptr || group == 0, "%s: a static scale takes group 0, got %d", who, group);
  *mode = static_scale != nullptr ? kStatic : group != 0 ? kPerGroup : kPerRow;
  return MB_OK;
}

// fp32 scales per row: one, or one per 128-column group.
inline int64_t scale_cols(Mode mode, int64_t cols) { return mode == kPerGroup ? (cols + kGroup - 1) / kGroup : 1; }

// Threads per block for rows of `cols` elements: enough for one tile to cover the row, at most kMaxThreads.
inline int row_threads(int64_t cols) {
  const int64_t units = (cols + kVec - 1) / kVec;
  const int64_t threads = (units + kUnits - 1) / kUnits;
  const int64_t warps = (threads + 31) / 32;
  return static_cast<int>(warps * 32 < kMaxThreads ? warps * 32 : kMaxThreads);
}

// Whether rows of `cols` elements move in whole units: cols a multiple of kVec, the fp16/bf16 pointers
// 16-byte aligned and the e4m3 ones 8-byte aligned (NULL pointers ignored).
inline bool whole_units(int64_t cols, std::initializer_list<const void*> in16,
                        std::initializer_list<const void*> out8) {
  if (cols % kVec != 0) return false;
  for (const void* p : in16) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  for (const void* p : out8) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 8 != 0) return false;
  }
  return true;
}

// Calls f(TypeTag<T>{}) for fp16 and bf16; fp32 is MB_ERR_UNSUPPORTED (the FP8 GEMMs read and write
// fp16/bf16 only), anything else MB_ERR_INVALID_ARGUMENT.
template <typename F>
mb_status dispatch_half(int dtype, const char* who, F&& f) {
  switch (dtype) {
    case MB_FP16: return f(TypeTag<__half>{});
    case MB_BF16: return f(TypeTag<__nv_bfloat16>{});
    case MB_FP32: return fail(MB_ERR_UNSUPPORTED, "%s: FP8 quantization takes fp16 or bf16 rows, not fp32", who);
    default: return fail(MB_ERR_INVALID_ARGUMENT, "%s: dtype %d is not one of fp16(1), bf16(2)", who, dtype);
  }
}

// ---- device side ------------------------------------------------------------------------------

// A unit's e4m3 bytes, element k in byte k.
using Bytes = uint2;

// Unit u of tile t0 for the calling thread.
__device__ __forceinline__ int64_t unit_index(int64_t t0, int i) {
  return t0 + static_cast<int64_t>(i) * blockDim.x + threadIdx.x;
}

// Unit u of a row of `cols` elements as its packed bits (zero past cols).
template <typename T>
__device__ __forceinline__ uint4 load_unit(const T* row, int64_t u, int64_t cols, bool whole) {
  if (whole) return *reinterpret_cast<const uint4*>(row + u * kVec);
  Vec<T, kVec> x;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t c = u * kVec + k;
    x.v[k] = c < cols ? row[c] : from_f32<T>(0.0f);
  }
  uint4 r;
  memcpy(&r, &x, sizeof(r));
  return r;
}

// Unit u's bytes into an e4m3 row of `cols` bytes.
__device__ __forceinline__ void store_unit(uint8_t* row, int64_t u, int64_t cols, bool whole, Bytes q) {
  if (whole) {
    *reinterpret_cast<Bytes*>(row + u * kVec) = q;
    return;
  }
  uint8_t b[kVec];
  memcpy(b, &q, sizeof(b));
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if (u * kVec + k < cols) row[u * kVec + k] = b[k];
  }
}

// Zeros for unit u of a row of `cols` elements of T.
template <typename T>
__device__ __forceinline__ void zero_unit(T* row, int64_t u, int64_t cols, bool whole) {
  if (whole) {
    *reinterpret_cast<uint4*>(row + u * kVec) = uint4{0u, 0u, 0u, 0u};
    return;
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if (u * kVec + k < cols) row[u * kVec + k] = from_f32<T>(0.0f);
  }
}

// Unit u's pre-quant scales from `prequant` (fp32 [cols]; 1 past the row's end, where the units are zeros), or ones
// where there is none.
__device__ __forceinline__ void load_prequant(const float* prequant, int64_t u, int64_t cols, bool whole,
                                              float (&p)[kVec]) {
  if (prequant == nullptr || u * kVec >= cols) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) p[k] = 1.0f;
  } else if (whole) {
    const float4 a = *reinterpret_cast<const float4*>(prequant + u * kVec);
    const float4 b = *reinterpret_cast<const float4*>(prequant + u * kVec + 4);
    p[0] = a.x, p[1] = a.y, p[2] = a.z, p[3] = a.w, p[4] = b.x, p[5] = b.y, p[6] = b.z, p[7] = b.w;
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) p[k] = u * kVec + k < cols ? prequant[u * kVec + k] : 1.0f;
  }
}

// Element k of unit x as the quantization sees it: its fp32 value times its pre-quant scale (module comment).
template <typename T>
__device__ __forceinline__ float scaled(uint4 x, int k, const float (&p)[kVec]) {
  return __fmul_rn(raw_f32<T>(x, k), p[k]);
}

template <typename T>
__device__ __forceinline__ float unit_amax(uint4 x, const float (&p)[kVec]) {
  float m = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) m = fmaxf(m, fabsf(scaled<T>(x, k, p)));
  return m;
}

__device__ __forceinline__ float dynamic_scale(float amax) { return __fdiv_rn(fmaxf(amax, kAmaxFloor), kMax); }

// v / s rounded as an IEEE division rounds it, for the quantization (result saturated to +-448, and zero below
// 2^-10), from y = 1 / s correctly rounded: q = |v| * y is within an ulp of |v| / s, and one step q + (|v| - q * s) * y
// with the remainder exact in an fma rounds to |v| / s correctly (Markstein's theorem, e.g. Muller et al.,
// Handbook of Floating-Point Arithmetic, 2nd ed., section 4.7.2), in five instructions where __fdiv_rn takes
// about a dozen with its range checks (the activation kernel is issue-bound at prefill). q is capped at 1024
// first: a quotient past the cap saturates either way, and the step never meets inf - inf. The sign is v's, so
// -0 stays -0. The theorem needs no underflow: only quotients far below e4m3's smallest subnormal underflow,
// and they quantize to a signed zero either way.
__device__ __forceinline__ float quotient(float v, float s, float y) {
  const float q = fminf(__fmul_rn(fabsf(v), y), 1024.0f);
  const float r = __fmaf_rn(-q, s, fabsf(v));
  return copysignf(__fmaf_rn(r, y, q), v);
}

// Two values' e4m3 bytes, x.x's in the low byte: each quotient by s (y = 1 / s) rounded to nearest even and saturated
// to +-448. Every kernel that writes e4m3 activations quantizes through it (the quantize step, and the GEMM epilogues
// that quantize GEMM2's input: gemm/fp8_decode.cu, gemm/sm90_epilogue.cuh), so their bytes are the same.
__device__ __forceinline__ __nv_fp8x2_storage_t quantize_pair(float2 x, float s, float y) {
  return __nv_cvt_float2_to_fp8x2(make_float2(quotient(x.x, s, y), quotient(x.y, s, y)), __NV_SATFINITE, __NV_E4M3);
}

// The value W4AFP8's 16-bit GEMMs (a static input scale) read where an FP8 GEMM would read v's e4m3 byte: the byte
// quantize_pair writes, its e4m3 value times s in one fp32 multiply; the caller rounds it to its 16-bit type as it
// stores it (two roundings, each at most half an ulp of its type: the FP8 GEMM applies s to its fp32 sums instead).
__device__ __forceinline__ float dequantized(float v, float s, float y) {
  const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(quotient(v, s, y), __NV_SATFINITE, __NV_E4M3);
  return __fmul_rn(__half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3))), s);
}

// Unit u of a row of `cols` T values: the e4m3 bytes q times s, each in one fp32 multiply rounded to T (the value
// dequantized() gives for the element q quantizes).
template <typename T>
__device__ __forceinline__ void store_dequantized_unit(T* row, int64_t u, int64_t cols, bool whole, Bytes q, float s) {
  uint8_t b[kVec];
  memcpy(b, &q, sizeof(b));
  float v[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    v[k] = __fmul_rn(__half2float(__half(__nv_cvt_fp8_to_halfraw(b[k], __NV_E4M3))), s);
  if (whole) {
    *reinterpret_cast<uint4*>(row + u * kVec) = raw_from_f32<T, kVec>(v);
    return;
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if (u * kVec + k < cols) row[u * kVec + k] = from_f32<T>(v[k]);
  }
}

// An e4m3 kernel's output row: its units' bytes and the row's scales (an FP8 GEMM's input), or, kDequantized (W4AFP8,
// whose GEMMs are W4A16's on 16-bit rows), each unit's bytes times its scale in T (store_dequantized_unit) and no
// scales: the quantization the FP8 GEMM would read, in the values W4A16's GEMMs read.
template <typename T, bool kDequantized>
struct OutRow {
  using Elem = std::conditional_t<kDequantized, T, uint8_t>;
  Elem* row;
  float* scales;  // null where kDequantized
  __device__ __forceinline__ OutRow(void* out, float* out_scales, int64_t p, int64_t cols, int64_t scale_cols)
      : row(static_cast<Elem*>(out) + p * cols), scales(kDequantized ? nullptr : out_scales + p * scale_cols) {}
  __device__ __forceinline__ void unit(int64_t u, int64_t cols, bool whole, Bytes q, float s) const {
    if constexpr (kDequantized) store_dequantized_unit<T>(row, u, cols, whole, q, s);
    else store_unit(row, u, cols, whole, q);
  }
  __device__ __forceinline__ void scale(int64_t g, float s) const {
    if constexpr (!kDequantized) scales[g] = s;
  }
};

// A unit's e4m3 bytes from its eight values v (as the quantization sees them) by scale s, y = 1 / s.
__device__ __forceinline__ Bytes pack_unit(const float (&v)[kVec], float s, float y) {
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int k = 0; k < kVec; k += 2) {
    const uint32_t pair = quantize_pair(make_float2(v[k], v[k + 1]), s, y);
    w[k / 4] |= pair << (8 * (k % 4));
  }
  return Bytes{w[0], w[1]};
}

template <typename T>
__device__ __forceinline__ Bytes quantize_unit(uint4 x, float s, const float (&p)[kVec]) {
  float v[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) v[k] = scaled<T>(x, k, p);
  return pack_unit(v, s, __frcp_rn(s));
}

// The kernels that take rows without a pre-quant scale a warp per row (the expansion's and the activation's) quantize
// with the next two, in fewer instructions an element: they are bound by their instructions, not their bytes.

// quantize_unit's bytes without a pre-quant scale, y = 1 / s taken once by the caller (once a row, or a group).
template <typename T>
__device__ __forceinline__ Bytes quantize_unit_by(uint4 x, float s, float y) {
  float v[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) v[k] = raw_f32<T>(x, k);
  return pack_unit(v, s, y);
}

// A row of `units` whole units as a warp holds it: unit lane + 32 i in register i of lane `lane`, zeros past the row;
// read once, so streamed past L1.
template <typename T, int kPerLane>
__device__ __forceinline__ void load_warp_row(const T* __restrict__ row, int64_t units, int lane, uint4 (&x)[kPerLane]) {
  const uint4* src = reinterpret_cast<const uint4*>(row);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t u = lane + 32 * i;
    x[i] = u < units ? __ldcs(src + u) : uint4{0u, 0u, 0u, 0u};
  }
}

// The largest |x| of a unit's eight packed T values (finite: the module comment's contract) as fp32, taken on the
// packed values (|x| and max are exact in T, two elements an instruction): unit_amax's without a pre-quant scale.
template <typename T>
__device__ __forceinline__ float unit_amax_packed(uint4 x) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  auto pair = [](uint32_t w) {
    T2 v;
    memcpy(&v, &w, sizeof(v));
    return __habs2(v);
  };
  const T2 m = __hmax2(__hmax2(pair(x.x), pair(x.y)), __hmax2(pair(x.z), pair(x.w)));
  return fmaxf(to_f32(m.x), to_f32(m.y));
}

// The largest v of the block (every thread must call it; it synchronizes the block twice).
__device__ __forceinline__ float block_max(float v) {
  __shared__ float warp_max[32];
  v = lanes_max(v);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
  __syncthreads();
  float m = 0.0f;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) m = fmaxf(m, warp_max[w]);
  __syncthreads();  // every warp has read warp_max before a later row's call writes it
  return m;
}

// Quantizes one row of `cols` fp16/bf16 values (T) produced by `src` into the e4m3 row(s) and scales of `dst`.
// Every thread of the block must call it with the same row. static_scale: kStatic's device scalar; prequant: the
// AWQ pre-quant scale (fp32 [cols], 16-byte aligned where `whole`), or null.
//   Src: Payload fetch(int64_t u) const: issues unit u's loads (u in the row);
//        void begin(): once per row, after the first tile's fetches are issued (work that may overlap them);
//        uint4 unit(const Payload&, int64_t u) const: unit u's values, packed T (zero past the row's end).
//   Dst: void store(int64_t t0, const Bytes (&q)[kUnits], const float (&s)[kUnits]) const: tile t0's units (those
//        in the row), each quantized by its scale s[i];
//        void scale(int64_t g, float s) const: the scale of group g (0 for kStatic and kPerRow).
template <typename T, typename Src, typename Dst>
__device__ __forceinline__ void quantize_row(Src& src, const Dst& dst, int64_t cols, Mode mode,
                                             const float* static_scale, const float* prequant, bool whole) {
  const int64_t units = (cols + kVec - 1) / kVec;
  const int64_t tile = static_cast<int64_t>(kUnits) * blockDim.x;
  bool begun = false;
  float row_s = 0.0f;  // kStatic's and (after pass 0) kPerRow's scale
  if (mode == kStatic) {
    row_s = *static_scale;
    if (threadIdx.x == 0) dst.scale(0, row_s);
  }
  float amax = 0.0f;
  uint4 keep[kUnits];  // kPerRow: the first tile, held from pass 0 to pass 1
  // kPerRow makes two passes over the row, its amax (pass 0) then the stores (pass 1); the others one.
  // The loop bounds are the block's, so every lane of a warp takes part in the shuffles.
  for (int pass = mode == kPerRow ? 0 : 1; pass < 2; ++pass) {
    for (int64_t t0 = 0; t0 < units; t0 += tile) {
      uint4 x[kUnits];
      if (pass == 1 && mode == kPerRow && t0 == 0) {
#pragma unroll
        for (int i = 0; i < kUnits; ++i) x[i] = keep[i];
      } else {
        typename Src::Payload pay[kUnits];
#pragma unroll
        for (int i = 0; i < kUnits; ++i) {
          if (unit_index(t0, i) < units) pay[i] = src.fetch(unit_index(t0, i));
        }
        if (!begun) {
          src.begin();
          begun = true;
        }
#pragma unroll
        for (int i = 0; i < kUnits; ++i) {
          const int64_t u = unit_index(t0, i);
          x[i] = u < units ? src.unit(pay[i], u) : uint4{0u, 0u, 0u, 0u};
        }
        if (pass == 0) {
#pragma unroll
          for (int i = 0; i < kUnits; ++i) {
            float p[kVec];
            load_prequant(prequant, unit_index(t0, i), cols, whole, p);
            amax = fmaxf(amax, unit_amax<T>(x[i], p));
            if (t0 == 0) keep[i] = x[i];
          }
          continue;
        }
      }
      Bytes q[kUnits];
      float unit_s[kUnits];
#pragma unroll
      for (int i = 0; i < kUnits; ++i) {
        float p[kVec];
        load_prequant(prequant, unit_index(t0, i), cols, whole, p);
        float s = row_s;
        if (mode == kPerGroup) {
          // A group is kGroupLanes aligned lanes (t0 and blockDim.x are multiples of 32); units past the
          // row's end are zeros, so a partial last group's amax is its elements'.
          float a = unit_amax<T>(x[i], p);
          a = lanes_max<kGroupLanes>(a);
          s = dynamic_scale(a);
          const int64_t u = unit_index(t0, i);
          if (u < units && u % kGroupLanes == 0) dst.scale(u / kGroupLanes, s);
        }
        q[i] = quantize_unit<T>(x[i], s, p);
        unit_s[i] = s;
      }
      dst.store(t0, q, unit_s);
    }
    if (pass == 0) {
      row_s = dynamic_scale(block_max(amax));
      if (threadIdx.x == 0) dst.scale(0, row_s);
    }
  }
}

// ---- the plain row source and destination ---------------------------------------------------

// A row of `cols` fp16/bf16 values as they are.
template <typename T>
struct RowSource {
  using Payload = uint4;
  const T* row;
  int64_t cols;
  bool whole;
  __device__ __forceinline__ uint4 fetch(int64_t u) const { return load_unit<T>(row, u, cols, whole); }
  __device__ __forceinline__ void begin() {}
  __device__ __forceinline__ uint4 unit(uint4 x, int64_t) const { return x; }
};

// One output row of `cols` elements (OutRow: e4m3 bytes and scales, or kDequantized 16-bit values).
template <typename T, bool kDequantized>
struct RowDest {
  OutRow<T, kDequantized> out;
  int64_t cols;
  bool whole;
  __device__ __forceinline__ void store(int64_t t0, const Bytes (&q)[kUnits], const float (&s)[kUnits]) const {
    const int64_t units = (cols + kVec - 1) / kVec;
#pragma unroll
    for (int i = 0; i < kUnits; ++i) {
      if (unit_index(t0, i) < units) out.unit(unit_index(t0, i), cols, whole, q[i], s[i]);
    }
  }
  __device__ __forceinline__ void scale(int64_t g, float s) const { out.scale(g, s); }
};

}  // namespace fp8
}  // namespace mb
