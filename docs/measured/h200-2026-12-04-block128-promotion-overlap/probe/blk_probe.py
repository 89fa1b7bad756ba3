"""Block-128 against rowwise (promoted / fast) FP8 grouped GEMMs on the coop 128x128 tile, 4096 tokens, one library
(MOE_BUILD_KERNELS_LIB): L2 flushed, median of 10, microseconds; one JSON line per point. With argv[1] == "ncu": one
block-128 call of DeepSeek-V3's GEMM1 after warm-ups (for Nsight Compute)."""
import json
import sys

import torch
sys.path.insert(0, "bench")
from gemm_probe_timing import tms  # noqa: E402

from moe_build import kernels as K  # noqa: E402
from moe_build.kernels.abi import Fp8Accumulation, Fp8Scaling  # noqa: E402
from moe_build.kernels.ops import fp8_scale_shapes  # noqa: E402

GEMMS = {"dsv3_g1": (256, 8, 4096, 7168), "dsv2_g2": (64, 6, 2048, 1408), "mixtral_g2": (8, 2, 4096, 14336),
         "qwen3_g1": (128, 8, 1536, 2048)}
g = torch.Generator(device="cuda").manual_seed(0)


def problem(E, topk, n, k, tokens=4096):
    R = tokens * topk
    ids = torch.randint(0, E, (R,), device="cuda", generator=g)
    off = torch.zeros(E + 1, dtype=torch.int64, device="cuda")
    off[1:] = torch.bincount(ids, minlength=E).cumsum(0)
    a = (torch.randn(R, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    b = (torch.randn(E, n, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    scales = {}
    for s in (Fp8Scaling.ROWWISE, Fp8Scaling.BLOCK128):
        sa_shape, sb_shape = fp8_scale_shapes(s, R, E, n, k)
        scales[s] = (torch.rand(sa_shape, device="cuda", generator=g) + 0.5,
                     torch.rand(sb_shape, device="cuda", generator=g) + 0.5)
    c = torch.empty(R, n, dtype=torch.bfloat16, device="cuda")
    ws = torch.empty(K.grouped_gemm_fp8_workspace_bytes(E, R, n, k) + 1, dtype=torch.uint8, device="cuda")
    return off, a, b, scales, c, ws


def call(p, scaling, acc):
    off, a, b, scales, c, ws = p
    sa, sb = scales[scaling]
    K.grouped_gemm_fp8(a, sa, b, sb, off, scaling, c=c, workspace=ws, accumulation=acc,
                       tactic="wgmma:coop128x128:plain:plain")


if len(sys.argv) > 1 and sys.argv[1] == "ncu":
    p = problem(*GEMMS["dsv3_g1"])
    for _ in range(4):
        call(p, Fp8Scaling.BLOCK128, Fp8Accumulation.PROMOTED)
    torch.cuda.synchronize()
else:
    for name, shape in GEMMS.items():
        p = problem(*shape)
        for scaling, acc in ((Fp8Scaling.BLOCK128, Fp8Accumulation.PROMOTED), (Fp8Scaling.ROWWISE, Fp8Accumulation.PROMOTED),
                             (Fp8Scaling.ROWWISE, Fp8Accumulation.FAST)):
            us = tms(lambda: call(p, scaling, acc), iters=10)
            print(json.dumps({"gemm": name, "scaling": scaling.name.lower(), "accumulation": acc.name.lower(),
                              "tile": "coop128x128", "tokens": 4096, "us": round(us, 1)}), flush=True)
        del p
        torch.cuda.empty_cache()
