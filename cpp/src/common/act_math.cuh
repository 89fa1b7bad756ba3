// The activation functions, one definition for every kernel that applies them: the separate
// activation kernel (stages/fc1_activation.cu) and the GEMM epilogues (gemm/mma.cuh's mma.sync tiles,
// gemm/decode.cu, gemm/sm90_epilogue.cuh's gated wgmma epilogue), so a fused and an unfused plan compute
// the same function. GELU / GEGLU use the tanh approximation
// 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), as the reference (moe_build/reference.py) and the
// GPT-2 style "gelu_new"/"gelu_pytorch_tanh" models do. SWIGLU = silu(gate) * up. SWIGLU_CLAMP
// (GPT-OSS): gate = min(gate, limit), up = clamp(up, -limit, limit),
// out = (up + 1) * gate * sigmoid(alpha * gate).
#pragma once

#include "moe_build_kernels.h"

namespace mb {

__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// Sigmoid from the hardware approximations (ex2.approx behind __expf, rcp.approx behind
// __fdividef): relative error near 1e-6, far inside the bf16/fp16 rounding of the output, in a
// handful of instructions where expf plus an IEEE divide take tens (the gated activation kernel
// is issue-bound on them at prefill). For x < -87 the divisor passes 2^126 and __fdividef returns 0,
// which is the sigmoid there to float precision. Routing keeps the exact sigmoid.
__device__ __forceinline__ float sigmoid_approx(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

constexpr bool is_gated(int act) {
  return act == MB_ACT_SWIGLU || act == MB_ACT_GEGLU || act == MB_ACT_SWIGLU_CLAMP;
}

// act(gate) for the plain activations, act(gate, up) for the gated ones (up is ignored otherwise).
template <int ACT>
__device__ __forceinline__ float act_apply(float gate, float up, float alpha, float limit) {
  if constexpr (ACT == MB_ACT_IDENTITY) return gate;
  if constexpr (ACT == MB_ACT_RELU) return fmaxf(gate, 0.0f);
  if constexpr (ACT == MB_ACT_SILU) return gate * sigmoid_approx(gate);
  if constexpr (ACT == MB_ACT_GELU) return gelu_tanh(gate);
  if constexpr (ACT == MB_ACT_SWIGLU) return gate * sigmoid_approx(gate) * up;
  if constexpr (ACT == MB_ACT_GEGLU) return gelu_tanh(gate) * up;
  if constexpr (ACT == MB_ACT_SWIGLU_CLAMP) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    return (up + 1.0f) * gate * sigmoid_approx(alpha * gate);
  }
}

// The same, with the activation known only at run time (the GEMM epilogues take it as a
// parameter rather than multiplying their instantiations by it).
__device__ __forceinline__ float act_apply_rt(int act, float gate, float up, float alpha, float limit) {
  switch (act) {
    case MB_ACT_RELU: return act_apply<MB_ACT_RELU>(gate, up, alpha, limit);
    case MB_ACT_SILU: return act_apply<MB_ACT_SILU>(gate, up, alpha, limit);
    case MB_ACT_GELU: return act_apply<MB_ACT_GELU>(gate, up, alpha, limit);
    case MB_ACT_SWIGLU: return act_apply<MB_ACT_SWIGLU>(gate, up, alpha, limit);
    case MB_ACT_GEGLU: return act_apply<MB_ACT_GEGLU>(gate, up, alpha, limit);
    case MB_ACT_SWIGLU_CLAMP: return act_apply<MB_ACT_SWIGLU_CLAMP>(gate, up, alpha, limit);
    default: return gate;
  }
}

}  // namespace mb
