// Shared helpers of the stage kernels: dtype dispatch, fp32 conversions, 16-byte vectors,
// and the error capture behind mb_last_error(). Header-only so that every stage .cu stays
// one self-contained translation unit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "moe_build_kernels.h"

namespace mb {

// Records `msg` as the calling thread's last error (read back by mb_last_error) and returns
// `status`, so call sites read `return fail(MB_ERR_INVALID_ARGUMENT, "...")`.
mb_status fail(mb_status status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Programmatic dependent launch (sm_90): a kernel launched with launch_after_trigger() may start
// while its predecessor in the stream still runs, once every CTA of the predecessor has called
// let_dependents_start() (or exited). Before wait_for_predecessor() such a kernel may only read what
// launches before its predecessor wrote (they completed before the predecessor started) and
// memory nobody writes (weights); wait_for_predecessor() returns once the predecessor has completed
// and its writes are visible. Both are no-ops below sm_90 and for kernels launched without the
// attribute.
__device__ __forceinline__ void let_dependents_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// An attribute of the current device; 0 when it cannot be read (no device, a CUDA error). The attributes
// read here (compute capability, SM count, L2 size) are fixed for a device's lifetime and the launch paths
// read them at every launch, so each (device, attribute) is asked of the driver once.
inline int device_attribute(cudaDeviceAttr attr) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> known;
  const std::pair<int, int> key{dev, static_cast<int>(attr)};
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  int value = 0;
  if (cudaDeviceGetAttribute(&value, attr, dev) != cudaSuccess) return 0;
  known.emplace(key, value);
  return value;
}

// Blocks of `threads` threads and `smem` dynamic shared bytes that the current device holds at once: the grid of a
// persistent kernel whose blocks stride over the rows. One a SM where the occupancy cannot be read.
template <typename Kernel>
inline int64_t resident_blocks(Kernel kernel, int threads, size_t smem) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess || per_sm < 1)
    per_sm = 1;
  return static_cast<int64_t>(per_sm) * device_attribute(cudaDevAttrMultiProcessorCount);
}

// Launches kernel<<<grid, block, smem, stream>>>(args...), allowed to start early (programmatic stream
// serialization) where `after_trigger` is set and the current device supports it (compute capability
// >= 9.0); a plain launch otherwise.
template <typename... KArgs, typename... Args>
inline cudaError_t launch_after_trigger_smem(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                             cudaStream_t stream, bool after_trigger, Args&&... args) {
  if (after_trigger && device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  }
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
}
template <typename... KArgs, typename... Args>
inline cudaError_t launch_after_trigger(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t stream,
                                        Args&&... args) {
  return launch_after_trigger_smem(kernel, grid, block, 0, stream, true, std::forward<Args>(args)...);
}

// The routing and prologue chain (routing, the map builds, the expansion) is launched after a trigger
// and starts each kernel with wait_for_predecessor() then let_dependents_start(): a kernel's launch
// and block setup overlap its predecessor's body, and every read and write of what the predecessor writes comes
// after the wait. The trigger comes after the wait so that a dependent's CTAs start only once this kernel's
// predecessor has completed: the decode GEMM reads the expert offsets before its own wait (gemm/decode.cu), which
// holds only if the map build finished before the expansion (its predecessor) started running, and the FP8
// expansion reads and quantizes the tokens' rows before its wait (stages/expand_rows.cu; the digits expansion its
// first group), which holds because they were written before the map build, which waited for everything before it
// ahead of its trigger. One kernel triggers first: the digits activation (stages/fc1_activation.cu), whose dependent,
// GEMM2, reads ahead of its own wait only the offsets and weights, complete before GEMM1 launched.
__device__ __forceinline__ void chain_start() {
  wait_for_predecessor();
  let_dependents_start();
}

// The largest v over each aligned group of kLanes lanes (a power of two, at most 32), in every lane of the group:
// xor-shuffle rounds at kLanes / 2, ..., 1 lanes apart (every lane of the warp calls it). kLanes = 32: the warp's.
template <int kLanes = 32>
__device__ __forceinline__ float lanes_max(float v) {
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "lane groups are powers of two <= 32");
#pragma unroll
  for (int off = kLanes / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Every launch is followed by this: a bad configuration or an earlier asynchronous fault
// surfaces here as MB_ERR_CUDA naming the kernel, instead of silently later.
inline mb_status check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return fail(MB_ERR_CUDA, "%s: launch failed: %s (%s)", kernel, cudaGetErrorString(err),
                cudaGetErrorName(err));
  }
  return MB_OK;
}

// The same after a launch that reports its own error (launch_after_trigger: cudaLaunchKernelEx's
// result, or the plain launch's error, which reading it has already cleared).
inline mb_status check_launch(const char* kernel, cudaError_t launch_err) {
  if (launch_err != cudaSuccess) {
    return fail(MB_ERR_CUDA, "%s: launch failed: %s (%s)", kernel, cudaGetErrorString(launch_err),
                cudaGetErrorName(launch_err));
  }
  return check_launch(kernel);
}

#define MB_REQUIRE(cond, ...)                                   \
  do {                                                          \
    if (!(cond)) return ::mb::fail(MB_ERR_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

#define MB_TRY(expr)                    \
  do {                                  \
    const mb_status mb_s_ = (expr);     \
    if (mb_s_ != MB_OK) return mb_s_;   \
  } while (0)

// ---- element types --------------------------------------------------------------------------

template <typename T> struct TypeTag { using type = T; };

// Calls f(TypeTag<T>{}) with T the C++ type of `dtype`; MB_ERR_INVALID_ARGUMENT otherwise.
template <typename F>
mb_status dispatch_dtype(int dtype, const char* who, F&& f) {
  switch (dtype) {
    case MB_FP32: return f(TypeTag<float>{});
    case MB_FP16: return f(TypeTag<__half>{});
    case MB_BF16: return f(TypeTag<__nv_bfloat16>{});
    default: return fail(MB_ERR_INVALID_ARGUMENT, "%s: dtype %d is not one of fp32(0), fp16(1), bf16(2)", who, dtype);
  }
}

inline size_t dtype_size(int dtype) { return dtype == MB_FP32 ? 4 : 2; }

// Inclusive prefix sum over the 32 lanes of a warp (every lane must call it).
__device__ __forceinline__ int warp_inclusive_scan(int v) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int o = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += o;
  }
  return v;
}

// One round of the routing prologues' stable counting-sort scatter (every lane must call it): the
// lane holds expanded row e of expert `key` (key < 0: no row). Lanes of one expert take consecutive
// permuted rows from cursor[key] in lane order, write both maps, and the cursor moves past them;
// a warp walking its rows in order, one round per 32, keeps the sort stable in the expanded row.
__device__ __forceinline__ void place_round(int key, int e, int* cursor, int32_t* permuted_to_unpermuted,
                                            int32_t* unpermuted_to_permuted) {
  const int lane = threadIdx.x % 32;
  const unsigned same = __match_any_sync(0xffffffffu, key);
  const int before = __popc(same & ((1u << lane) - 1u));
  if (key >= 0) {
    const int p = cursor[key] + before;
    permuted_to_unpermuted[p] = e;
    unpermuted_to_permuted[e] = p;
  }
  __syncwarp();  // every lane has read the cursor before its group's first lane moves it
  if (key >= 0 && before == 0) cursor[key] += __popc(same);
  __syncwarp();
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// N elements of T moved as one aligned access: N = 16 / sizeof(T) gives the 16-byte loads the
// memory-bound stages want; N = 1 is the fallback for rows whose byte length is not a multiple
// of 16 (e.g. hidden 200 in fp32 is fine, hidden 100 in bf16 is not).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// Loads/stores N elements through fp32 in accesses of at most 16 bytes (so that e.g. 8 fp32
// scales matching 8 bf16 activations need only 16-byte alignment, not 32).
template <typename T, int N>
__device__ __forceinline__ void load_f32(const T* p, float (&out)[N]) {
  constexpr int kChunk = (16 / sizeof(T)) < N ? (16 / sizeof(T)) : N;
#pragma unroll
  for (int c = 0; c < N; c += kChunk) {
    const Vec<T, kChunk> x = *reinterpret_cast<const Vec<T, kChunk>*>(p + c);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) out[c + i] = to_f32(x.v[i]);
  }
}

// A 16-byte chunk goes out as one st.global.v4 instruction: stored as a Vec (or a uint4 built
// from one), the compiler split it into per-element stores, eight 2-byte writes per 16 bytes of
// bf16/fp16. `p` must point to global memory.
// STREAM: st.global.cs, the evict-first store (see streams_past_l2).
template <typename T, int N, bool STREAM = false>
__device__ __forceinline__ void store_f32(T* p, const float (&in)[N]) {
  constexpr int kChunk = (16 / sizeof(T)) < N ? (16 / sizeof(T)) : N;
#pragma unroll
  for (int c = 0; c < N; c += kChunk) {
    Vec<T, kChunk> x;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) x.v[i] = from_f32<T>(in[c + i]);
    if constexpr (kChunk * sizeof(T) == 16) {
      uint32_t w[4];
      memcpy(w, &x, sizeof(w));
      if constexpr (STREAM) {
        asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p + c), "r"(w[0]), "r"(w[1]), "r"(w[2]),
                     "r"(w[3])
                     : "memory");
      } else {
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p + c), "r"(w[0]), "r"(w[1]), "r"(w[2]),
                     "r"(w[3])
                     : "memory");
      }
    } else {
      *reinterpret_cast<Vec<T, kChunk>*>(p + c) = x;
    }
  }
}

// A vector's bits as loaded, 16-bit elements left packed in 32-bit words until they are used: held
// as a Vec of bf16, each element gets its own register right at the load (inside the load's branch
// when the load is conditional), which waits for the load, so a batch of loads goes out one at a
// time. Converted element by element by raw_f32.
template <typename T, int VEC>
using Raw = std::conditional_t<VEC == 1, T, uint4>;

// Element k of a raw vector, converted by to_f32 as an element of a Vec would be.
template <typename T>
__device__ __forceinline__ float raw_f32(T x, int) { return to_f32(x); }
template <typename T>
__device__ __forceinline__ float raw_f32(uint4 r, int k) {
  constexpr int kPerWord = 4 / sizeof(T);
  const int wi = k / kPerWord;
  const uint32_t w = wi == 0 ? r.x : wi == 1 ? r.y : wi == 2 ? r.z : r.w;
  if constexpr (std::is_same_v<T, float>) {
    return __uint_as_float(w);
  } else {
    const auto bits = static_cast<unsigned short>(k % 2 == 0 ? w & 0xffffu : w >> 16);  // little-endian
    if constexpr (std::is_same_v<T, __half>) return to_f32(__ushort_as_half(bits));
    else return to_f32(__ushort_as_bfloat16(bits));
  }
}

// The raw vector of N = VEC elements converted from fp32 (what store_f32 would write).
template <typename T, int VEC>
__device__ __forceinline__ Raw<T, VEC> raw_from_f32(const float (&in)[VEC]) {
  if constexpr (VEC == 1) {
    return from_f32<T>(in[0]);
  } else {
    Vec<T, VEC> x;
#pragma unroll
    for (int i = 0; i < VEC; ++i) x.v[i] = from_f32<T>(in[i]);
    uint4 r;
    memcpy(&r, &x, sizeof(r));
    return r;
  }
}

// Streaming access (ld/st.global.cs: cached, evict first) for data a layer reads once and that
// cannot stay in L2 anyway (streams_past_l2): GEMM2's rows read back by finalize at prefill sizes.
// 16-byte vectors only; single elements keep the plain access.
template <bool STREAM, typename R>
__device__ __forceinline__ R load_raw(const R* p) {
  if constexpr (STREAM && std::is_same_v<R, uint4>) return __ldcs(p);
  else return *p;
}

// Whether `bytes` of a stage's stream exceed the current device's L2 (then the stream goes
// through the evict-first accesses; smaller ones keep the normal policy, so that the next layer
// still finds a decode step's output in L2).
inline bool streams_past_l2(int64_t bytes) {
  const int l2 = device_attribute(cudaDevAttrL2CacheSize);
  return l2 > 0 && bytes > static_cast<int64_t>(l2);
}

// Elements per 16-byte vector when every row start (base + k*row_elems) is 16-byte aligned,
// else 1.
template <typename T>
inline int vec_width(int64_t row_elems, std::initializer_list<const void*> ptrs) {
  constexpr int kWide = 16 / sizeof(T);
  if ((row_elems * static_cast<int64_t>(sizeof(T))) % 16 != 0) return 1;
  for (const void* p : ptrs) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;
  }
  return kWide;
}

__device__ __forceinline__ float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }

// Grid size for a row-per-block kernel over `rows` rows: capped so huge row counts fall back
// to a grid-stride loop instead of an invalid launch.
inline unsigned row_grid(int64_t rows) {
  constexpr int64_t kMaxBlocks = 1 << 20;
  return static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
}

// Launch shape of the warp-per-(row, column chunk) stage kernels (expand_rows, fc1_activation,
// finalize): blocks of kStageWarps warps, warps striding over the rows (blockIdx.x), blockIdx.y
// over a row's column chunks of 32 * vpl vectors (vpl = vectors per lane). Whole rows (max_vpl
// vectors in flight per lane) when there are enough rows; while rows * chunks < kMinStageWarps
// (decode sizes: T*K rows) narrower chunks, so the work still spreads over the SMs; then evened
// out (176 vectors at max_vpl 4 in 2 chunks of 96 and 80, not 128 and 48).
constexpr int kStageThreads = 128;
constexpr int kStageWarps = kStageThreads / 32;
constexpr int64_t kMinStageWarps = 1024;  // about 8 warps per SM on a 132-SM part

struct StageLaunch {
  int vpl;         // vectors per lane
  int64_t chunks;  // column chunks per row
  dim3 grid;
};

inline StageLaunch stage_launch(int64_t rows, int64_t nvec, int max_vpl) {
  auto chunks = [nvec](int64_t vpl) { return (nvec + 32 * vpl - 1) / (32 * vpl); };
  int64_t vpl = max_vpl;
  while (vpl > 1 && rows * chunks(vpl) < kMinStageWarps) vpl /= 2;
  const int64_t c = chunks(vpl);
  vpl = (nvec + 32 * c - 1) / (32 * c);
  return {static_cast<int>(vpl), c,
          dim3(row_grid((rows + kStageWarps - 1) / kStageWarps), static_cast<unsigned>(c < 65535 ? c : 65535))};
}

}  // namespace mb
