// FC1 activation over the permuted rows: out[p, :I] = act(in[p, :N1] + b1[expert(p)]) for p < off[E]
// (rows past off[E] belong to experts on other nodes and are neither read nor written).
// Gated activations read the gate from columns [0, I) and the up projection from [I, 2I), or (gate_up_interleaved:
// a weight-only GEMM1 on W1 interleaved for the mixed-input kernel's gated epilogue, the plan's w1_order) feature f's
// gate from column 16 (f / 8) + f % 8 and its up projection 8 columns on (GatedColumns). The functions themselves are
// common/act_math.cuh's, shared with the GEMM epilogues.
// prequant_scale (AWQ's FC2 pre-quant scale) multiplies the result here so GEMM2's input is
// written once. Threads move 16-byte vectors when the row length and pointers allow, else single
// elements.
// A warp owns a (row, column chunk) unit, and each lane issues all of its gate and up loads of the
// chunk (up to kBatch vectors of each, lane-strided so every load is a coalesced warp access)
// before it computes, and writes each result vector with one 16-byte store (mb::store_f32). At
// prefill a chunk is the whole row (up to 32 * kBatch vectors); at decode sizes there are only T*K
// rows (4 to 8 at T=1), so mb::stage_launch() narrows the chunks until there are mb::kMinStageWarps
// units, spreading each row's columns over the SMs instead of leaving a few warps to walk them.
//
// FP8 (issue 46): mb_fc1_activation_fp8 writes GEMM2's input as e4m3 rows and scales instead
// (common/fp8_quantize.cuh's rule), a block per row: the activated values come from the same function
// as mb_fc1_activation's (activate below), rounded to dtype as mb_fc1_activation stores them, then
// quantized, so the fused step equals mb_fc1_activation followed by mb_quantize_fp8 bit for bit. W4AFP8 layers
// (fc2_prequant=fused) pass the AWQ FC2 pre-quant scale, which multiplies those rounded values before they are
// quantized (fp8_quantize.cuh): equal, bit for bit, to mb_fc1_activation then mb_quantize_fp8 with the same scale.
// Four kernels take the call, the one its step tactic names (mb_step_tactic: the plan's, planner/tactics/steps.py,
// which refuses here one that cannot take the call): the block-per-row kernel (block_rows) takes any; rows that move in
// whole 16-byte units (every layer's, in practice) may take the staged kernel (staged_rows), a persistent block that
// copies rows into a ring of shared-memory stages with cp.async, kStages - 1 rows ahead of the row it activates and
// quantizes, so that an SM always has loads in flight. The block-per-row kernel holds its row in registers (117 a
// thread: one 448-thread block per SM at Mixtral-8x7B's width), so each SM alternated between waiting on its loads and
// computing with none in flight: 355 us for Mixtral-8x7B's 8192 rows x 14336 columns on an H200, whose bytes take
// about 140 (bench/layer_steps_probe.py). Ungated rows up to 4096 columns and gated rows up to 1536 without a pre-quant
// scale (the quantize step after GEMM1's gated epilogue; block-128 layers' activation step) may take a warp per row
// (warp_rows: fc1_activation_fp8_warp_kernel), with no barrier at all and fewer instructions an element, the plan's
// where there is a row for every warp the GPU holds; calls with a static or a per-group scale half a warp per (row,
// 128-column group) (group_items: fc1_activation_fp8_groups_kernel), the plan's at decode (fewer rows than SMs).
// All four write the same bytes: activated_unit()'s values (the identity's without a bias are the row's own)
// quantized by fp8_quantize.cuh's rule.
//
// W4AFP8 (issue 47), whose GEMMs are W4A16's on 16-bit rows: mb_fc1_activation_fp8_dequantized stores GEMM2's input as
// the 16-bit values of the FP8 quantization (fp8_quantize.cuh, dequantized) of the values mb_fc1_activation_fp8
// quantizes: by a static scale through the 16-bit activation's kernel, by each row's dynamic scale through
// mb_fc1_activation_fp8's three kernels (fp8::OutRow storing the values instead of the bytes and no scales). With the
// identity and no bias it quantizes rows already activated (the separate step after mb_fc1_activation or a 16-bit
// expansion; in place too: each row is read whole before it is written).
//
// Token digits (issue 47): mb_fc1_activation_digits writes GEMM2's input as the weight-only decode GEMM's token digits
// (common/token_digits.cuh) where GEMM2 runs the digits tile, instead of 16-bit rows that a digits step would then
// read back and split. A warp per (row, 128-column group): the group's activated values (activate() below, times the
// pre-quant scale, rounded to dtype: what mb_fc1_activation stores), then the group's record: the bytes
// mb_fc1_activation then mb_token_digits write. With each row's own FP8 scale (fp8_row_scale) a block per row
// (common/row_scale_digits.cuh): the bytes mb_fc1_activation_fp8_dequantized by row scales then mb_token_digits write.
#include "common/act_math.cuh"
#include "common/common.cuh"
#include "common/fp8_quantize.cuh"
#include "common/row_scale_digits.cuh"
#include "common/token_digits.cuh"

namespace {

constexpr int kBatch = 4;         // vectors per lane in flight, of the gate and of the up half each

// Where feature j's gate and up columns sit in a GEMM1 row (and in b1): stacked, j and inter + j; interleaved in blocks
// of 8 (gemm/mma.cuh gated_row), 16 (j / 8) + j % 8 and 8 further on. A vector of up to 8 features starting at a
// multiple of its width stays within one block either way.
struct GatedColumns {
  int64_t inter;
  bool interleaved;
  __device__ __forceinline__ int64_t gate(int64_t j) const { return interleaved ? (j >> 3) * 16 + (j & 7) : j; }
  __device__ __forceinline__ int64_t up(int64_t j) const { return interleaved ? gate(j) + 8 : inter + j; }
};

// The expert owning permuted row p (the last x with off[x] <= p, as a binary search finds it),
// searched by the whole warp: each round probes 32 evenly spaced offsets at once, so E <= 32 takes
// one dependent load and E <= 1024 two, where a binary search takes log2(E) (7 L2 round trips at
// E = 128 in a decode-sized call, where nothing is in L1 yet). Every lane must call it with the
// same p.
__device__ __forceinline__ int warp_expert_of(const int64_t* off, int E, int64_t p) {
  const int lane = threadIdx.x % 32;
  int lo = 0, hi = E;  // invariant: off[lo] <= p < off[hi]
  while (hi - lo > 1) {
    const int step = (hi - lo + 31) / 32;
    const int x = lo + lane * step;
    const unsigned le = __ballot_sync(0xffffffffu, x < hi && off[x] <= p);
    // off is nondecreasing, so `le` is a prefix of the lanes: its top lane's probe is the new lo,
    // and the next probe (or hi) the new hi.
    lo += le ? (31 - __clz(le)) * step : 0;
    hi = min(hi, lo + step);
  }
  return lo;
}

// The activation both kernels compute, elementwise in fp32: act(g + bg, x + bu), g the gate and x the up
// projection (gated activations; else unused) of VEC columns, bg and bu their bias where the row's expert
// has one (has_bias; else nothing is added: adding a zero would turn a -0 into +0).
template <int ACT, int VEC>
__device__ __forceinline__ void activate(float (&g)[VEC], float (&x)[VEC], bool has_bias, const float (&bg)[VEC],
                                         const float (&bu)[VEC], float alpha, float limit, float (&r)[VEC]) {
  if (has_bias) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) g[k] += bg[k];
    if constexpr (mb::is_gated(ACT)) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) x[k] += bu[k];
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) r[k] = mb::act_apply<ACT>(g[k], x[k], alpha, limit);
}

// FP8: GEMM2's input quantized by fp8_scale (a device scalar) and stored dequantized (fp8::dequantized): the activated
// value rounded to T, times the pre-quant scale in fp32, quantized, as mb_fc1_activation_fp8 quantizes it.
template <typename T, int ACT, int VEC, bool FP8>
__global__ void __launch_bounds__(mb::kStageThreads)
fc1_activation_kernel(const T* __restrict__ in, const T* __restrict__ b1, const int64_t* __restrict__ off, int E,
                  int64_t max_rows, int inter, int vpl, int64_t chunks, float alpha, float limit,
                  const float* __restrict__ prequant_scale, const float* __restrict__ fp8_scale,
                  GatedColumns cols, T* __restrict__ out) {
  using R = mb::Raw<T, VEC>;
  constexpr bool kGated = mb::is_gated(ACT);
  const int64_t n1 = kGated ? 2 * static_cast<int64_t>(inter) : inter;
  const int lane = threadIdx.x % 32;
  const int64_t nvec = inter / VEC;
  // Warps stride over the rows, blockIdx.y over a row's column chunks. off[E] is re-read per row (an
  // L1 hit) rather than held in a register across the loop body.
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * mb::kStageWarps + threadIdx.x / 32; p < max_rows;
       p += static_cast<int64_t>(gridDim.x) * mb::kStageWarps) {
    if (p >= __ldg(off + E)) break;  // rows past off[E]: other nodes' experts
    const T* row = in + p * n1;
    T* dst = out + p * inter;
    for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
      const int64_t v0 = c * 32 * vpl + lane;  // this lane's vectors: v0, v0 + 32, ...
      auto mine = [&](int i) { return i < vpl && v0 + i * 32 < nvec; };
      R gate[kBatch], up[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (!mine(i)) continue;
        const int64_t j = (v0 + i * 32) * VEC;
        gate[i] = *reinterpret_cast<const R*>(row + (kGated ? cols.gate(j) : j));
        if constexpr (kGated) up[i] = *reinterpret_cast<const R*>(row + cols.up(j));
      }
      // The bias row is per expert and small (an L2/L1 hit): looked up while the row loads fly.
      const T* bias = b1 ? b1 + warp_expert_of(off, E, p) * n1 : nullptr;
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (!mine(i)) continue;
        const int64_t j = (v0 + i * 32) * VEC;
        float g[VEC], x[VEC], bg[VEC], bu[VEC], r[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          g[k] = mb::raw_f32<T>(gate[i], k);
          x[k] = 0.0f;
          if constexpr (kGated) x[k] = mb::raw_f32<T>(up[i], k);
        }
        if (bias) {
          mb::load_f32<T, VEC>(bias + (kGated ? cols.gate(j) : j), bg);
          if constexpr (kGated) mb::load_f32<T, VEC>(bias + cols.up(j), bu);
        }
        activate<ACT, VEC>(g, x, bias != nullptr, bg, bu, alpha, limit, r);
        if constexpr (FP8) {
          const float q = *fp8_scale, y = __frcp_rn(q);
          float s[VEC];
          if (prequant_scale) mb::load_f32<float, VEC>(prequant_scale + j, s);
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            float v = mb::to_f32(mb::from_f32<T>(r[k]));
            if (prequant_scale) v = __fmul_rn(v, s[k]);
            r[k] = mb::fp8::dequantized(v, q, y);
          }
        } else if (prequant_scale) {
          float s[VEC];
          mb::load_f32<float, VEC>(prequant_scale + j, s);
#pragma unroll
          for (int k = 0; k < VEC; ++k) r[k] *= s[k];
        }
        mb::store_f32<T, VEC>(dst + j, r);
      }
    }
  }
}

// The activation of a row's four features col .. col + 3 (a lane's share of a digits group), the row's gate and up
// columns where `cols` puts them, bias the row's expert's b1 row or null.
template <typename T, int ACT>
__device__ __forceinline__ void activate_four(const T* row, const T* bias, GatedColumns cols, int64_t col, float alpha,
                                              float limit, float (&r)[4]) {
  constexpr bool kGated = mb::is_gated(ACT);
  float g[4], u[4] = {0.f, 0.f, 0.f, 0.f}, bg[4], bu[4];
  mb::load_f32<T, 4>(row + (kGated ? cols.gate(col) : col), g);
  if constexpr (kGated) mb::load_f32<T, 4>(row + cols.up(col), u);
  if (bias) {
    mb::load_f32<T, 4>(bias + (kGated ? cols.gate(col) : col), bg);
    if constexpr (kGated) mb::load_f32<T, 4>(bias + cols.up(col), bu);
  }
  activate<ACT, 4>(g, u, bias != nullptr, bg, bu, alpha, limit, r);
}

// A warp per (permuted row p < off[E], group g) item, warps striding over the items of max_rows rows.
constexpr int kDigitWarps = 8;

// fp8_scale (W4AFP8) or NULL: the values quantized by it and stored dequantized first, as
// mb_fc1_activation_fp8_dequantized writes them.
template <typename T, int ACT>
__global__ void __launch_bounds__(kDigitWarps * 32)
fc1_activation_digits_kernel(const T* __restrict__ in, const T* __restrict__ b1, const int64_t* __restrict__ off,
                             int E, int64_t max_rows, int inter, float alpha, float limit,
                             const float* __restrict__ prequant_scale, const float* __restrict__ fp8_scale,
                             GatedColumns cols, mb::DigitOrder order, uint8_t* __restrict__ out) {
  // GEMM2 (a decode kernel on the digits tile) starts under GEMM1 and requests its first weights ahead of its own
  // wait, which returns once this kernel has completed, after GEMM1 (the header's contract).
  mb::let_dependents_start();
  mb::wait_for_predecessor();
  const float q8 = fp8_scale ? *fp8_scale : 1.0f, y8 = __frcp_rn(q8);
  constexpr bool kGated = mb::is_gated(ACT);
  const int lane = threadIdx.x & 31;
  const int64_t n1 = kGated ? 2 * static_cast<int64_t>(inter) : inter;
  const int64_t groups = mb::digit_groups(inter);
  const int64_t filled = __ldg(off + E);
  const int64_t items = (filled < max_rows ? filled : max_rows) * groups;  // rows past off[E]: other nodes' experts
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kDigitWarps;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * kDigitWarps + (threadIdx.x >> 5); it < items; it += warps) {
    const int64_t p = it / groups, col = (it - p * groups) * mb::kDigitGroup + 4 * lane;
    const T* row = in + p * n1;
    const T* bias = b1 ? b1 + warp_expert_of(off, E, p) * n1 : nullptr;  // every lane (warp_expert_of is the warp's)
    float r[4] = {0.f, 0.f, 0.f, 0.f};  // zeros past a half group at the end of the row
    if (col < inter) {
      activate_four<T, ACT>(row, bias, cols, col, alpha, limit, r);
      float s[4] = {1.0f, 1.0f, 1.0f, 1.0f};
      if (prequant_scale) mb::load_f32<float, 4>(prequant_scale + col, s);
      if (fp8_scale) {  // as mb_fc1_activation_fp8_dequantized stores it
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float v = __fmul_rn(mb::to_f32(mb::from_f32<T>(r[i])), s[i]);
          r[i] = mb::to_f32(mb::from_f32<T>(mb::fp8::dequantized(v, q8, y8)));
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) r[i] = mb::to_f32(mb::from_f32<T>(r[i] * s[i]));  // as mb_fc1_activation stores it
      }
    }
    mb::store_digit_words(mb::digit_words(r, order), out + it * static_cast<int64_t>(mb::kDigitGroupBytes), order);
  }
}

// Per-row FP8 scales (W4AFP8 with dynamic activation scales: common/row_scale_digits.cuh): a block per permuted row
// p < off[E], blocks striding over the rows; its groups' activated values (rounded to T, times the pre-quant scale in
// fp32: what mb_fc1_activation_fp8_dequantized quantizes), the row's amax over the block, then each warp's groups'
// records. The dependent launch as fc1_activation_digits_kernel's.
template <typename T, int ACT, int G>
__global__ void __launch_bounds__(mb::kRowDigitsMaxWarps * 32)
fc1_activation_digits_row_scale_kernel(const T* __restrict__ in, const T* __restrict__ b1,
                                       const int64_t* __restrict__ off, int E, int64_t max_rows, int inter, float alpha,
                                       float limit, const float* __restrict__ prequant_scale, GatedColumns cols,
                                       mb::DigitOrder order, uint8_t* __restrict__ out) {
  mb::let_dependents_start();
  mb::wait_for_predecessor();
  constexpr bool kGated = mb::is_gated(ACT);
  const int64_t n1 = kGated ? 2 * static_cast<int64_t>(inter) : inter;
  const int64_t groups = mb::digit_groups(inter);
  const int64_t filled = __ldg(off + E);
  const int64_t rows = filled < max_rows ? filled : max_rows;  // rows past off[E]: other nodes' experts
  for (int64_t p = blockIdx.x; p < rows; p += gridDim.x) {
    const T* row = in + p * n1;
    const T* bias = b1 ? b1 + warp_expert_of(off, E, p) * n1 : nullptr;  // every lane (warp_expert_of is the warp's)
    float x[G][4];
    const float amax = mb::load_row_groups<G>(inter, x, [&](int64_t col, float (&v)[4]) {
      float r[4], s[4] = {1.0f, 1.0f, 1.0f, 1.0f};
      activate_four<T, ACT>(row, bias, cols, col, alpha, limit, r);
      if (prequant_scale) mb::load_f32<float, 4>(prequant_scale + col, s);
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = __fmul_rn(mb::to_f32(mb::from_f32<T>(r[k])), s[k]);
    });
    const float s = mb::fp8::dynamic_scale(mb::fp8::block_max(amax));
    mb::store_row_groups<T, G>(groups, x, s, order, [&](int64_t g, const mb::DigitWords& w) {
      mb::store_digit_words(w, out + (p * groups + g) * static_cast<int64_t>(mb::kDigitGroupBytes), order);
    });
  }
}

// ---- FP8 (issue 46) ------------------------------------------------------------------------------

namespace fp8 = mb::fp8;

// Unit u (columns [8u, 8u + 8)) of a row's activation from its gate and up units (packed T; up unused for
// ungated activations), computed by activate() and rounded to T, the values mb_fc1_activation stores. bias: the
// row's expert's b1 row or null.
template <typename T, int ACT>
__device__ __forceinline__ uint4 activated_unit(uint4 gate, uint4 up, const T* bias, int64_t u, int inter, bool whole,
                                                float alpha, float limit) {
  constexpr bool kGated = mb::is_gated(ACT);
  float g[fp8::kVec], v[fp8::kVec], bg[fp8::kVec], bu[fp8::kVec], r[fp8::kVec];
#pragma unroll
  for (int k = 0; k < fp8::kVec; ++k) {
    g[k] = mb::raw_f32<T>(gate, k);
    v[k] = kGated ? mb::raw_f32<T>(up, k) : 0.0f;
  }
  if (bias) {
    const uint4 b = fp8::load_unit<T>(bias, u, inter, whole);
#pragma unroll
    for (int k = 0; k < fp8::kVec; ++k) bg[k] = mb::raw_f32<T>(b, k);
    if constexpr (kGated) {
      const uint4 c = fp8::load_unit<T>(bias + inter, u, inter, whole);
#pragma unroll
      for (int k = 0; k < fp8::kVec; ++k) bu[k] = mb::raw_f32<T>(c, k);
    }
  }
  activate<ACT, fp8::kVec>(g, v, bias != nullptr, bg, bu, alpha, limit, r);
  if (!whole) {
    // Columns past the row's end are none of the row's: zeros, which leave a partial group's amax as it is.
#pragma unroll
    for (int k = 0; k < fp8::kVec; ++k) {
      if (u * fp8::kVec + k >= inter) r[k] = 0.0f;
    }
  }
  return mb::raw_from_f32<T, fp8::kVec>(r);
}

// fp8::quantize_row's source for permuted row p: unit u is activated_unit()'s.
template <typename T, int ACT>
struct ActivatedRow {
  static constexpr bool kGated = mb::is_gated(ACT);
  struct Payload {
    uint4 gate, up;
  };
  const T* row;  // in[p]: the gate columns [0, inter), then (gated) the up columns [inter, 2 * inter)
  const T* b1;
  const int64_t* off;
  int E;
  int64_t p;
  int inter;
  bool whole;
  float alpha, limit;
  const T* bias;  // the row's expert's b1 row or null, set by begin()

  __device__ __forceinline__ Payload fetch(int64_t u) const {
    Payload x;
    x.gate = fp8::load_unit<T>(row, u, inter, whole);
    x.up = kGated ? fp8::load_unit<T>(row + inter, u, inter, whole) : uint4{0u, 0u, 0u, 0u};
    return x;
  }
  // The bias row is per expert and small (an L2/L1 hit): looked up while the first loads fly.
  __device__ __forceinline__ void begin() {
    const int64_t n1 = kGated ? 2 * static_cast<int64_t>(inter) : inter;
    bias = b1 ? b1 + warp_expert_of(off, E, p) * n1 : nullptr;
  }
  __device__ __forceinline__ uint4 unit(const Payload& x, int64_t u) const {
    return activated_unit<T, ACT>(x.gate, x.up, bias, u, inter, whole, alpha, limit);
  }
};

// A block per permuted row p < off[E] (blocks stride over the rows); its rows e4m3 with their scales or
// (kDequantized) 16-bit (fp8::OutRow), as each kernel below.
template <typename T, int ACT, bool kDequantized>
__global__ void __launch_bounds__(fp8::kMaxThreads)
fc1_activation_fp8_kernel(const T* __restrict__ in, const T* __restrict__ b1, const int64_t* __restrict__ off, int E,
                          int64_t max_rows, int inter, float alpha, float limit,
                          const float* __restrict__ prequant_scale, fp8::Mode mode, bool whole,
                          const float* __restrict__ static_scale, int64_t scale_cols, void* __restrict__ out,
                          float* __restrict__ out_scales) {
  const int64_t n1 = mb::is_gated(ACT) ? 2 * static_cast<int64_t>(inter) : inter;
  for (int64_t p = blockIdx.x; p < max_rows; p += gridDim.x) {
    if (p >= __ldg(off + E)) break;  // rows past off[E]: other nodes' experts
    ActivatedRow<T, ACT> src{in + p * n1, b1, off, E, p, inter, whole, alpha, limit, nullptr};
    const fp8::RowDest<T, kDequantized> dst{fp8::OutRow<T, kDequantized>(out, out_scales, p, inter, scale_cols), inter,
                                            whole};
    fp8::quantize_row<T>(src, dst, inter, mode, static_scale, prequant_scale, whole);
  }
}

// The staged kernel's copies: 16 bytes global -> shared with cp.async (L2 only: each row is read once), a
// group committed per row, and a wait for all but the newest N groups.
__device__ __forceinline__ void stage_copy16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void stage_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void stage_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Whole rows only (fp8::whole_units). Blocks take rows blockIdx.x, + gridDim.x, ... (persistent: the grid is what
// fits on the GPU at once); a row's kStages - 1 successors are being copied into the ring while it is computed.
// One pass over a row's units: kStatic and kPerGroup quantize and store each unit as it is activated; kPerRow
// writes the activated unit back over its gate unit in the ring (only the thread that wrote it reads it again)
// and stores in a second pass, after the row's amax.
// Its blocks, in whole warps: a thread per four units of the row where an SM holds two rings or more, so that
// many rows are in flight per SM; a thread per two where the ring takes the SM's shared memory alone (Mixtral-8x7B's
// 14336 columns), so that its one block has up to 32 warps to hide its math's latency. H200, 4096 tokens
// (bench/layer_steps_probe.py): Mixtral-8x7B 323 us at four units a thread, 290 at two; Qwen3-30B-A3B (768
// columns) 57 at four, 66 at two; DeepSeek-V2-Lite (1408) 79 and 80.
constexpr int kStagedMaxThreads = 1024;
inline int staged_threads(int64_t units, bool ring_alone) {
  const int64_t per_thread = ring_alone ? 2 : 4;
  const int64_t warps = (units + 32 * per_thread - 1) / (32 * per_thread);
  return static_cast<int>(warps * 32 < kStagedMaxThreads ? warps * 32 : kStagedMaxThreads);
}

template <typename T, int ACT, int kStages, bool kDequantized>
__global__ void __launch_bounds__(kStagedMaxThreads)
fc1_activation_fp8_staged_kernel(const T* __restrict__ in, const T* __restrict__ b1, const int64_t* __restrict__ off,
                                 int E, int64_t max_rows, int inter, float alpha, float limit,
                                 const float* __restrict__ prequant_scale, fp8::Mode mode,
                                 const float* __restrict__ static_scale, int64_t scale_cols,
                                 void* __restrict__ out, float* __restrict__ out_scales) {
  extern __shared__ uint4 ring[];  // kStages rows of row_units 16-byte units
  constexpr bool kGated = mb::is_gated(ACT);
  const int64_t units = inter / fp8::kVec;
  const int64_t row_units = kGated ? 2 * units : units;
  const int64_t n1 = kGated ? 2 * static_cast<int64_t>(inter) : inter;
  const int64_t filled = __ldg(off + E);
  const int64_t rows = filled < max_rows ? filled : max_rows;  // rows past off[E]: other nodes' experts
  const float static_s = mode == fp8::kStatic ? *static_scale : 0.0f;
  const float static_y = mode == fp8::kStatic ? __frcp_rn(static_s) : 0.0f;
  // The quantize step after GEMM1's gated epilogue (the identity, no bias, no pre-quant scale): the row's own values,
  // quantized with the warp-row kernels' math (a unit's amax on its packed values, the scale's reciprocal once a row
  // or group), where activated_unit() and quantize_unit() would unpack, repack and multiply every element by one.
  const bool plain = ACT == MB_ACT_IDENTITY && b1 == nullptr && prequant_scale == nullptr;
  auto fetch = [&](int64_t p, int stage) {
    if (p < rows) {
      const uint4* src = reinterpret_cast<const uint4*>(in + p * n1);
      uint4* dst = ring + stage * row_units;
      for (int64_t u = threadIdx.x; u < row_units; u += blockDim.x) stage_copy16(dst + u, src + u);
    }
    stage_commit();  // a group per row, empty or not, so that every thread's wait counts the same rows
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) fetch(blockIdx.x + static_cast<int64_t>(s) * gridDim.x, s);
  int stage = 0;
  for (int64_t p = blockIdx.x; p < rows; p += gridDim.x) {
    fetch(p + static_cast<int64_t>(kStages - 1) * gridDim.x, (stage + kStages - 1) % kStages);
    stage_wait<kStages - 1>();
    __syncthreads();  // every thread's copies of row p have landed
    uint4* gate = ring + stage * row_units;
    const uint4* up = gate + units;
    const T* bias = b1 ? b1 + warp_expert_of(off, E, p) * n1 : nullptr;
    const fp8::OutRow<T, kDequantized> dst(out, out_scales, p, inter, scale_cols);
    if (mode == fp8::kStatic && threadIdx.x == 0) dst.scale(0, static_s);
    float amax = 0.0f;
    // The bounds are the block's (t0 steps by blockDim.x, a multiple of 32), so every lane of a warp takes part in
    // the group shuffles and a 128-column group is 16 aligned lanes.
    for (int64_t t0 = 0; t0 < units; t0 += blockDim.x) {
      const int64_t u = t0 + threadIdx.x;
      const bool mine = u < units;
      const uint4 zero{0u, 0u, 0u, 0u};
      const uint4 x = !mine ? zero
                      : plain ? gate[u]
                              : activated_unit<T, ACT>(gate[u], kGated ? up[u] : zero, bias, u, inter, true, alpha,
                                                       limit);
      float pq[fp8::kVec];
      fp8::load_prequant(prequant_scale, u, inter, true, pq);
      const float a = plain ? fp8::unit_amax_packed<T>(x) : fp8::unit_amax<T>(x, pq);
      if (mode == fp8::kPerRow) {
        if (mine) {
          if (!plain) gate[u] = x;
          amax = fmaxf(amax, a);
        }
        continue;
      }
      float s = static_s, y = static_y;
      if (mode == fp8::kPerGroup) {
        float g = a;
        g = mb::lanes_max<fp8::kGroupLanes>(g);
        s = fp8::dynamic_scale(g);
        y = __frcp_rn(s);
        if (mine && u % fp8::kGroupLanes == 0) dst.scale(u / fp8::kGroupLanes, s);
      }
      if (mine)
        dst.unit(u, inter, true, plain ? fp8::quantize_unit_by<T>(x, s, y) : fp8::quantize_unit<T>(x, s, pq), s);
    }
    if (mode == fp8::kPerRow) {
      const float s = fp8::dynamic_scale(fp8::block_max(amax)), y = __frcp_rn(s);
      if (threadIdx.x == 0) dst.scale(0, s);
      for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
        float pq[fp8::kVec];
        fp8::load_prequant(prequant_scale, u, inter, true, pq);
        dst.unit(u, inter, true,
                 plain ? fp8::quantize_unit_by<T>(gate[u], s, y) : fp8::quantize_unit<T>(gate[u], s, pq), s);
      }
    }
    __syncthreads();  // every thread is done with the stage before the next iteration copies a row into it
    stage = (stage + 1) % kStages;
  }
  stage_wait<0>();
}

// Rows of at most kWarpRowMaxPerLane * 32 units (4096 columns) without a pre-quant scale: the quantize step after
// GEMM1's gated epilogue (which calls this with the identity activation and no bias) at every bench layer's width but
// Mixtral-8x7B's; gated rows (the gate half, then the up half) of at most kWarpGatedMaxPerLane * 32 units, the
// activation step of block-128 layers, whose GEMM1 has no gated epilogue. A warp per row, its units in the lanes'
// registers (unit lane + 32 i in lane `lane`, its up unit beside it), the row's amax (or each 128-column group's: 16
// lanes) by shuffles, then its quantized units stored: no shared memory and no block barrier, and an SM holds as many
// rows in flight as it holds warps. The step is bound by its instructions, not its bytes (the staged kernel's 59.7 us
// for GPT-OSS-20B's 16384 rows of 2880 columns at 4096 tokens on an H200 is 2.4 TB/s; this kernel with the staged
// kernel's per-element math took as long), so each element costs what the bytes need and no more: the identity without
// a bias is no work (activated_unit() would return the unit's own bits); a unit's amax is taken on its packed 16-bit
// values (|x| and max are exact in T, two elements an instruction); and the reciprocal of the scale is taken once a row
// (a group), where quantize_unit takes it every unit. The bytes are quantize_unit's: quantize_pair() of each element's
// fp32 value (times no pre-quant scale).
using fp8::kWarpRowMaxPerLane;
using fp8::kWarpRowThreads;
// A gated row's lane holds both halves' units. H200, bench/layer_steps_probe.py, block-128 activation steps at
// 1024 / 4096 tokens against the staged kernel: 4 units a lane (Qwen3-30B-A3B, 71 registers, three blocks an SM)
// 16.8 -> 14.1 / 52.0 -> 40.1 us, 6 (DeepSeek-V2-Lite, 80) 21.8 -> 18.9 / 69.1 -> 61.9, 12 (GPT-OSS-20B, 152, one
// block an SM) 28.7 -> 43.1 / 100.7 -> 142.9; wider gated rows keep the staged kernel (8 units not measured).
constexpr int kWarpGatedMaxPerLane = 6;

// The kernel width for rows of `per_lane` units a lane or fewer (4, 6, 8, 12 or 16), at most the row kind's widest:
// a width that the kind never launches (launch_warp_rows refuses those rows) is then not built.
template <int ACT>
constexpr int warp_width(int per_lane) {
  const int widest = mb::is_gated(ACT) ? kWarpGatedMaxPerLane : kWarpRowMaxPerLane;
  return per_lane < widest ? per_lane : widest;
}

template <typename T, int ACT, int kPerLane, bool kDequantized>
__global__ void __launch_bounds__(kWarpRowThreads)
fc1_activation_fp8_warp_kernel(const T* __restrict__ in, const T* __restrict__ b1, const int64_t* __restrict__ off,
                               int E, int64_t max_rows, int inter, float alpha, float limit, fp8::Mode mode,
                               const float* __restrict__ static_scale, int64_t scale_cols, void* __restrict__ out,
                               float* __restrict__ out_scales) {
  constexpr bool kGated = mb::is_gated(ACT);
  const int lane = threadIdx.x % 32;
  const int64_t units = inter / fp8::kVec;
  const int64_t n1 = kGated ? 2 * static_cast<int64_t>(inter) : inter;  // an input row: the gate half, then the up half
  const int64_t filled = __ldg(off + E);
  const int64_t rows = filled < max_rows ? filled : max_rows;  // rows past off[E]: other nodes' experts
  const float static_s = mode == fp8::kStatic ? *static_scale : 0.0f;
  const float static_y = mode == fp8::kStatic ? __frcp_rn(static_s) : 0.0f;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kWarpRowThreads / 32);
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * (kWarpRowThreads / 32) + threadIdx.x / 32; p < rows;
       p += warps) {
    uint4 x[kPerLane], up[kGated ? kPerLane : 1];
    fp8::load_warp_row(in + p * n1, units, lane, x);
    if constexpr (kGated) fp8::load_warp_row(in + p * n1 + inter, units, lane, up);
    const T* bias = b1 ? b1 + warp_expert_of(off, E, p) * n1 : nullptr;
    const fp8::OutRow<T, kDequantized> dst(out, out_scales, p, inter, scale_cols);
    float amax = 0.0f;
    // i < kPerLane and 32 * i < units are the warp's bounds, so every lane takes part in the group shuffles.
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (32 * i >= units) break;
      const int64_t u = lane + 32 * i;
      if ((ACT != MB_ACT_IDENTITY || bias) && u < units) {
        uint4 up_unit{0u, 0u, 0u, 0u};
        if constexpr (kGated) up_unit = up[i];
        x[i] = activated_unit<T, ACT>(x[i], up_unit, bias, u, inter, true, alpha, limit);
      }
      if (mode == fp8::kPerRow) {
        amax = fmaxf(amax, fp8::unit_amax_packed<T>(x[i]));  // zeros past the row
      } else if (mode == fp8::kPerGroup) {
        float g = fp8::unit_amax_packed<T>(x[i]);
        g = mb::lanes_max<fp8::kGroupLanes>(g);
        const float s = fp8::dynamic_scale(g);
        if (u < units) {
          if (u % fp8::kGroupLanes == 0) dst.scale(u / fp8::kGroupLanes, s);
          dst.unit(u, inter, true, fp8::quantize_unit_by<T>(x[i], s, __frcp_rn(s)), s);
        }
      } else if (u < units) {
        dst.unit(u, inter, true, fp8::quantize_unit_by<T>(x[i], static_s, static_y), static_s);
      }
    }
    if (mode == fp8::kStatic && lane == 0) dst.scale(0, static_s);
    if (mode != fp8::kPerRow) continue;
    amax = mb::lanes_max(amax);
    const float s = fp8::dynamic_scale(amax), y = __frcp_rn(s);
    if (lane == 0) dst.scale(0, s);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t u = lane + 32 * i;
      if (u < units) dst.unit(u, inter, true, fp8::quantize_unit_by<T>(x[i], s, y), s);
    }
  }
}

// Launches the warp-per-row kernel (MB_STEP_WARP_ROWS) for rows of at most kWarpRowMaxPerLane * 32 whole units (gated:
// kWarpGatedMaxPerLane * 32, both halves held) without a pre-quant scale, on the fewest registers a lane that hold them
// (4, 6, 8, 12 or 16 units), a persistent grid of what fits on the GPU at once; refused where it does not take the
// call. The planner gives it where the call's rows give each warp the GPU holds at once a row at least: fewer rows
// leave warps idle while each walks its whole row alone, where the staged kernel spreads a row over three warps or
// more (GPT-OSS-20B at 256 tokens, 1024 rows of 2880 columns, 8 warps an SM: 10.0 us on this kernel against the
// staged kernel's 5.7; H200, bench/layer_steps_probe.py).
template <typename T, int ACT, bool kDequantized>
mb_status launch_warp_rows(const char* who, bool whole, const T* in, const T* b1, const int64_t* off, int E,
                           int64_t max_rows, int inter, float alpha, float limit, const float* prequant_scale,
                           fp8::Mode mode, const float* static_scale, int64_t scale_cols, void* out, float* out_scales,
                           cudaStream_t stream) {
  const int64_t per_lane = (inter / fp8::kVec + 31) / 32;
  const int widest = mb::is_gated(ACT) ? kWarpGatedMaxPerLane : kWarpRowMaxPerLane;
  if (!(whole && prequant_scale == nullptr && per_lane <= widest))
    return mb::fail(MB_ERR_UNSUPPORTED,
                    "%s: tactic warp_rows takes whole units, no pre-quant scale and rows of at most %d columns "
                    "(inter %d)", who, widest * 32 * fp8::kVec, inter);
  auto go = [&](auto kernel) -> mb_status {
    const int64_t resident = mb::resident_blocks(kernel, kWarpRowThreads, 0);
    const int64_t blocks = (max_rows + kWarpRowThreads / 32 - 1) / (kWarpRowThreads / 32);
    kernel<<<static_cast<unsigned>(blocks < resident ? blocks : resident), kWarpRowThreads, 0, stream>>>(
        in, b1, off, E, max_rows, inter, alpha, limit, mode, static_scale, scale_cols, out, out_scales);
    return mb::check_launch("fc1_activation_fp8_warp_kernel");
  };
  if (per_lane <= 4) return go(fc1_activation_fp8_warp_kernel<T, ACT, warp_width<ACT>(4), kDequantized>);
  if (per_lane <= 6) return go(fc1_activation_fp8_warp_kernel<T, ACT, warp_width<ACT>(6), kDequantized>);
  if (per_lane <= 8) return go(fc1_activation_fp8_warp_kernel<T, ACT, warp_width<ACT>(8), kDequantized>);
  if (per_lane <= 12) return go(fc1_activation_fp8_warp_kernel<T, ACT, warp_width<ACT>(12), kDequantized>);
  return go(fc1_activation_fp8_warp_kernel<T, ACT, warp_width<ACT>(kWarpRowMaxPerLane), kDequantized>);
}

// Decode row counts (fewer rows than the GPU has SMs) with a static or a per-group scale, neither of which needs a
// row's whole amax before its first store: half a warp per (row p, 128-column group) item, a warp the row's groups 2j
// and 2j + 1, warps striding over the items, so a call's few rows spread over the whole GPU where the staged kernel
// runs a block a row on as many SMs and walks each row's units in turn (Mixtral-8x7B's block-128 activation step at 1
// token, 2 rows of 2 x 14336 columns on two SMs, took 4.6 us between GEMM1's end and GEMM2's start on an H100,
// bench/layer_timeline_probe.py; 1.9 us with this kernel). The same per-element math as the warp-per-row kernel: the
// same bytes.
constexpr int kGroupItemThreads = 256;

// A row's items: its pairs of 128-column groups (the last may be a lone group, or partial).
__host__ __device__ inline int64_t group_pairs(int inter) {
  return (inter / fp8::kVec + 2 * fp8::kGroupLanes - 1) / (2 * fp8::kGroupLanes);
}

template <typename T, int ACT>
__global__ void __launch_bounds__(kGroupItemThreads)
fc1_activation_fp8_groups_kernel(const T* __restrict__ in, const T* __restrict__ b1, const int64_t* __restrict__ off,
                                 int E, int64_t max_rows, int inter, float alpha, float limit, fp8::Mode mode,
                                 const float* __restrict__ static_scale, int64_t scale_cols, void* __restrict__ out,
                                 float* __restrict__ out_scales) {
  constexpr bool kGated = mb::is_gated(ACT);
  constexpr int kWarps = kGroupItemThreads / 32;
  const int lane = threadIdx.x % 32;
  const int64_t units = inter / fp8::kVec;
  const int64_t pairs = group_pairs(inter);  // a warp's two groups an item
  const int64_t n1 = kGated ? 2 * static_cast<int64_t>(inter) : inter;
  const int64_t filled = __ldg(off + E);
  const int64_t items = (filled < max_rows ? filled : max_rows) * pairs;  // rows past off[E]: other nodes' experts
  const float static_s = mode == fp8::kStatic ? *static_scale : 0.0f;
  const float static_y = mode == fp8::kStatic ? __frcp_rn(static_s) : 0.0f;
  const uint4 zero{0u, 0u, 0u, 0u};
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; it < items;
       it += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t p = it / pairs;
    const int64_t u = (it - p * pairs) * 2 * fp8::kGroupLanes + lane;  // lanes 0-15 group 2j, 16-31 group 2j + 1
    const bool mine = u < units;
    const uint4* row = reinterpret_cast<const uint4*>(in + p * n1);
    uint4 x = mine ? __ldcs(row + u) : zero;
    const T* bias = b1 ? b1 + warp_expert_of(off, E, p) * n1 : nullptr;  // every lane (warp_expert_of is the warp's)
    if ((ACT != MB_ACT_IDENTITY || bias) && mine) {
      const uint4 up = kGated ? __ldcs(row + units + u) : zero;
      x = activated_unit<T, ACT>(x, up, bias, u, inter, true, alpha, limit);
    }
    const fp8::OutRow<T, false> dst(out, out_scales, p, inter, scale_cols);
    if (mode == fp8::kStatic) {
      if (u == 0) dst.scale(0, static_s);
      if (mine) dst.unit(u, inter, true, fp8::quantize_unit_by<T>(x, static_s, static_y), static_s);
      continue;
    }
    // every lane reaches the group's shuffles; lanes past the row hold zeros
    const float s = fp8::dynamic_scale(mb::lanes_max<fp8::kGroupLanes>(fp8::unit_amax_packed<T>(x)));
    if (mine) {
      if (u % fp8::kGroupLanes == 0) dst.scale(u / fp8::kGroupLanes, s);
      dst.unit(u, inter, true, fp8::quantize_unit_by<T>(x, s, __frcp_rn(s)), s);
    }
  }
}

// Launches the group-item kernel (MB_STEP_GROUP_ITEMS) where the scale is static or per group and there is no
// pre-quant scale; refused elsewhere, and in the dequantized form (which reaches it with per-row scales only: with a
// static scale it runs the 16-bit activation's kernel). The planner gives it where the call's rows are fewer than the
// GPU's SMs.
template <typename T, int ACT, bool kDequantized>
mb_status launch_group_items(const char* who, bool whole, const T* in, const T* b1, const int64_t* off, int E,
                             int64_t max_rows, int inter, float alpha, float limit, const float* prequant_scale,
                             fp8::Mode mode, const float* static_scale, int64_t scale_cols, void* out,
                             float* out_scales, cudaStream_t stream) {
  if (!(whole && !kDequantized && prequant_scale == nullptr && mode != fp8::kPerRow))
    return mb::fail(MB_ERR_UNSUPPORTED,
                    "%s: tactic group_items takes whole units, a static or per-group scale, no pre-quant scale and "
                    "e4m3 bytes out", who);
  auto kernel = fc1_activation_fp8_groups_kernel<T, ACT>;
  const int64_t warps = max_rows * group_pairs(inter);
  const int64_t blocks = (warps + kGroupItemThreads / 32 - 1) / (kGroupItemThreads / 32);
  const int64_t resident = mb::resident_blocks(kernel, kGroupItemThreads, 0);
  kernel<<<static_cast<unsigned>(blocks < resident ? blocks : resident), kGroupItemThreads, 0, stream>>>(
      in, b1, off, E, max_rows, inter, alpha, limit, mode, static_scale, scale_cols, out, out_scales);
  return mb::check_launch("fc1_activation_fp8_groups_kernel");
}

// Launches the staged kernel (MB_STEP_STAGED_ROWS) with a ring of three rows where they fit a block's shared memory,
// else two; refused where two do not fit (rows wider than about 28K gated columns) or the units are not whole.
template <typename T, int ACT, bool kDequantized>
mb_status launch_staged(const char* who, bool whole, const T* in, const T* b1, const int64_t* off, int E,
                        int64_t max_rows, int inter, float alpha, float limit, const float* prequant_scale,
                        fp8::Mode mode, const float* static_scale, int64_t scale_cols, void* out, float* out_scales,
                        cudaStream_t stream) {
  const int64_t units = inter / fp8::kVec;
  const size_t stage_bytes = static_cast<size_t>(mb::is_gated(ACT) ? 2 * units : units) * 16;
  constexpr size_t kStaticBytes = 32 * sizeof(float);  // fp8::block_max's static array
  const size_t limit_bytes =
      static_cast<size_t>(mb::device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)) - kStaticBytes;
  const size_t sm_bytes = static_cast<size_t>(mb::device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor));
  if (!(whole && 2 * stage_bytes <= limit_bytes))
    return mb::fail(MB_ERR_UNSUPPORTED,
                    "%s: tactic staged_rows takes whole units and a ring of two rows (%zu bytes) within a block's %zu "
                    "bytes of shared memory (inter %d)", who, 2 * stage_bytes, limit_bytes, inter);
  auto go = [&](auto kernel, int stages) -> mb_status {
    const size_t smem = stages * stage_bytes;
    const int threads = staged_threads(units, 2 * smem > sm_bytes);
    // past the 48 KB a block gets by default with its static array (a gated row of 4096 columns: 3 x 16 KB)
    if (smem + kStaticBytes > 48 * 1024) {
      const cudaError_t err =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (err != cudaSuccess)
        return mb::fail(MB_ERR_CUDA, "%s: shared memory %zu bytes: %s", who, smem, cudaGetErrorString(err));
    }
    const int64_t resident = mb::resident_blocks(kernel, threads, smem);
    const unsigned grid = static_cast<unsigned>(max_rows < resident ? max_rows : resident);
    kernel<<<grid, threads, smem, stream>>>(in, b1, off, E, max_rows, inter, alpha, limit, prequant_scale, mode,
                                            static_scale, scale_cols, out, out_scales);
    return mb::check_launch("fc1_activation_fp8_staged_kernel");
  };
  if (3 * stage_bytes <= limit_bytes) return go(fc1_activation_fp8_staged_kernel<T, ACT, 3, kDequantized>, 3);
  return go(fc1_activation_fp8_staged_kernel<T, ACT, 2, kDequantized>, 2);
}

// The argument checks both activation entry points make.
mb_status check_arguments(const char* who, const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                          int inter, int activation, float swiglu_alpha, float swiglu_limit) {
  MB_REQUIRE(num_experts >= 1, "%s: num_experts must be >= 1, got %d", who, num_experts);
  MB_REQUIRE(max_rows >= 0, "%s: max_rows must be >= 0, got %lld", who, static_cast<long long>(max_rows));
  MB_REQUIRE(inter >= 1, "%s: inter must be >= 1, got %d", who, inter);
  MB_REQUIRE(activation >= MB_ACT_IDENTITY && activation <= MB_ACT_SWIGLU_CLAMP,
             "%s: activation %d is not in [0, 6]", who, activation);
  if (activation == MB_ACT_SWIGLU_CLAMP) {
    MB_REQUIRE(swiglu_limit > 0.0f, "%s: swiglu_limit must be > 0 (inf for none), got %g", who, swiglu_limit);
    MB_REQUIRE(swiglu_alpha == swiglu_alpha, "%s: swiglu_alpha is NaN", who);
  }
  MB_REQUIRE(expert_first_token_offset, "%s: expert_first_token_offset must be non-NULL", who);
  return MB_OK;
}

// gate_up_interleaved: a gated activation over whole blocks of 8 features.
mb_status check_interleaved(const char* who, int inter, int activation, bool gate_up_interleaved) {
  MB_REQUIRE(!gate_up_interleaved || (mb::is_gated(activation) && inter % 8 == 0),
             "%s: gate_up_interleaved needs a gated activation and inter a multiple of 8 (activation %d, inter %d)",
             who, activation, inter);
  return MB_OK;
}

// The step tactic: one of mb_step_tactic's four.
mb_status check_tactic(const char* who, int tactic) {
  MB_REQUIRE(tactic >= MB_STEP_BLOCK_ROWS && tactic <= MB_STEP_GROUP_ITEMS,
             "%s: tactic %d is not an mb_step_tactic (block_rows 0, warp_rows 1, staged_rows 2, group_items 3)", who,
             tactic);
  return MB_OK;
}

// Calls f(std::integral_constant<int, activation>{}) (activation checked by check_arguments).
template <typename F>
mb_status dispatch_activation(int activation, F&& f) {
  switch (activation) {
    case MB_ACT_IDENTITY: return f(std::integral_constant<int, MB_ACT_IDENTITY>{});
    case MB_ACT_RELU: return f(std::integral_constant<int, MB_ACT_RELU>{});
    case MB_ACT_SILU: return f(std::integral_constant<int, MB_ACT_SILU>{});
    case MB_ACT_GELU: return f(std::integral_constant<int, MB_ACT_GELU>{});
    case MB_ACT_SWIGLU: return f(std::integral_constant<int, MB_ACT_SWIGLU>{});
    case MB_ACT_GEGLU: return f(std::integral_constant<int, MB_ACT_GEGLU>{});
    default: return f(std::integral_constant<int, MB_ACT_SWIGLU_CLAMP>{});
  }
}

// mb_fc1_activation, and with fp8_scale non-NULL mb_fc1_activation_fp8_dequantized.
mb_status fc1_activation(const char* who, const void* in, int dtype, const void* b1,
                         const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows, int inter,
                         int activation, bool gate_up_interleaved, float swiglu_alpha, float swiglu_limit,
                         const float* prequant_scale, const float* fp8_scale, void* out, cudaStream_t stream) {
  MB_TRY(check_arguments(who, expert_first_token_offset, num_experts, max_rows, inter, activation, swiglu_alpha,
                         swiglu_limit));
  MB_TRY(check_interleaved(who, inter, activation, gate_up_interleaved));
  if (max_rows == 0) return mb::dispatch_dtype(dtype, who, [](auto) { return MB_OK; });
  MB_REQUIRE(in && out, "%s: in and out must be non-NULL", who);

  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = 16 / sizeof(T);
    const bool wide = mb::vec_width<T>(inter, {in, b1, prequant_scale, out}) == kWide;
    const int64_t nvec = wide ? inter / kWide : inter;
    const mb::StageLaunch shape = mb::stage_launch(max_rows, nvec, kBatch);
    auto launch = [&](auto act_const, auto vec_const, auto fp8_const) {
      constexpr int ACT = decltype(act_const)::value;
      constexpr int VEC = decltype(vec_const)::value;
      constexpr bool FP8 = decltype(fp8_const)::value;
      fc1_activation_kernel<T, ACT, VEC, FP8><<<shape.grid, mb::kStageThreads, 0, stream>>>(
          static_cast<const T*>(in), static_cast<const T*>(b1), expert_first_token_offset, num_experts, max_rows,
          inter, shape.vpl, shape.chunks, swiglu_alpha, swiglu_limit, prequant_scale, fp8_scale,
          GatedColumns{inter, gate_up_interleaved}, static_cast<T*>(out));
      return mb::check_launch("fc1_activation_kernel");
    };
    auto widths = [&](auto act_const, auto fp8_const) {
      return wide ? launch(act_const, std::integral_constant<int, kWide>{}, fp8_const)
                  : launch(act_const, std::integral_constant<int, 1>{}, fp8_const);
    };
    return dispatch_activation(activation, [&](auto act_const) {
      return fp8_scale ? widths(act_const, std::true_type{}) : widths(act_const, std::false_type{});
    });
  });
}

// mb_fc1_activation_fp8, and (kDequantized: the rows stored as 16-bit values, no scales)
// mb_fc1_activation_fp8_dequantized with per-row scales.
template <bool kDequantized>
mb_status fc1_activation_quantized(const char* who, const void* in, int dtype, const void* b1,
                                   const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                                   int inter, int activation, float swiglu_alpha, float swiglu_limit,
                                   const float* prequant_scale, const float* static_scale, int group, void* out,
                                   float* out_scales, int tactic, cudaStream_t stream) {
  MB_TRY(check_arguments(who, expert_first_token_offset, num_experts, max_rows, inter, activation, swiglu_alpha,
                         swiglu_limit));
  MB_TRY(check_tactic(who, tactic));
  fp8::Mode mode;
  MB_TRY(fp8::mode_of(static_scale, group, who, &mode));
  if (max_rows == 0) return fp8::dispatch_half(dtype, who, [](auto) { return MB_OK; });
  MB_REQUIRE(in && out, "%s: in and out must be non-NULL", who);
  MB_REQUIRE(kDequantized || out_scales, "%s: out_scales must be non-NULL", who);

  return fp8::dispatch_half(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool whole = kDequantized ? fp8::whole_units(inter, {in, b1, prequant_scale, out}, {})
                                    : fp8::whole_units(inter, {in, b1, prequant_scale}, {out});
    const int threads = fp8::row_threads(inter);
    const int64_t scale_cols = fp8::scale_cols(mode, inter);
    return dispatch_activation(activation, [&](auto act_const) {
      constexpr int ACT = decltype(act_const)::value;
      const T* x = static_cast<const T*>(in);
      const T* bias = static_cast<const T*>(b1);
      switch (tactic) {
        case MB_STEP_GROUP_ITEMS:
          return launch_group_items<T, ACT, kDequantized>(who, whole, x, bias, expert_first_token_offset, num_experts,
                                                          max_rows, inter, swiglu_alpha, swiglu_limit, prequant_scale,
                                                          mode, static_scale, scale_cols, out, out_scales, stream);
        case MB_STEP_WARP_ROWS:
          return launch_warp_rows<T, ACT, kDequantized>(who, whole, x, bias, expert_first_token_offset, num_experts,
                                                        max_rows, inter, swiglu_alpha, swiglu_limit, prequant_scale,
                                                        mode, static_scale, scale_cols, out, out_scales, stream);
        case MB_STEP_STAGED_ROWS:
          return launch_staged<T, ACT, kDequantized>(who, whole, x, bias, expert_first_token_offset, num_experts,
                                                     max_rows, inter, swiglu_alpha, swiglu_limit, prequant_scale,
                                                     mode, static_scale, scale_cols, out, out_scales, stream);
        default:
          break;
      }
      fc1_activation_fp8_kernel<T, ACT, kDequantized><<<mb::row_grid(max_rows), threads, 0, stream>>>(
          x, bias, expert_first_token_offset, num_experts, max_rows,
          inter, swiglu_alpha, swiglu_limit, prequant_scale, mode, whole, static_scale, scale_cols, out, out_scales);
      return mb::check_launch("fc1_activation_fp8_kernel");
    });
  });
}

}  // namespace

extern "C" mb_status mb_fc1_activation(const void* in, int dtype, const void* b1,
                                       const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                                       int inter, int activation, int gate_up_interleaved, float swiglu_alpha,
                                       float swiglu_limit, const float* prequant_scale, void* out,
                                       cudaStream_t stream) {
  return fc1_activation("mb_fc1_activation", in, dtype, b1, expert_first_token_offset, num_experts, max_rows, inter,
                        activation, gate_up_interleaved != 0, swiglu_alpha, swiglu_limit, prequant_scale, nullptr,
                        out, stream);
}

extern "C" mb_status mb_fc1_activation_fp8_dequantized(const void* in, int dtype, const void* b1,
                                                       const int64_t* expert_first_token_offset, int num_experts,
                                                       int64_t max_rows, int inter, int activation,
                                                       int gate_up_interleaved, float swiglu_alpha,
                                                       float swiglu_limit, const float* prequant_scale,
                                                       const float* static_scale, void* out, int tactic,
                                                       cudaStream_t stream) {
  const char* who = "mb_fc1_activation_fp8_dequantized";
  // per-row scales: the FP8 row kernels read gate and up stacked (a W4AFP8 layer with them runs no gated epilogue)
  MB_REQUIRE(static_scale != nullptr || gate_up_interleaved == 0,
             "%s: gate_up_interleaved takes a static scale (per-row scales read gate and up stacked)", who);
  if (static_scale == nullptr)
    return fc1_activation_quantized<true>(who, in, dtype, b1, expert_first_token_offset, num_experts, max_rows, inter,
                                          activation, swiglu_alpha, swiglu_limit, prequant_scale, nullptr, 0, out,
                                          nullptr, tactic, stream);
  MB_TRY(check_tactic(who, tactic));
  if (tactic != MB_STEP_BLOCK_ROWS)
    return mb::fail(MB_ERR_UNSUPPORTED, "%s: with a static scale the 16-bit activation's kernel runs: tactic "
                    "block_rows (0), got %d", who, tactic);
  return fc1_activation(who, in, dtype, b1, expert_first_token_offset, num_experts, max_rows, inter, activation,
                        gate_up_interleaved != 0, swiglu_alpha, swiglu_limit, prequant_scale, static_scale, out,
                        stream);
}

extern "C" mb_status mb_fc1_activation_fp8(const void* in, int dtype, const void* b1,
                                           const int64_t* expert_first_token_offset, int num_experts,
                                           int64_t max_rows, int inter, int activation, float swiglu_alpha,
                                           float swiglu_limit, const float* prequant_scale,
                                           const float* static_scale, int group, uint8_t* out, float* out_scales,
                                           int tactic, cudaStream_t stream) {
  return fc1_activation_quantized<false>("mb_fc1_activation_fp8", in, dtype, b1, expert_first_token_offset,
                                         num_experts, max_rows, inter, activation, swiglu_alpha, swiglu_limit,
                                         prequant_scale, static_scale, group, out, out_scales, tactic, stream);
}

extern "C" mb_status mb_fc1_activation_digits(const void* in, int dtype, const void* b1,
                                              const int64_t* expert_first_token_offset, int num_experts,
                                              int64_t max_rows, int inter, int activation,
                                              int gate_up_interleaved, float swiglu_alpha, float swiglu_limit,
                                              const float* prequant_scale, const float* fp8_static_scale,
                                              int fp8_row_scale, int group, uint8_t* out, cudaStream_t stream) {
  const char* who = "mb_fc1_activation_digits";
  MB_TRY(check_arguments(who, expert_first_token_offset, num_experts, max_rows, inter, activation, swiglu_alpha,
                         swiglu_limit));
  MB_TRY(check_interleaved(who, inter, activation, gate_up_interleaved != 0));
  MB_TRY(mb::check_digits_rows(who, "inter", inter, group, dtype));
  if (fp8_row_scale != 0) MB_TRY(mb::check_row_scale_digits(who, "inter", inter, fp8_static_scale));
  if (max_rows == 0) return MB_OK;
  MB_REQUIRE(in && out, "%s: in and out must be non-NULL", who);
  auto aligned = [](const void* p, uintptr_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; };
  MB_REQUIRE(aligned(in, 8) && aligned(b1, 8) && aligned(prequant_scale, 16) && aligned(out, 16),
             "%s: in and b1 must be 8-byte, prequant_scale and out 16-byte aligned", who);
  const int64_t items = max_rows * mb::digit_groups(inter);
  const unsigned blocks = mb::row_grid((items + kDigitWarps - 1) / kDigitWarps);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    return dispatch_activation(activation, [&](auto act_const) {
      if (fp8_row_scale != 0) {
        return mb::by_row_digits_groups(inter, [&](auto groups_const) {
          return mb::check_launch("fc1_activation_digits_row_scale_kernel", mb::launch_after_trigger(
              fc1_activation_digits_row_scale_kernel<T, decltype(act_const)::value, decltype(groups_const)::value>,
              dim3(mb::row_grid(max_rows)), dim3(mb::row_digits_threads(inter)), stream, static_cast<const T*>(in),
              static_cast<const T*>(b1), expert_first_token_offset, num_experts, max_rows, inter, swiglu_alpha,
              swiglu_limit, prequant_scale, GatedColumns{inter, gate_up_interleaved != 0}, mb::digit_order(group),
              out));
        });
      }
      return mb::check_launch("fc1_activation_digits_kernel", mb::launch_after_trigger(
          fc1_activation_digits_kernel<T, decltype(act_const)::value>, dim3(blocks), dim3(kDigitWarps * 32), stream,
          static_cast<const T*>(in), static_cast<const T*>(b1), expert_first_token_offset, num_experts, max_rows,
          inter, swiglu_alpha, swiglu_limit, prequant_scale, fp8_static_scale,
          GatedColumns{inter, gate_up_interleaved != 0}, mb::digit_order(group), out));
    });
  };
  return dtype == MB_FP16 ? launch(__half{}) : launch(__nv_bfloat16{});
}
