"""Time mb_woq_dequantize on the bench shapes' W1 and W2 (the library MOE_BUILD_KERNELS_LIB names): us a call and
the bytes moved (stored weights + scales read, 16-bit weights written) over that time."""
import json
import sys

import torch

from moe_build import kernels as K

SHAPES = {"mixtral-8x7b": (4096, 14336, 8), "qwen3-30b-a3b": (2048, 768, 128), "deepseek-v2-lite": (2048, 1408, 64),
          "gpt-oss-20b": (2880, 2880, 32)}
rows = []
for name, (h, i, e) in SHAPES.items():
    for mat, n, k in (("w1", 2 * i, h), ("w2", h, i)):
        for kind, group in (("mxfp4", 32), ("int4", 32), ("int8", 0)):
            if kind == "int8":
                b = torch.randint(-128, 127, (e, n, k), dtype=torch.int8, device="cuda")
            else:
                b = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda")
            groups = k // group if group else 1
            s = (torch.randint(120, 130, (e, n, groups), dtype=torch.uint8, device="cuda") if kind == "mxfp4"
                 else torch.rand(e, n, groups, device="cuda") * 0.01 + 1e-3)
            out = torch.empty(e, n, k, dtype=torch.bfloat16, device="cuda")
            for _ in range(3):
                K.woq_dequantize(b, kind, s, group, out=out)
            torch.cuda.synchronize()
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            for _ in range(10):
                K.woq_dequantize(b, kind, s, group, out=out)
            t1.record()
            torch.cuda.synchronize()
            us = t0.elapsed_time(t1) * 1000 / 10
            moved = b.numel() * b.element_size() + s.numel() * s.element_size() + out.numel() * 2
            rows.append({"shape": name, "mat": mat, "kind": kind, "us": round(us, 1), "gbps": round(moved / us / 1e3, 1)})
            del b, s, out
json.dump(rows, open(sys.argv[1], "w"), indent=1)
for r in rows:
    print(f"{r['shape']:18} {r['mat']} {r['kind']:6} {r['us']:9.1f} us {r['gbps']:7.1f} GB/s")
