// The `nccl` dispatch's exchanges (moe_build/runner/dispatch/nccl.py): rows grouped by rank sent to every rank
// and received from every rank, with each rank's row count given on the host, in one NCCL group of
// point-to-point sends and receives (one launch) on the caller's stream, over torch.distributed's own
// communicator (ProcessGroupNCCL's, borrowed by address: this library opens no communicator and moves no byte
// itself).
//   mb_ep_nccl_exchange: up to three payloads at once (a dispatch sends its rows, their ids and their weights;
//                        the counts and the return send one), each of its own row size, rank d's rows at the
//                        prefix of the row counts before d. The peers are visited starting with rank + 1 (as
//                        the nvlink kernels' rows), pairs with no row on either side skipped: both sides know
//                        both counts, so every send meets its receive.
//   mb_ep_nccl_all_gather: the all-gather form, where the host already knows every rank's row count (the caller's
//                          tokens per rank: nothing counted, nothing read back): each rank's rows of every payload
//                          to every rank, rank d's after ranks 0..d-1's; NCCL all-gathers where the counts are
//                          equal, else one broadcast per rank (an all-gather of unequal parts), in one group;
//   mb_ep_nccl_reduce_scatter: its return: each rank's rows of the ranks' partial outputs summed into its own
//                          out (NCCL's sum); a reduce-scatter where the counts are equal, else one reduce per rank.
// Why not torch.distributed.all_to_all_single: a dispatch + combine made four of them, and each costs 25 to 90 us
// per call on 2 H200s at 1 to 128 tokens (bench/ep_host_probe.py, one called back to back), most of it host time
// in PyTorch's wrapper (its NCCL kernel runs about 15 us); the exchange is host-bound up to hundreds of tokens.
// NCCL is found in the process, where torch loaded it (dlopen of libnccl.so.2 with RTLD_NOLOAD, else the
// global symbols); its API is NCCL's stable C API (nccl.h: ncclGroupStart/End, ncclSend/Recv, ncclCommCount,
// ncclCommUserRank, ncclAllGather, ncclReduceScatter, ncclBroadcast, ncclReduce, ncclGetErrorString), declared
// here, not linked, so the library loads where NCCL is absent.
#include <dlfcn.h>

#include "common/common.cuh"

namespace {

constexpr int kMaxRanks = 32;
constexpr int kPayloads = 3;
constexpr int kNcclSuccess = 0;
constexpr int kNcclInProgress = 7;
constexpr int kNcclUint8 = 1;
constexpr int kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclBfloat16 = 9;  // nccl.h's ncclDataType_t
constexpr int kNcclSum = 0;                                            // nccl.h's ncclRedOp_t

struct NcclApi {
  using Result = int;
  Result (*group_start)();
  Result (*group_end)();
  Result (*send)(const void*, size_t, int, int, void*, cudaStream_t);
  Result (*recv)(void*, size_t, int, int, void*, cudaStream_t);
  Result (*all_gather)(const void*, void*, size_t, int, void*, cudaStream_t);
  Result (*reduce_scatter)(const void*, void*, size_t, int, int, void*, cudaStream_t);
  Result (*broadcast)(const void*, void*, size_t, int, int, void*, cudaStream_t);
  Result (*reduce)(const void*, void*, size_t, int, int, int, void*, cudaStream_t);
  Result (*comm_count)(const void*, int*);
  Result (*comm_user_rank)(const void*, int*);
  const char* (*error_string)(Result);
  bool found;
};

template <typename F>
bool find(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  return *fn != nullptr;
}

NcclApi load_nccl() {
  NcclApi api{};
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) lib = RTLD_DEFAULT;
  api.found = find(lib, "ncclGroupStart", &api.group_start) && find(lib, "ncclGroupEnd", &api.group_end) &&
              find(lib, "ncclSend", &api.send) && find(lib, "ncclRecv", &api.recv) &&
              find(lib, "ncclAllGather", &api.all_gather) && find(lib, "ncclReduceScatter", &api.reduce_scatter) &&
              find(lib, "ncclBroadcast", &api.broadcast) && find(lib, "ncclReduce", &api.reduce) &&
              find(lib, "ncclCommCount", &api.comm_count) && find(lib, "ncclCommUserRank", &api.comm_user_rank) &&
              find(lib, "ncclGetErrorString", &api.error_string);
  return api;
}

const NcclApi& nccl() {
  static const NcclApi api = load_nccl();
  return api;
}

mb_status nccl_failed(const char* who, const char* what, int result) {
  return mb::fail(result == kNcclInProgress ? MB_ERR_UNSUPPORTED : MB_ERR_CUDA, "%s: %s: %s%s", who, what,
                  nccl().error_string(result),
                  result == kNcclInProgress ? " (a non-blocking communicator: use a blocking one)" : "");
}

// The checks every exchange makes: NCCL loaded, a communicator of ep_size ranks; this rank's index in it.
mb_status check_comm(const char* who, void* comm, int ep_size, int* rank) {
  const NcclApi& api = nccl();
  if (!api.found)
    return mb::fail(MB_ERR_UNSUPPORTED, "%s: NCCL is not loaded in this process (torch.distributed's NCCL backend "
                    "loads it)", who);
  MB_REQUIRE(comm != nullptr, "%s: comm must be a communicator's address (ProcessGroupNCCL._comm_ptr()), got NULL",
             who);
  MB_REQUIRE(ep_size >= 1 && ep_size <= kMaxRanks, "%s: ep_size must be in 1..%d, got %d", who, kMaxRanks, ep_size);
  int ranks = 0;
  int r = api.comm_count(comm, &ranks);
  if (r != kNcclSuccess) return nccl_failed(who, "ncclCommCount", r);
  MB_REQUIRE(ranks == ep_size, "%s: the communicator has %d ranks, ep_size is %d", who, ranks, ep_size);
  r = api.comm_user_rank(comm, rank);
  if (r != kNcclSuccess) return nccl_failed(who, "ncclCommUserRank", r);
  return MB_OK;
}

// The all-gather form's checks: the communicator (check_comm), every rank's row count (a host array of ep_size) as
// prefix sums `at`, and whether the counts are all equal (NCCL's collectives take one count for every rank).
mb_status check_rank_rows(const char* who, void* comm, int ep_size, const int32_t* rows, int* rank, int64_t* at,
                          bool* equal) {
  const mb_status st = check_comm(who, comm, ep_size, rank);
  if (st != MB_OK) return st;
  MB_REQUIRE(rows != nullptr, "%s: rows (a host array of ep_size row counts) must be non-NULL", who);
  at[0] = 0;
  *equal = true;
  for (int d = 0; d < ep_size; ++d) {
    MB_REQUIRE(rows[d] >= 0, "%s: row counts must be >= 0, got %d for rank %d", who, rows[d], d);
    at[d + 1] = at[d] + rows[d];
    *equal = *equal && rows[d] == rows[0];
  }
  return MB_OK;
}

// The payloads' checks of both exchanges: row sizes >= 0 (0: no such payload), buffers where rows move.
mb_status check_payloads(const char* who, const void* const* sends, void* const* recvs, const int64_t* row_bytes,
                         bool sends_rows, bool receives_rows) {
  for (int j = 0; j < kPayloads; ++j) {
    MB_REQUIRE(row_bytes[j] >= 0, "%s: row_bytes%d must be >= 0 (0: no such payload), got %lld", who, j,
               static_cast<long long>(row_bytes[j]));
    MB_REQUIRE(row_bytes[j] == 0 || ((sends[j] || !sends_rows) && (recvs[j] || !receives_rows)),
               "%s: payload %d's buffers must be non-NULL where rows move", who, j);
  }
  return MB_OK;
}

}  // namespace

extern "C" mb_status mb_ep_nccl_exchange(void* comm, int ep_size, const int32_t* send_rows, const int32_t* recv_rows,
                                         const void* send0, void* recv0, int64_t row_bytes0, const void* send1,
                                         void* recv1, int64_t row_bytes1, const void* send2, void* recv2,
                                         int64_t row_bytes2, cudaStream_t stream) {
  const char* who = "mb_ep_nccl_exchange";
  int rank = 0;
  const mb_status st = check_comm(who, comm, ep_size, &rank);
  if (st != MB_OK) return st;
  MB_REQUIRE(send_rows && recv_rows, "%s: send_rows and recv_rows (host arrays of ep_size counts) must be non-NULL",
             who);
  const NcclApi& api = nccl();
  const void* sends[kPayloads] = {send0, send1, send2};
  void* recvs[kPayloads] = {recv0, recv1, recv2};
  const int64_t row_bytes[kPayloads] = {row_bytes0, row_bytes1, row_bytes2};
  int64_t send_at[kMaxRanks + 1] = {0}, recv_at[kMaxRanks + 1] = {0};
  for (int d = 0; d < ep_size; ++d) {
    MB_REQUIRE(send_rows[d] >= 0 && recv_rows[d] >= 0, "%s: row counts must be >= 0, got %d sent and %d received "
               "for rank %d", who, send_rows[d], recv_rows[d], d);
    send_at[d + 1] = send_at[d] + send_rows[d];
    recv_at[d + 1] = recv_at[d] + recv_rows[d];
  }
  const mb_status checked = check_payloads(who, sends, recvs, row_bytes, send_at[ep_size] > 0, recv_at[ep_size] > 0);
  if (checked != MB_OK) return checked;
  int r = api.group_start();
  if (r != kNcclSuccess) return nccl_failed(who, "ncclGroupStart", r);
  for (int s = 1; s <= ep_size; ++s) {
    const int d = (rank + s) % ep_size;  // rank + 1 first, this rank itself last
    for (int j = 0; j < kPayloads; ++j) {
      if (row_bytes[j] == 0) continue;
      if (send_rows[d] > 0 && r == kNcclSuccess)
        r = api.send(static_cast<const char*>(sends[j]) + send_at[d] * row_bytes[j],
                     static_cast<size_t>(send_rows[d]) * row_bytes[j], kNcclUint8, d, comm, stream);
      if (recv_rows[d] > 0 && r == kNcclSuccess)
        r = api.recv(static_cast<char*>(recvs[j]) + recv_at[d] * row_bytes[j],
                     static_cast<size_t>(recv_rows[d]) * row_bytes[j], kNcclUint8, d, comm, stream);
    }
  }
  const int end = api.group_end();  // always closes the group, also after a failed send or receive
  if (r != kNcclSuccess) return nccl_failed(who, "ncclSend/ncclRecv", r);
  if (end != kNcclSuccess) return nccl_failed(who, "ncclGroupEnd", end);
  return MB_OK;
}

extern "C" mb_status mb_ep_nccl_all_gather(void* comm, int ep_size, const int32_t* rows, const void* send0,
                                           void* recv0, int64_t row_bytes0, const void* send1, void* recv1,
                                           int64_t row_bytes1, const void* send2, void* recv2, int64_t row_bytes2,
                                           cudaStream_t stream) {
  const char* who = "mb_ep_nccl_all_gather";
  int rank = 0;
  int64_t at[kMaxRanks + 1];
  bool equal = true;
  mb_status st = check_rank_rows(who, comm, ep_size, rows, &rank, at, &equal);
  if (st != MB_OK) return st;
  const void* sends[kPayloads] = {send0, send1, send2};
  void* recvs[kPayloads] = {recv0, recv1, recv2};
  const int64_t row_bytes[kPayloads] = {row_bytes0, row_bytes1, row_bytes2};
  if ((st = check_payloads(who, sends, recvs, row_bytes, rows[rank] > 0, at[ep_size] > 0)) != MB_OK) return st;
  if (at[ep_size] == 0) return MB_OK;  // no rank has a row: nothing moves anywhere
  // ncclAllGather where the counts are equal. Sends of the same buffer to every rank were slower at decode sizes
  // on 2 H200s (bench/nccl_forms_probe.py, graph replay, dispatch alone: 24.2-25.4 against 15.7 us at one token;
  // 252.4 against 267.4 at 4096 rows of hidden 7168).
  const NcclApi& api = nccl();
  int r = api.group_start();
  if (r != kNcclSuccess) return nccl_failed(who, "ncclGroupStart", r);
  for (int j = 0; j < kPayloads && r == kNcclSuccess; ++j) {
    if (row_bytes[j] == 0) continue;
    char* recv = static_cast<char*>(recvs[j]);
    if (equal) {
      r = api.all_gather(sends[j], recv, static_cast<size_t>(rows[0]) * row_bytes[j], kNcclUint8, comm, stream);
      continue;
    }
    for (int d = 0; d < ep_size && r == kNcclSuccess; ++d)  // every rank knows every count: the same calls
      if (rows[d] > 0)
        r = api.broadcast(d == rank ? sends[j] : recv, recv + at[d] * row_bytes[j],  // read on the root only
                          static_cast<size_t>(rows[d]) * row_bytes[j], kNcclUint8, d, comm, stream);
  }
  const int end = api.group_end();  // always closes the group, also after a failed call
  if (r != kNcclSuccess) return nccl_failed(who, equal ? "ncclAllGather" : "ncclBroadcast", r);
  if (end != kNcclSuccess) return nccl_failed(who, "ncclGroupEnd", end);
  return MB_OK;
}

extern "C" mb_status mb_ep_nccl_reduce_scatter(void* comm, int ep_size, const int32_t* rows, int64_t hidden,
                                               int dtype, const void* partial, void* out, cudaStream_t stream) {
  const char* who = "mb_ep_nccl_reduce_scatter";
  int rank = 0;
  int64_t at[kMaxRanks + 1];
  bool equal = true;
  const mb_status st = check_rank_rows(who, comm, ep_size, rows, &rank, at, &equal);
  if (st != MB_OK) return st;
  MB_REQUIRE(hidden >= 1, "%s: hidden must be >= 1, got %lld", who, static_cast<long long>(hidden));
  MB_REQUIRE(dtype == MB_FP32 || dtype == MB_FP16 || dtype == MB_BF16, "%s: dtype must be MB_FP32, MB_FP16 or "
             "MB_BF16, got %d", who, dtype);
  MB_REQUIRE((partial || at[ep_size] == 0) && (out || rows[rank] == 0),
             "%s: partial and out must be non-NULL where rows move", who);
  if (at[ep_size] == 0) return MB_OK;
  const int type = dtype == MB_FP32 ? kNcclFloat32 : dtype == MB_FP16 ? kNcclFloat16 : kNcclBfloat16;
  const size_t elem = dtype == MB_FP32 ? 4 : 2;
  const NcclApi& api = nccl();
  if (equal) {
    const int r = api.reduce_scatter(partial, out, static_cast<size_t>(rows[0] * hidden), type, kNcclSum, comm,
                                     stream);
    return r == kNcclSuccess ? MB_OK : nccl_failed(who, "ncclReduceScatter", r);
  }
  int r = api.group_start();
  if (r != kNcclSuccess) return nccl_failed(who, "ncclGroupStart", r);
  for (int d = 0; d < ep_size && r == kNcclSuccess; ++d)
    if (rows[d] > 0)
      r = api.reduce(static_cast<const char*>(partial) + at[d] * hidden * elem,
                     d == rank ? out : const_cast<void*>(partial),  // written on the root only
                     static_cast<size_t>(rows[d] * hidden), type, kNcclSum, d, comm, stream);
  const int end = api.group_end();
  if (r != kNcclSuccess) return nccl_failed(who, "ncclReduce", r);
  if (end != kNcclSuccess) return nccl_failed(who, "ncclGroupEnd", end);
  return MB_OK;
}
