"""Debug dump: the block-128 gated wgmma GEMM1 on the gate/up halves map; tensors saved for CPU analysis."""
import os, sys, torch
sys.path.insert(0, "tests/gpu"); sys.path.insert(0, "tests")
from moe_build import kernels as K
from moe_build.kernels.abi import Fp8Scaling
from moe_build.weights.fp8 import gate_up_halves_scales
from test_fp8_gemm import case, reference
from moe_build.reference import activate
from test_fp8_gemm_gated import act_spec
out = {}
cases = []
for tile in ("pingpong64x128", "coop128x128"):
    for counts, inter, k in (([64], 128, 128), ([64], 128, 256), ([128, 64], 192, 256), ([3, 0, 17, 1, 0, 9, 40, 2], 128, 512)):
        for mode in ("ones", "sa1", "sb1", "rand"):
            cases.append((tile, counts, inter, k, mode))
for i, (tile, counts, inter, k, mode) in enumerate(cases):
    a, sa, b, sb, off = case(counts, 2 * inter, k, Fp8Scaling.BLOCK128, 7 + i)
    if mode in ("ones", "sa1"): sa = torch.ones_like(sa)
    if mode in ("ones", "sb1"): sb = torch.ones_like(sb)
    if mode == "ones": pass
    sb_in = gate_up_halves_scales(sb, inter)
    c = torch.full((a.shape[0], inter), float("nan"), dtype=torch.bfloat16, device="cuda")
    err = None
    try:
        K.grouped_gemm_fp8_gated(a, sa, b, sb_in, off, Fp8Scaling.BLOCK128, "swiglu", out_dtype=torch.bfloat16,
                                 c=c, tactic=f"wgmma:{tile}:plain:plain")
        torch.cuda.synchronize()
    except Exception as e:
        err = repr(e)
    full, _ = reference(a, sa, b, sb, off, Fp8Scaling.BLOCK128)
    ref = activate(act_spec("swiglu", inter, k), full)
    used = int(off[-1])
    got = c.double().cpu()[:used]
    d = (got - ref[:used]).abs() / (ref[:used].abs() + 1e-2)
    print(i, tile, counts[:3], inter, k, mode, "err", err, "nan", int(got.isnan().sum()), "of", got.numel(),
          "rel max", float(d.nan_to_num(1e9).max()), "median", float(d.nan_to_num(1e9).median()), flush=True)
    out[i] = dict(tile=tile, counts=counts, inter=inter, k=k, mode=mode, a=a.view(torch.uint8).cpu(), sa=sa.cpu(),
                  b=b.view(torch.uint8).cpu(), sb=sb.cpu(), sb_in=sb_in.cpu(), off=off.cpu(), c=c.cpu(), err=err)
torch.save(out, os.environ["OUT"] + "/dbg.pt")
