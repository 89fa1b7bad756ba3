"""The weight-only grouped GEMM (mb_grouped_gemm_woq) under every tactic, int4 (group 128, zero points) and MXFP4, on
the bench shapes' GEMMs at 1, 16, 64 and 256 tokens, L2 flushed before each call, median of 20, beside the bf16
grouped GEMM's decode kernel and the time the stored bytes take at the read rate measured here (a read-only sum over 2
GiB): the evidence for the weight-only rules in moe_build/planner/tactics/woq.py. Writes woq_gemm_probe.json to $OUT (or
the working directory); ends with the decode table (gemm_probe_timing.decode_table: achieved read rate of the best
decode tactic at 1 and 16 tokens).

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/woq_tactics_probe.py
    MB_PROBE_OLD_LIB=.../old/libmoe_build_kernels.so ...   # also runs it on an older library, side by side
    WOQ_PROBE_KINDS=int4 WOQ_PROBE_TOKENS=1,16 ...          # a part of it (default int4,mxfp4 and 1,16,64,256)
"""
import json, os, torch
from gemm_probe_timing import decode_table, read_rate, run_old, tms
from moe_build import kernels as K
from moe_build.weights.woq import WoqKind


read_bps = read_rate()
gemms = {"qwen3_g1": (128, 8, 1536, 2048), "qwen3_g2": (128, 8, 2048, 768), "mixtral_g1": (8, 2, 28672, 4096),
         "mixtral_g2": (8, 2, 4096, 14336), "dsv2_g1": (64, 6, 2816, 2048)}
kinds = os.environ.get("WOQ_PROBE_KINDS", "int4,mxfp4").split(",")
token_counts = [int(t) for t in os.environ.get("WOQ_PROBE_TOKENS", "1,16,64,256").split(",")]
rows = []
for name, (E, topk, n, k) in gemms.items():
    for kind, group in ((WoqKind.INT4, 128), (WoqKind.MXFP4, 32)):
        if kind.value not in kinds:
            continue
        b = torch.randint(0, 256, (E, n, k // 2), dtype=torch.uint8, device="cuda")
        if kind is WoqKind.INT4:
            scales, zeros = torch.rand(E, n, k // group, device="cuda") * 0.01, torch.randint(0, 16, (E, n, k // group), dtype=torch.uint8, device="cuda")
        else:
            scales, zeros = torch.randint(118, 126, (E, n, k // 32), dtype=torch.uint8, device="cuda"), None
        w16 = torch.randn(E, n, k, device="cuda").to(torch.bfloat16) if kind is WoqKind.INT4 else None
        for tokens in token_counts:
            R = tokens * topk
            ids = torch.randint(0, E, (R,), device="cuda")
            counts = torch.bincount(ids, minlength=E)
            off = torch.zeros(E + 1, dtype=torch.int64, device="cuda"); off[1:] = counts.cumsum(0)
            a = torch.randn(R, k, device="cuda").to(torch.bfloat16)
            c = torch.empty(R, n, dtype=torch.bfloat16, device="cuda")
            touched = int((counts > 0).sum())
            stored = touched * (n * k // 2 + scales[0].numel() * scales.element_size() + (0 if zeros is None else zeros[0].numel()))
            forms = ("", "staged_") if kind is WoqKind.INT4 and group == 128 else ("",)
            tacs = [f"decode:{f}ksplit{s}:after_trigger:plain" for f in forms for s in (1, 2, 4, 8)] + \
                   ([f"mma:{t}:plain:plain" for t in ("64x128", "128x128")] if tokens >= 16 else [])
            res = {}
            for t in tacs:
                try:  # a staged tactic whose token rows do not fit is refused
                    res[t] = round(tms(lambda: K.grouped_gemm_woq(a, b, kind.value, scales, off, group, zeros=zeros,
                                                                  c=c, tactic=t)), 1)
                except K.KernelError:
                    pass
            if w16 is not None and tokens <= 16:
                res["bf16_decode_ksplit2"] = round(tms(lambda: K.grouped_gemm_sm90(a, w16, off, c=c, tactic="decode:ksplit2:after_trigger:plain")), 1)
            floor = round(stored / read_bps * 1e6, 1)
            best = min((t for t in res if not t.startswith("bf16")), key=res.get)
            print(name, kind.value, tokens, "floor", floor, res, "best", best, flush=True)
            rows.append(dict(gemm=name, kind=kind.value, tokens=tokens, bytes=stored, floor_us=floor, times=res))
json.dump(dict(read_bytes_per_s=read_bps, rows=rows), open(os.path.join(os.environ.get("OUT", "."), "woq_gemm_probe.json"), "w"), indent=1)
decode_table(rows, "kind", run_old(__file__, "woq_gemm_probe.json"), read_bps)
