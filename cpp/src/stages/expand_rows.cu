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
#include "common/common.cuh"

namespace {

constexpr int kBatch = 8;         // vectors per lane in flight: 8 x 16 B, a 2048-wide bf16 row per warp

template <typename T, int VEC, bool SCALE>
__global__ void __launch_bounds__(mb::kStageThreads)
expand_rows_kernel(const T* __restrict__ input, const int32_t* __restrict__ unpermuted_to_permuted,
                   const float* __restrict__ topk_weights, const float* __restrict__ prequant_scale,
                   int num_tokens, int hidden, int top_k, int vpl, int64_t chunks, T* __restrict__ permuted_input,
                   float* __restrict__ permuted_weights, T* __restrict__ zero_out) {
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
      if constexpr (SCALE) {
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          if (!mine(i)) continue;
          float f[VEC], s[VEC];
          mb::load_f32<float, VEC>(prequant_scale + (v0 + i * 32) * VEC, s);
#pragma unroll
          for (int k = 0; k < VEC; ++k) f[k] = mb::raw_f32<T>(x[i], k) * s[k];
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

}  // namespace

extern "C" mb_status mb_expand_rows(const void* input, int dtype, const int32_t* unpermuted_to_permuted,
                                    const float* topk_weights, const float* prequant_scale, int num_tokens,
                                    int hidden, int top_k, void* permuted_input, float* permuted_weights,
                                    void* zero_out, cudaStream_t stream) {
  const char* who = "mb_expand_rows";
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(hidden >= 1, "%s: hidden must be >= 1, got %d", who, hidden);
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  const int64_t rows = static_cast<int64_t>(num_tokens) * top_k;
  if (rows == 0) return mb::dispatch_dtype(dtype, who, [](auto) { return MB_OK; });
  MB_REQUIRE(input && unpermuted_to_permuted && topk_weights && permuted_input && permuted_weights,
             "%s: input, unpermuted_to_permuted, topk_weights, permuted_input and permuted_weights must be "
             "non-NULL", who);
  if (zero_out != nullptr) {
    // Other warps may still be reading input rows while a warp zeroes its output row.
    const size_t elem = mb::dtype_size(dtype);
    const auto in0 = reinterpret_cast<uintptr_t>(input), out0 = reinterpret_cast<uintptr_t>(zero_out);
    const size_t bytes = static_cast<size_t>(num_tokens) * hidden * elem;
    MB_REQUIRE(out0 + bytes <= in0 || in0 + bytes <= out0, "%s: zero_out must not overlap input", who);
  }
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int vec = mb::vec_width<T>(hidden, {input, permuted_input, prequant_scale, zero_out});
    const int64_t nvec = hidden / vec;
    mb::StageLaunch shape = mb::stage_launch(num_tokens, nvec, kBatch);
    // Decode sizes: too few (token, chunk) units to spread over the SMs, so each of a token's K
    // permuted rows gets its own warps, as in a per-row copy.
    if (static_cast<int64_t>(num_tokens) * shape.chunks < mb::kMinStageWarps) shape.grid.z = top_k < 32 ? top_k : 32;
    auto launch = [&](auto vec_const, auto scale_const) {
      constexpr int VEC = decltype(vec_const)::value;
      constexpr bool SCALE = decltype(scale_const)::value;
      return mb::check_launch("expand_rows_kernel", mb::launch_after_trigger(
          expand_rows_kernel<T, VEC, SCALE>, shape.grid, dim3(mb::kStageThreads), stream, static_cast<const T*>(input),
          unpermuted_to_permuted, topk_weights, prequant_scale, num_tokens, hidden, top_k, shape.vpl, shape.chunks,
          static_cast<T*>(permuted_input), permuted_weights, static_cast<T*>(zero_out)));
    };
    constexpr int kWide = 16 / sizeof(T);
    using Wide = std::integral_constant<int, kWide>;
    using One = std::integral_constant<int, 1>;
    if (prequant_scale) {
      return vec == kWide ? launch(Wide{}, std::true_type{}) : launch(One{}, std::true_type{});
    }
    return vec == kWide ? launch(Wide{}, std::false_type{}) : launch(One{}, std::false_type{});
  });
}
