// Activation over the permuted rows: out[p, :I] = act(in[p, :N1] + b1[expert(p)]) for p < off[E]
// (rows past off[E] belong to experts on other nodes and are neither read nor written).
// Gated activations read the gate from columns [0, I) and the up projection from [I, 2I).
//   GELU / GEGLU use the tanh approximation 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), as the
//   GPT-2 style "gelu_new"/"gelu_pytorch_tanh" models and the fused GEMM epilogues do.
//   SWIGLU = silu(gate) * up.  SWIGLU_CLAMP (GPT-OSS): gate = min(gate, limit),
//   up = clamp(up, -limit, limit), out = (up + 1) * gate * sigmoid(alpha * gate).
// prequant_scale (AWQ's FC2 pre-quant scale) multiplies the result here so GEMM2's input is
// written once. Blocks form a (row, column chunk) grid, each thread one 16-byte vector per chunk
// when the row length and pointers allow: at decode sizes there are only T*K rows (4 to 8 at
// T=1), and one block per row left each thread walking I/1024 vectors one after another.
#include "common.cuh"

namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

template <int ACT>
__device__ __forceinline__ float apply(float gate, float up, float alpha, float limit) {
  if constexpr (ACT == MB_ACT_IDENTITY) return gate;
  if constexpr (ACT == MB_ACT_RELU) return fmaxf(gate, 0.0f);
  if constexpr (ACT == MB_ACT_SILU) return gate * mb::sigmoid_f32(gate);
  if constexpr (ACT == MB_ACT_GELU) return gelu_tanh(gate);
  if constexpr (ACT == MB_ACT_SWIGLU) return gate * mb::sigmoid_f32(gate) * up;
  if constexpr (ACT == MB_ACT_GEGLU) return gelu_tanh(gate) * up;
  if constexpr (ACT == MB_ACT_SWIGLU_CLAMP) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    return (up + 1.0f) * gate * mb::sigmoid_f32(alpha * gate);
  }
}

constexpr bool is_gated(int act) {
  return act == MB_ACT_SWIGLU || act == MB_ACT_GEGLU || act == MB_ACT_SWIGLU_CLAMP;
}

// The expert owning permuted row p: the last x with off[x] <= p.
__device__ __forceinline__ int expert_of(const int64_t* off, int E, int64_t p) {
  int lo = 0, hi = E;  // invariant: off[lo] <= p < off[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (off[mid] <= p) lo = mid; else hi = mid;
  }
  return lo;
}

template <typename T, int ACT, int VEC>
__global__ void __launch_bounds__(kThreads)
activation_kernel(const T* __restrict__ in, const T* __restrict__ b1, const int64_t* __restrict__ off, int E,
                  int64_t max_rows, int inter, float alpha, float limit, const float* __restrict__ prequant_scale,
                  T* __restrict__ out) {
  constexpr bool kGated = is_gated(ACT);
  const int64_t n1 = kGated ? 2 * static_cast<int64_t>(inter) : inter;
  const int64_t valid = off[E] < max_rows ? off[E] : max_rows;
  for (int64_t p = blockIdx.x; p < valid; p += gridDim.x) {
    const T* row = in + p * n1;
    const T* bias = b1 ? b1 + expert_of(off, E, p) * n1 : nullptr;
    T* dst = out + p * inter;
    for (int j = (blockIdx.y * kThreads + threadIdx.x) * VEC; j < inter; j += gridDim.y * kThreads * VEC) {
      float gate[VEC], up[VEC], r[VEC];
      mb::load_f32<T, VEC>(row + j, gate);
      if constexpr (kGated) mb::load_f32<T, VEC>(row + inter + j, up);
      if (bias) {
        float bg[VEC];
        mb::load_f32<T, VEC>(bias + j, bg);
#pragma unroll
        for (int i = 0; i < VEC; ++i) gate[i] += bg[i];
        if constexpr (kGated) {
          float bu[VEC];
          mb::load_f32<T, VEC>(bias + inter + j, bu);
#pragma unroll
          for (int i = 0; i < VEC; ++i) up[i] += bu[i];
        }
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) r[i] = apply<ACT>(gate[i], kGated ? up[i] : 0.0f, alpha, limit);
      if (prequant_scale) {
        float s[VEC];
        mb::load_f32<float, VEC>(prequant_scale + j, s);
#pragma unroll
        for (int i = 0; i < VEC; ++i) r[i] *= s[i];
      }
      mb::store_f32<T, VEC>(dst + j, r);
    }
  }
}

}  // namespace

extern "C" mb_status mb_activation(const void* in, int dtype, const void* b1,
                                   const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                                   int inter, int activation, float swiglu_alpha, float swiglu_limit,
                                   const float* prequant_scale, void* out, cudaStream_t stream) {
  const char* who = "mb_activation";
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
  if (max_rows == 0) return mb::dispatch_dtype(dtype, who, [](auto) { return MB_OK; });
  MB_REQUIRE(in && out, "%s: in and out must be non-NULL", who);

  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = 16 / sizeof(T);
    const bool wide = mb::vec_width<T>(inter, {in, b1, prequant_scale, out}) == kWide;
    // One column chunk per block of kThreads vectors, so a row's chunks run side by side.
    const int64_t vec_elems = wide ? kWide : 1;
    const dim3 grid(mb::row_grid(max_rows), static_cast<unsigned>((inter + kThreads * vec_elems - 1) /
                                                                  (kThreads * vec_elems)));
    auto launch = [&](auto act_const, auto vec_const) {
      constexpr int ACT = decltype(act_const)::value;
      constexpr int VEC = decltype(vec_const)::value;
      activation_kernel<T, ACT, VEC><<<grid, kThreads, 0, stream>>>(
          static_cast<const T*>(in), static_cast<const T*>(b1), expert_first_token_offset, num_experts, max_rows,
          inter, swiglu_alpha, swiglu_limit, prequant_scale, static_cast<T*>(out));
      return mb::check_launch("activation_kernel");
    };
    auto by_width = [&](auto act_const) {
      return wide ? launch(act_const, std::integral_constant<int, kWide>{})
                  : launch(act_const, std::integral_constant<int, 1>{});
    };
    switch (activation) {
      case MB_ACT_IDENTITY: return by_width(std::integral_constant<int, MB_ACT_IDENTITY>{});
      case MB_ACT_RELU: return by_width(std::integral_constant<int, MB_ACT_RELU>{});
      case MB_ACT_SILU: return by_width(std::integral_constant<int, MB_ACT_SILU>{});
      case MB_ACT_GELU: return by_width(std::integral_constant<int, MB_ACT_GELU>{});
      case MB_ACT_SWIGLU: return by_width(std::integral_constant<int, MB_ACT_SWIGLU>{});
      case MB_ACT_GEGLU: return by_width(std::integral_constant<int, MB_ACT_GEGLU>{});
      default: return by_width(std::integral_constant<int, MB_ACT_SWIGLU_CLAMP>{});
    }
  });
}
