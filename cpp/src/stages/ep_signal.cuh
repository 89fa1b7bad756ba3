// The `nvlink` exchange's signals (stages/ep_nvlink.cu): 0/1 flags in every rank's symmetric buffer, raised by
// the peers' signalling kernels and waited for, then lowered, by the kernels that read what the flags guard.
//   signal_peers: the end of a signalling kernel. Each block fences once (one thread, system scope, after the
//                 block's barrier: a release is cumulative over the writes the barrier ordered before it) and
//                 counts itself on a local counter; the last block resets the counter, fences again where there
//                 were other blocks, and stores 1, with release semantics, into the flag of every peer.
//   wait_peers  : the start of a waiting kernel. Each block waits with acquire loads until every source's flag is
//                 raised, and counts itself on a local counter; the last block resets the counter and lowers the
//                 flags, so a flag is lowered only once every block of the kernel has seen it.
// A source raises a flag again only in its next call, after its own combine waited for this rank, which follows
// this rank's waits in stream order: the flags never race. Waits last as long as the peers take, as NCCL's
// kernels do: a peer may reach the call long after this rank; a peer that died is the process group's watchdog's
// to report.
#pragma once

#include <cstdint>

namespace mbk {

__device__ __forceinline__ void store_release_sys(int32_t* p, int32_t v) {
  asm volatile("st.release.sys.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ int32_t load_acquire_sys(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.sys.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Called by every thread of every block once its writes (rows, meta, counts) are issued: flag [slot] of every
// peer raised once every block's writes are visible system-wide. Every thread returns from it (a kernel may go on).
__device__ __forceinline__ void signal_peers(int32_t* const* __restrict__ peer_flags, int slot, int ep,
                                             int32_t* __restrict__ done) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // the block's writes, ordered before it by the barrier, before its count
    last = atomicAdd(done, 1) == static_cast<int>(gridDim.x) - 1;
  }
  __syncthreads();
  if (last) {  // the same in every thread of the block
    if (threadIdx.x == 0) {
      *done = 0;
      // every block's writes, seen through their counts, before the flags (one block: its own fence above did)
      if (gridDim.x > 1) __threadfence_system();
    }
    __syncthreads();
    if (threadIdx.x < ep) store_release_sys(peer_flags[threadIdx.x] + slot, 1);
  }
}

// Called by every thread of every block before it reads what flags[0..ep) guard (blockDim.x >= ep).
__device__ __forceinline__ void wait_peers(int32_t* __restrict__ flags, int ep, int32_t* __restrict__ seen) {
  if (threadIdx.x < ep)
    while (load_acquire_sys(flags + threadIdx.x) == 0) __nanosleep(64);
  __syncthreads();  // the block's reads after every acquire
  if (threadIdx.x == 0 && atomicAdd(seen, 1) == static_cast<int>(gridDim.x) - 1) {
    *seen = 0;
    for (int s = 0; s < ep; ++s) flags[s] = 0;
  }
}

}  // namespace mbk
