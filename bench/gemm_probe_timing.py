"""The timing the GEMM tactic probes share (bench/fp8_tactics_probe.py, bench/woq_tactics_probe.py): one call's
GPU time with L2 flushed before it, median of `iters`, in microseconds."""
import torch


def tms(fn, iters=20):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(3): fn()
    ts = []
    for _ in range(iters):
        flush.zero_(); s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) * 1000)
    ts.sort(); return ts[len(ts) // 2]
