"""The MXFP4 digits GEMM at GPT-OSS-20B's GEMM1 size against K (2880, 2944): argv[1] form (stored: main's
library and tree; quarters: the branch's), argv[2] JSON out. L2 emptied by a read before every timed call; median of
25 calls after 3 warm ones."""
import json, sys, torch
from moe_build import kernels as K
from moe_build.bench.timing import flush_l2
form, out = sys.argv[1], sys.argv[2]
E, top_k, n = 32, 4, 5760
res = {}
for k in (2880, 2944):
    torch.manual_seed(0)
    b = torch.randint(0, 256, (E, n, k // 2), dtype=torch.uint8, device="cuda")
    s = torch.randint(118, 126, (E, n, k // 32), dtype=torch.uint8, device="cuda")
    kind = "mxfp4"
    if form == "quarters":
        from moe_build.weights.woq import mxfp4_quarters
        b, s = mxfp4_quarters(b, s); kind = "mxfp4_quarters"
    for tokens in (2, 16):
        g = torch.Generator().manual_seed(1)
        ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(tokens)]).view(-1)
        counts = torch.bincount(ids, minlength=E)
        off = torch.zeros(E + 1, dtype=torch.int64); off[1:] = counts.cumsum(0); off = off.cuda()
        a = torch.randn(tokens * top_k, k, device="cuda").to(torch.bfloat16)
        c = torch.empty(tokens * top_k, n, dtype=torch.bfloat16, device="cuda")
        dig = K.token_digits(a, group=32)
        run = lambda: K.grouped_gemm_woq(dig, b, kind, s, off, 32, c=c, tactic="decode:digits_ksplit1:after_trigger:plain",
                                         out_dtype=torch.bfloat16)
        for _ in range(3):
            run()
        ts = []
        for _ in range(25):
            flush_l2()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); run(); e1.record(); torch.cuda.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e3)
        res[f"{k}/{tokens}"] = sorted(ts)[len(ts) // 2]
        print(form, k, tokens, round(res[f"{k}/{tokens}"], 1), flush=True)
    del b, s
json.dump(res, open(out, "w"), indent=1)
