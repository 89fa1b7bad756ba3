// The grouped problem shape of every wgmma GEMM (gemm/sm90_dispatch.cuh, gemm/fp8_sm90.cu): read on the
// device from the expert offsets, no host copy.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"

namespace mbk {

// CUTLASS's grouped problem shape (the interface of cutlass::gemm::GroupProblemShape) computed from
// the expert offsets: group g is (offsets[g + 1] - offsets[g]) x n x k, or with kTransposed n x (offsets[g + 1] -
// offsets[g]) x k (the weight-only wgmma GEMM, gemm/woq_sm90.cu, which runs transposed: the weights are wgmma's A).
// The scheduler reads these two offsets and StaticMapMainloop the first, where CUTLASS's GroupProblemShape reads a
// per-group shape array (and its mainloop per-group pointer arrays) that a kernel would have to write before every
// GEMM.
template <bool kTransposed>
struct OffsetsProblemShapeOf {
  using UnderlyingProblemShape = cute::Shape<int, int, int>;
  int32_t num_groups = 1;
  const int64_t* offsets = nullptr;  // device, [num_groups + 1]
  int n = 0, k = 0;

  CUTLASS_HOST_DEVICE int32_t groups() const { return num_groups; }
  CUTLASS_DEVICE UnderlyingProblemShape const get_problem_shape(int32_t g) const {
    const int rows = static_cast<int>(offsets[g + 1] - offsets[g]);
    if constexpr (kTransposed) {
      return {n, rows, k};
    } else {
      return {rows, n, k};
    }
  }
  // No host copy: CUTLASS then sizes a persistent grid and skips its host-side shape checks.
  CUTLASS_HOST_DEVICE UnderlyingProblemShape const get_host_problem_shape(int32_t = 0) const { return {}; }
  CUTLASS_HOST_DEVICE bool is_host_problem_shape_available() const { return false; }
};
using OffsetsProblemShape = OffsetsProblemShapeOf<false>;
using TransposedOffsetsProblemShape = OffsetsProblemShapeOf<true>;
using ProblemShape = OffsetsProblemShape;

}  // namespace mbk
