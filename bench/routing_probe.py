"""The routing kernel and the fused routing prologue alone, at 1 to 16384 tokens: DeepSeek-V3's grouped sigmoid
top-k (256 experts, 8 groups, top-4 groups, correction bias), the same without groups, and softmax top-k at 256, 128
(Qwen3-30B-A3B) and 32 (GPT-OSS-20B) experts; each call captured 50 times back to back in one CUDA graph, the median
time per call over 10 replays. The evidence for the grouped selection in cpp/src/stages/routing.cu.

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/routing_probe.py
"""
import torch
from moe_build import kernels as K


def per_call(fn, n: int = 50) -> float:
    """Median microseconds per call of fn, captured n times in one graph."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(n):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(10):
        a.record(); g.replay(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1000 / n)
    return sorted(ts)[5]


for name, E, k, method, groups, tg, bias in [("dsv3", 256, 8, "sigmoid_grouped", 8, 4, True),
                                               ("dsv3_nogroups", 256, 8, "sigmoid_grouped", 1, 1, True),
                                               ("e256_softmax", 256, 8, "softmax_topk", 1, 1, False),
                                               ("qwen3", 128, 8, "softmax_topk", 1, 1, False),
                                               ("gptoss", 32, 4, "softmax_topk", 1, 1, False)]:
    for T in (1, 16, 256, 4096, 16384):
        logits = torch.randn(T, E, device="cuda")
        cb = 0.1 * torch.randn(E, device="cuda") if bias else None
        ids = torch.empty(T, k, dtype=torch.int32, device="cuda")
        w = torch.empty(T, k, dtype=torch.float32, device="cuda")
        r = lambda: K.routing(logits, k, method, renormalize=True, correction_bias=cb, num_groups=groups,
                              topk_groups=tg, routed_scaling_factor=2.5, topk_ids=ids, topk_weights=w)
        t_r = per_call(r)
        ptu = torch.empty(T * k, dtype=torch.int32, device="cuda"); utp = torch.empty_like(ptu)
        off = torch.empty(E + 1, dtype=torch.int64, device="cuda")
        m = lambda: K.routing_prologue_fused(ids, E, ptu, utp, off)
        try:  # the fused prologue is one block: past its limits it refuses (the three-step prologue takes over)
            maps = f"{per_call(m):6.2f} us"
        except K.KernelError:
            maps = "     - (refused)"
        print(f"{name:14s} T={T:5d} routing {t_r:6.2f} us  fused maps {maps}", flush=True)
