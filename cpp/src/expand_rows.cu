// Expand rows: permuted_input[p] = input[e / K] (* prequant_scale, AWQ's FC1 pre-quant scale,
// fused here so the activations are read once), permuted_weights[p] = topk_weights[e], with
// e = permuted_to_unpermuted[p]. One block per permuted row; each thread moves 16-byte vectors
// when the row length and the pointers allow it (VEC > 1), else single elements.
// zero_out (the [T, H] output that GEMM2's finalize epilogue accumulates into) is zeroed here by
// the blocks of rows p < T, so the layer needs no separate memset launch before GEMM2: T*K >= T
// blocks run anyway, and T more rows of stores are small next to the T*K rows copied.
#include "common.cuh"

namespace {

constexpr int kThreads = 128;

template <typename T, int VEC, bool SCALE>
__global__ void __launch_bounds__(kThreads)
expand_rows_kernel(const T* __restrict__ input, const int32_t* __restrict__ permuted_to_unpermuted,
                   const float* __restrict__ topk_weights, const float* __restrict__ prequant_scale,
                   int64_t rows, int num_tokens, int hidden, int top_k, T* __restrict__ permuted_input,
                   float* __restrict__ permuted_weights, T* __restrict__ zero_out) {
  for (int64_t p = blockIdx.x; p < rows; p += gridDim.x) {
    if (zero_out != nullptr && p < num_tokens) {
      const mb::Vec<T, VEC> zero{};
      for (int h = threadIdx.x * VEC; h < hidden; h += kThreads * VEC) {
        *reinterpret_cast<mb::Vec<T, VEC>*>(zero_out + p * hidden + h) = zero;
      }
    }
    const int64_t e = permuted_to_unpermuted[p];
    if (threadIdx.x == 0) permuted_weights[p] = topk_weights[e];
    const T* src = input + (e / top_k) * hidden;
    T* dst = permuted_input + p * hidden;
    for (int h = threadIdx.x * VEC; h < hidden; h += kThreads * VEC) {
      if constexpr (SCALE) {
        float x[VEC], s[VEC];
        mb::load_f32<T, VEC>(src + h, x);
        mb::load_f32<float, VEC>(prequant_scale + h, s);
#pragma unroll
        for (int i = 0; i < VEC; ++i) x[i] *= s[i];
        mb::store_f32<T, VEC>(dst + h, x);
      } else {
        // A plain copy: move the bits, no conversion.
        *reinterpret_cast<mb::Vec<T, VEC>*>(dst + h) = *reinterpret_cast<const mb::Vec<T, VEC>*>(src + h);
      }
    }
  }
}

}  // namespace

extern "C" mb_status mb_expand_rows(const void* input, int dtype, const int32_t* permuted_to_unpermuted,
                                    const float* topk_weights, const float* prequant_scale, int num_tokens,
                                    int hidden, int top_k, void* permuted_input, float* permuted_weights,
                                    void* zero_out, cudaStream_t stream) {
  const char* who = "mb_expand_rows";
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(hidden >= 1, "%s: hidden must be >= 1, got %d", who, hidden);
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  const int64_t rows = static_cast<int64_t>(num_tokens) * top_k;
  if (rows == 0) return mb::dispatch_dtype(dtype, who, [](auto) { return MB_OK; });
  MB_REQUIRE(input && permuted_to_unpermuted && topk_weights && permuted_input && permuted_weights,
             "%s: input, permuted_to_unpermuted, topk_weights, permuted_input and permuted_weights must be "
             "non-NULL", who);
  if (zero_out != nullptr) {
    // Other blocks may still be reading input rows while a block zeroes its output row.
    const size_t elem = mb::dtype_size(dtype);
    const auto in0 = reinterpret_cast<uintptr_t>(input), out0 = reinterpret_cast<uintptr_t>(zero_out);
    const size_t bytes = static_cast<size_t>(num_tokens) * hidden * elem;
    MB_REQUIRE(out0 + bytes <= in0 || in0 + bytes <= out0, "%s: zero_out must not overlap input", who);
  }
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int vec = mb::vec_width<T>(hidden, {input, permuted_input, prequant_scale, zero_out});
    const unsigned grid = mb::row_grid(rows);
    auto launch = [&](auto vec_const, auto scale_const) {
      constexpr int VEC = decltype(vec_const)::value;
      constexpr bool SCALE = decltype(scale_const)::value;
      expand_rows_kernel<T, VEC, SCALE><<<grid, kThreads, 0, stream>>>(
          static_cast<const T*>(input), permuted_to_unpermuted, topk_weights, prequant_scale, rows, num_tokens,
          hidden, top_k, static_cast<T*>(permuted_input), permuted_weights, static_cast<T*>(zero_out));
      return mb::check_launch("expand_rows_kernel");
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
