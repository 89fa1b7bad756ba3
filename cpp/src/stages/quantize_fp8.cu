// FP8 quantization of rows, the unfused step: out[r] = e4m3(in[r] (* prequant_scale) / s) and out_scales[r], by
// common/fp8_quantize.cuh's rule (moe_build/weights/fp8.py's quantize_rows, bit for bit). The layer's plan
// takes it before mb_expand_rows_fp8_prequantized where the tokens are quantized once and their bytes
// expanded, instead of mb_expand_rows_fp8 quantizing as it expands; W4AFP8 layers take it with the AWQ pre-quant
// scale where the plan leaves that scale out of the expansion (expand_rows=plain) or out of the activation
// (fc2_prequant=separate): the same numbers as the fused kernels, one kernel later.
// A block per row (blocks stride over the rows), as fp8::quantize_row describes. It is launched after a
// trigger and starts with mb::chain_start(), as the rest of the routing and expansion chain.
#include "common/common.cuh"
#include "common/fp8_quantize.cuh"

namespace {

namespace fp8 = mb::fp8;

template <typename T>
__global__ void __launch_bounds__(fp8::kMaxThreads)
quantize_fp8_kernel(const T* __restrict__ in, int64_t rows, int cols, const float* __restrict__ prequant,
                    fp8::Mode mode, bool whole, const float* __restrict__ static_scale, int64_t scale_cols,
                    uint8_t* __restrict__ out, float* __restrict__ out_scales) {
  mb::chain_start();
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    fp8::RowSource<T> src{in + r * cols, cols, whole};
    const fp8::RowDest<T, false> dst{fp8::OutRow<T, false>(out, out_scales, r, cols, scale_cols), cols, whole};
    fp8::quantize_row<T>(src, dst, cols, mode, static_scale, prequant, whole);
  }
}

}  // namespace

extern "C" mb_status mb_quantize_fp8(const void* in, int dtype, int64_t rows, int cols, const float* prequant_scale,
                                     const float* static_scale, int group, uint8_t* out, float* out_scales,
                                     cudaStream_t stream) {
  const char* who = "mb_quantize_fp8";
  MB_REQUIRE(rows >= 0, "%s: rows must be >= 0, got %lld", who, static_cast<long long>(rows));
  MB_REQUIRE(cols >= 1, "%s: cols must be >= 1, got %d", who, cols);
  fp8::Mode mode;
  MB_TRY(fp8::mode_of(static_scale, group, who, &mode));
  if (rows == 0) return fp8::dispatch_half(dtype, who, [](auto) { return MB_OK; });
  MB_REQUIRE(in && out && out_scales, "%s: in, out and out_scales must be non-NULL", who);
  return fp8::dispatch_half(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return mb::check_launch("quantize_fp8_kernel", mb::launch_after_trigger(
        quantize_fp8_kernel<T>, dim3(mb::row_grid(rows)), dim3(fp8::row_threads(cols)), stream,
        static_cast<const T*>(in), rows, cols, prequant_scale, mode,
        fp8::whole_units(cols, {in, prequant_scale}, {out}), static_scale,
        fp8::scale_cols(mode, cols), out, out_scales));
  });
}
