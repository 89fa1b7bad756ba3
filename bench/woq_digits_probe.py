"""The weight-only decode GEMM on the digits tile (mb_token_digits, then mb_grouped_gemm_woq on the int8 mma)
beside the staged tile, on the W4A16 bench shapes' GEMMs (int4 with zero points, group 128; GPT-OSS-20B's group 64
at k 2880) at 1 to 128 tokens, each
form at the K split the planner gives the staged one (the register-ring form, tile none, where the staged one does not
take the weights), both captured in CUDA graphs (the digits form with its digits
step) and replayed with L2 flushed before each replay, median of 30; each checked against fp64 first (relative
norm error). The evidence for tactics.woq.woq_decode_tile_rule's digits band. Writes woq_digits_probe.json to $OUT (or
the working directory) and ends with a table.

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/woq_digits_probe.py
    WOQ_DIGITS_TOKENS=1,16 WOQ_DIGITS_GEMMS=gptoss_g1,gptoss_g2 ...   # a part of it
    WOQ_DIGITS_KIND=mxfp4 ...   # the WFP4A16 shapes' GEMMs in MXFP4 (e8m0 scales per 32 k) beside the ring form

Beside them, the digits form at every K split of WOQ_DIGITS_KSPLITS (1,2,4,8; where a chunk's digits fit), the
evidence for the digits tile's own K split (`digits_ksN_us`).
"""
import json
import os

import torch

from moe_build import kernels as K
from moe_build.bench.timing import flush_l2
from moe_build.planner.tactics import GemmCall, GemmTactic, RowCount, choose_tactic
from moe_build.planner.tactics.woq import woq_digits_rows, woq_staged_rows
from moe_build.target import DEFAULT_GPU
from moe_build.weights.woq import WoqKind, dequantize_matrix, mxfp4_quarters

# name: (experts, top_k, n, k, weight group)
GEMMS = {"mixtral_g1": (8, 2, 28672, 4096, 128), "mixtral_g2": (8, 2, 4096, 14336, 128),
         "qwen3_g1": (128, 8, 1536, 2048, 128), "qwen3_g2": (128, 8, 2048, 768, 128),
         "dsv2_g1": (64, 6, 2816, 2048, 128), "dsv2_g2": (64, 6, 2048, 1408, 128),
         "gptoss_g1": (32, 4, 5760, 2880, 64), "gptoss_g2": (32, 4, 2880, 2880, 64)}
KIND = WoqKind(os.environ.get("WOQ_DIGITS_KIND", "int4"))
if KIND is WoqKind.MXFP4:
    GEMMS = {g: (*v[:4], 32) for g, v in GEMMS.items()}
if os.environ.get("WOQ_DIGITS_GEMMS"):
    GEMMS = {g: GEMMS[g] for g in os.environ["WOQ_DIGITS_GEMMS"].split(",")}
TOKENS = [int(t) for t in os.environ.get("WOQ_DIGITS_TOKENS", "1,2,4,8,16,32,64,128").split(",")]
KSPLITS = [int(k) for k in os.environ.get("WOQ_DIGITS_KSPLITS", "1,2,4,8").split(",")]
REPLAYS = 30


def replay_us(graph: torch.cuda.CUDAGraph) -> float:
    """Median replay time in microseconds, L2 flushed before each."""
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(REPLAYS):
        flush_l2()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return sorted(times)[len(times) // 2]


def captured(fn) -> torch.cuda.CUDAGraph:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def main() -> None:
    torch.manual_seed(0)
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    rows_out = []
    for name, (experts, top_k, n, k, group) in GEMMS.items():
        b = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, device="cuda")
        if KIND is WoqKind.MXFP4:  # e8m0 exponents 2^-9 .. 2^-2
            scales = torch.randint(118, 126, (experts, n, k // group), dtype=torch.uint8, device="cuda")
            zeros = None
        else:
            scales = torch.rand(experts, n, k // group, device="cuda") * 0.01 + 1e-3
            zeros = torch.randint(0, 16, (experts, n, k // group), dtype=torch.uint8, device="cuda")
        # the digits tile's form of the weights: MXFP4 in its quarters order, the rest as stored
        db, dscales, dkind = (*mxfp4_quarters(b, scales), "mxfp4_quarters") if KIND is WoqKind.MXFP4 else \
            (b, scales, KIND.value)
        call = GemmCall(sm=90, entry="sm90", epilogue="store", n=n, k=k, experts=experts, top_k=top_k, itemsize=2,
                        weights_blocked=False, sm_count=sm, l2_bytes=50 << 20,
                        memory_bytes_per_s=DEFAULT_GPU[90].memory_bytes_per_s, woq=KIND.value, woq_group=group)
        # codes, then e8m0 scales, or fp32 scales and zeros
        expert_bytes = n * k // 2 + n * (k // group) * (1 if KIND is WoqKind.MXFP4 else 5)
        dense: dict[int, torch.Tensor] = {}
        for tokens in TOKENS:
            chosen = choose_tactic(call, RowCount(tokens, top_k, experts))
            if chosen.kernel != "decode":
                continue
            rows = tokens * top_k
            # the 16-bit decode form at the planner's K split: staged where a chunk's rows fit (and it takes the
            # weights), else none
            form = "staged" if woq_staged_rows(call, chosen.k_split) >= min(8, rows) else "none"
            staged = GemmTactic("decode", form, chosen.k_split, chosen.launch, chosen.output_l2)
            ids = torch.stack([torch.randperm(experts, device="cuda")[:top_k] for _ in range(tokens)]).view(-1)
            counts = torch.bincount(ids, minlength=experts)
            off = torch.zeros(experts + 1, dtype=torch.int64, device="cuda")
            off[1:] = counts.cumsum(0)
            a = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
            c = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            digits = torch.empty(rows, -(-k // 128), 400, dtype=torch.uint8, device="cuda")
            digits_tactic = GemmTactic("decode", "digits", staged.k_split, staged.launch, staged.output_l2)
            most = woq_digits_rows(call, staged.k_split)
            record = dict(gemm=name, tokens=tokens, rows=rows, max_rows=int(counts.max()), staged=staged.name,
                          digits=digits_tactic.name, digits_rows_fit=most,
                          touched_mb=round(int((counts > 0).sum()) * expert_bytes / 1e6, 2))

            def run_staged() -> None:
                K.grouped_gemm_woq(a, b, KIND.value, scales, off, group, zeros=zeros, c=c, tactic=staged)

            def run_digits() -> None:
                K.token_digits(a, out=digits, group=group)
                K.grouped_gemm_woq(digits, db, dkind, dscales, off, group, zeros=zeros, c=c, tactic=digits_tactic,
                                   out_dtype=torch.bfloat16)

            def run_digits_step() -> None:
                K.token_digits(a, out=digits, group=group)

            def run_digits_gemm() -> None:  # the GEMM alone, on the digits made above
                K.grouped_gemm_woq(digits, db, dkind, dscales, off, group, zeros=zeros, c=c, tactic=digits_tactic,
                                   out_dtype=torch.bfloat16)

            # fp64 reference of the touched experts' rows (each expert's weights dequantized once, on the GPU)
            ref = torch.zeros(rows, n, dtype=torch.float64, device="cuda")
            for x in range(experts):
                lo, hi = int(off[x]), int(off[x + 1])
                if hi > lo:
                    if x not in dense:
                        dense[x] = dequantize_matrix(KIND, b[x], scales[x], None if zeros is None else zeros[x])
                    ref[lo:hi] = a[lo:hi].double() @ dense[x].t()
            forms = {"staged": run_staged}
            if most >= min(8, rows):  # the kernel sizes its chunks by the rows the host knows
                forms.update(digits=run_digits, digits_step=run_digits_step, digits_gemm=run_digits_gemm)
            for form, fn in forms.items():
                if form in ("staged", "digits"):
                    c.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    record[f"{form}_rel_err"] = float((c.double() - ref).norm() / ref.norm())
                record[f"{form}_us"] = round(replay_us(captured(fn)), 2)
            for k_split in KSPLITS:
                if woq_digits_rows(call, k_split) < min(8, rows):
                    continue
                at_split = GemmTactic("decode", "digits", k_split, staged.launch, staged.output_l2)

                def run_split(t: GemmTactic = at_split) -> None:
                    K.token_digits(a, out=digits, group=group)
                    K.grouped_gemm_woq(digits, db, dkind, dscales, off, group, zeros=zeros, c=c, tactic=t,
                                       out_dtype=torch.bfloat16)

                c.fill_(float("nan"))
                run_split()
                torch.cuda.synchronize()
                err = float((c.double() - ref).norm() / ref.norm())
                assert err < 1e-2, f"{name} {tokens} tokens, digits at {k_split} K slices: error {err:.2e}"
                record[f"digits_ks{k_split}_us"] = round(replay_us(captured(run_split)), 2)
            if "digits_us" in record:
                record["staged_over_digits"] = round(record["staged_us"] / record["digits_us"], 3)
            print(record, flush=True)
            rows_out.append(record)
        del dense
    name = "woq_digits_probe.json" if KIND is WoqKind.INT4 else f"woq_digits_probe_{KIND.value}.json"
    json.dump(rows_out, open(os.path.join(os.environ.get("OUT", "."), name), "w"), indent=1)
    print(f"\n{'gemm':<11} {'tok':>4} {'maxr':>4} {'staged':<41} {'us':>7} {'digits us':>9} {'gemm us':>7} "
          f"{'step us':>7} {'ratio':>6} {'err staged':>10} {'err digits':>10} {'TB/s st':>7} {'TB/s dg':>7}")
    for r in rows_out:
        print(f"{r['gemm']:<11} {r['tokens']:>4} {r['max_rows']:>4} {r['staged']:<41} {r['staged_us']:>7.1f} "
              f"{r.get('digits_us', float('nan')):>9.1f} {r.get('digits_gemm_us', float('nan')):>7.1f} "
              f"{r.get('digits_step_us', float('nan')):>7.1f} "
              f"{r.get('staged_over_digits', float('nan')):>6.3f} {r['staged_rel_err']:>10.2e} "
              f"{r.get('digits_rel_err', float('nan')):>10.2e} {r['touched_mb'] / r['staged_us']:>7.2f} "
              f"{r['touched_mb'] / r.get('digits_gemm_us', float('nan')):>7.2f}")  # MB / us: the touched experts' read rate
    print(f"\n{'gemm':<11} {'tok':>4} " + " ".join(f"{'ks' + str(k):>7}" for k in KSPLITS) + "   (digits us)")
    for r in rows_out:
        print(f"{r['gemm']:<11} {r['tokens']:>4} "
              + " ".join(f"{r.get(f'digits_ks{k}_us', float('nan')):>7.1f}" for k in KSPLITS))


if __name__ == "__main__":
    main()
