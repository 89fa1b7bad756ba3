"""Probe of the int4 decode lead (docs/performance.md, "No pipe at its ceiling"): bench/int4_imma_probe.cu's kernel
(int4 codes widened to 8 bits for the int8 mma, the token in three 8-bit digits per 128-k group) beside the product's
staged decode kernel on the same bytes, one token: Mixtral-8x7B's GEMM1 at 1 token (2 experts x 28672 rows, K 4096,
group 128 with zero points). Both checked against fp64; each call timed alone after a 512 MB read empties L2.

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/int4_imma_probe.py [out.json]

Needs nvcc (it builds the probe kernel into a temporary folder) and an sm_90 GPU.
"""
from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from moe_build import kernels as K

HERE = Path(__file__).resolve().parent
EXPERTS, N_EXPERT, HIDDEN, GROUP = 2, 28672, 4096, 128
REPS = 30
PERM = [0, 2, 4, 6, 1, 3, 5, 7]  # a word's k as the widened codes hold them: even k (low nibbles), then odd


def build() -> ctypes.CDLL:
    out = Path(tempfile.mkdtemp()) / "int4_imma_probe.so"
    subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=sm_90a", "-Xcompiler", "-fPIC", "--shared",
                    f"-I{HERE.parent / 'cpp' / 'src'}", str(HERE / "int4_imma_probe.cu"), "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    lib.int4_imma_gemv_launch.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return lib


def token_digits(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """t [K] -> (planes int8 [4, K + 32] in the kernel's order, T int32 [G], F fp32 [G], the token the digits carry
    in fp64): per group t = 2^E * D / 4096, D = 4096 d0 + 64 d1 + d2, |t| / 2^E < 64."""
    k = t.numel()
    x = t.double().view(-1, GROUP)
    m = x.abs().amax(1)
    e = torch.where(m > 0, torch.floor(torch.log2(torch.where(m > 0, m, 1.0))) - 5, torch.zeros_like(m))
    y = x / torch.exp2(e)[:, None]
    d0 = torch.round(y)
    r = (y - d0) * 64
    d1 = torch.round(r)
    d2 = torch.round((r - d1) * 64)
    dd = 4096 * d0 + 64 * d1 + d2
    planes = torch.zeros(4, k + 32, dtype=torch.int8, device=t.device)
    for i, d in enumerate((d0, d1, d2)):
        p = d.view(-1, 4, 4, 8)[..., PERM].transpose(1, 2).reshape(-1)  # (group, q, step, i) -> (group, step, q, i')
        planes[i, :k] = p.to(torch.int8)
    carried = (torch.exp2(e)[:, None] * dd / 4096).view(-1)
    return planes, dd.sum(1).to(torch.int32), (torch.exp2(e) / 4096).float(), carried


def timed(fn, flush: torch.Tensor) -> float:
    """Median microseconds of REPS calls of `fn`, each after a read of `flush` (L2 emptied)."""
    times = []
    for _ in range(REPS):
        flush.sum()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return sorted(times)[len(times) // 2]


def main() -> None:
    torch.manual_seed(0)
    dev = "cuda"
    n, k, groups = EXPERTS * N_EXPERT, HIDDEN, HIDDEN // GROUP
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev)
    s = torch.rand(n, groups, device=dev) * 0.01 + 0.001
    z = torch.randint(0, 16, (n, groups), dtype=torch.uint8, device=dev)
    t = torch.randn(k, device=dev).to(torch.bfloat16)
    u = torch.stack([w & 15, w >> 4], dim=-1).view(n, k).double()
    wd = (u - z.double().repeat_interleave(GROUP, 1)) * s.double().repeat_interleave(GROUP, 1)
    ref = wd @ t.double()
    planes, tsum, fac, carried = token_digits(t)
    ref_digits = wd @ carried
    del u, wd

    lib = build()
    y = torch.full((n,), float("nan"), device=dev)
    stream = torch.cuda.current_stream().cuda_stream

    def probe() -> None:
        rc = lib.int4_imma_gemv_launch(w.data_ptr(), s.data_ptr(), z.data_ptr(), planes.data_ptr(), tsum.data_ptr(),
                                       fac.data_ptr(), y.data_ptr(), n, k, stream)
        assert rc == 0, rc

    off = torch.tensor([0, 1, 2], dtype=torch.int64, device=dev)
    a = t.view(1, k).repeat(EXPERTS, 1).contiguous()
    c = torch.full((EXPERTS, N_EXPERT), float("nan"), dtype=torch.bfloat16, device=dev)
    wb, sb, zb = w.view(EXPERTS, N_EXPERT, k // 2), s.view(EXPERTS, N_EXPERT, groups), z.view(EXPERTS, N_EXPERT, groups)

    def staged() -> None:
        K.grouped_gemm_woq(a, wb, "int4", sb, off, GROUP, zeros=zb, c=c, tactic="decode:staged_ksplit1:after_trigger:plain")

    probe()
    staged()
    torch.cuda.synchronize()
    rel = lambda got, want: float((got.double() - want).norm() / want.norm())  # noqa: E731
    result = {"shape": f"{EXPERTS} x {N_EXPERT} rows, K {k}, group {GROUP}, 1 token",
              "probe_rel_err_vs_fp64": rel(y, ref), "probe_rel_err_vs_its_digits": rel(y, ref_digits),
              "staged_rel_err_vs_fp64": rel(c.view(-1), ref)}
    flush = torch.empty(128 * 1024 * 1024, dtype=torch.float32, device=dev)
    weight_bytes = w.numel() + s.numel() * 4 + z.numel()
    read = timed(lambda: w.view(torch.float32).sum(), flush)
    for name, fn in (("staged", staged), ("probe", probe), ("staged_again", staged), ("probe_again", probe)):
        us = timed(fn, flush)
        result[f"{name}_us"] = us
        result[f"{name}_tb_per_s"] = weight_bytes / us / 1e6
    result["read_sum_us"] = read
    result["read_tb_per_s"] = w.numel() / read / 1e6
    for key, v in result.items():
        print(f"{key:32} {v:.4g}" if isinstance(v, float) else f"{key:32} {v}")
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
