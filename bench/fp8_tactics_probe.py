"""The FP8 grouped GEMM (mb_grouped_gemm_fp8) under every tactic, on the bench shapes' two GEMMs at 1, 16, 256
and 4096 tokens, both scalings, L2 flushed before each call, median of 20: the evidence for the FP8 rules in
moe_build/planner/tactics.py. Writes fp8_gemm_probe.json to $OUT (or the working directory): the read rate measured
here and per row the stored bytes of the touched experts (e4m3 weights and their scales); ends with the decode table
(gemm_probe_timing.decode_table: achieved read rate of the best decode tactic at 1 and 16 tokens).

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/fp8_tactics_probe.py
    MB_PROBE_OLD_LIB=.../old/libmoe_build_kernels.so ...   # also runs it on an older library, side by side
"""
import json, os, torch
from gemm_probe_timing import decode_table, read_rate, run_old, tms
from moe_build import kernels as K
from moe_build.kernels.abi import Fp8Scaling
from moe_build.kernels.ops import fp8_scale_shapes


gemms = {"qwen3_g1": (128, 8, 1536, 2048), "qwen3_g2": (128, 8, 2048, 768), "mixtral_g1": (8, 2, 28672, 4096),
         "mixtral_g2": (8, 2, 4096, 14336), "dsv2_g1": (64, 6, 2816, 2048)}
read_bps = read_rate()
rows = []
for name, (E, topk, n, k) in gemms.items():
    b = torch.randn(E, n, k, device="cuda").to(torch.float8_e4m3fn)
    for tokens in (1, 16, 256, 4096):
        R = tokens * topk
        ids = torch.randint(0, E, (R,), device="cuda")
        counts = torch.bincount(ids, minlength=E)
        off = torch.zeros(E + 1, dtype=torch.int64, device="cuda"); off[1:] = counts.cumsum(0)
        touched = int((counts > 0).sum())
        a = torch.randn(R, k, device="cuda").to(torch.float8_e4m3fn)
        c = torch.empty(R, n, dtype=torch.bfloat16, device="cuda")
        ws = torch.empty(K.grouped_gemm_fp8_workspace_bytes(E, R, n, k) + 1, dtype=torch.uint8, device="cuda")
        for sc in (Fp8Scaling.ROWWISE, Fp8Scaling.BLOCK128):
            sa_s, sb_s = fp8_scale_shapes(sc, R, E, n, k)
            sa, sb = torch.rand(sa_s, device="cuda"), torch.rand(sb_s, device="cuda")
            tacs = ([f"decode:ksplit{s}:after_trigger:plain" for s in (1, 2, 4, 8)] if tokens <= 16 else []) + \
                   ([f"wgmma:{t}:plain:plain" for t in ("pingpong64x128", "coop128x128") + (("coop128x256",) if sc == Fp8Scaling.ROWWISE else ())] if tokens >= 16 else [])
            res = {}
            for t in tacs:
                res[t] = round(tms(lambda: K.grouped_gemm_fp8(a, sa, b, sb, off, sc, c=c, workspace=ws, tactic=t)), 1)
            best = min(res, key=res.get)
            print(name, tokens, sc.name, res, "best", best, flush=True)
            stored = touched * (n * k + sb[0].numel() * sb.element_size())
            rows.append(dict(gemm=name, tokens=tokens, scaling=sc.name, bytes=stored, times=res))
json.dump(dict(read_bytes_per_s=read_bps, rows=rows), open(os.path.join(os.environ.get("OUT", "."), "fp8_gemm_probe.json"), "w"), indent=1)
decode_table(rows, "scaling", run_old(__file__, "fp8_gemm_probe.json"), read_bps)
