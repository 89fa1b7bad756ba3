"""`moe-build bench --quant w4a16_awq|w8a16|wfp4a16|w4afp8`: our weight-only layer (and W4AFP8's, int4 weights with
FP8 activations) against our bf16 layer, PyTorch's bf16 grouped GEMM on the dequantized weights and the
quantized-byte floor, in one process.

Timed and checked as the FP8 bench (fp8_layer.py: shuffled interleaved rounds, ceilings among the variants, every
variant and graph replay checked first against an fp64 reference on sampled rows). What differs:
- the layers (WOQ_LAYERS): each bench shape with weight-only experts, random fan-in-scaled weights quantized
  round-to-nearest (woq.quantize_matrix): W4A16 AWQ as AutoAWQ stores it (int4, group 128, zero points) with AWQ
  pre-quant scales, W8A16 per output channel, WFP4A16 as GPT-OSS stores it (MXFP4, e8m0 scales per 32), W4AFP8 as
  ModelOpt's W4A8_AWQ stores it (int4 group 128, AWQ pre-quant scales, static FP8 input scales), and as
  w4afp8_dynamic with each row's FP8 scale taken at run time (compressed-tensors' W4AFP8 scheme);
- the variants: "ours" (default plan) and, for AWQ, the FC2 pre-quant fusion forced off, for W4AFP8 also the FC1
  pre-quant fusion in the expansion (expand_rows=plain: a 16-bit expansion, then a kernel that scales and quantizes),
  for all but WFP4A16 the finalize in the decode GEMM2's epilogue (finalize=separate), and for W4A16 and W4AFP8 with
  static scales (W4AFP8 runs W4A16's GEMMs) the token digits made by steps of their own (token_digits=separate);
  "ours_bf16" (our bf16 runner on the weights dequantized to bf16) and "grouped_mm_dequant" (bf16 torch._grouped_mm
  on them);
- the floor: the stored weight bytes (weights + scales + zero points) over the byte ceiling, FLOPs over the bf16
  matmul rate.
"""
from __future__ import annotations

import functools
import math
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..errors import MoeBuildError
from ..spec import ActScale, MoESpec, Quant
from ..weights import MoEWeights
from ..weights.woq import WoqKind, WoqWeights, quantize_matrix
from .layer import (VariantSetup, check_runner_variants, check_variant, gather_points, point_floor, point_line, ratio,
                    require_bench_gpu, runner_force, runner_setup, set_up_variants, time_variants)
from .peers import grouped_mm_peer
from .timing import CeilingCalls, ceilings_text, measure_ceilings
from .workload import (REL_ERR_LIMIT, SHAPES, TOKENS, W4AFP8_REL_ERR_LIMIT, WOQ_REL_ERR_LIMIT, bench_spec, check_rows,
                       floor_us, make_inputs, reference_by_experts)

# quant -> (stored kind, group size (None: per output channel; int4: the largest of 128, 64, 32 that divides both
# GEMMs' K, e.g. 64 for GPT-OSS-20B's 2880), zero points, AWQ pre-quant scales)
WOQ_LAYERS: dict[Quant, tuple[WoqKind, int | None, bool, bool]] = {
    Quant.W4A16_AWQ: (WoqKind.INT4, 128, True, True),
    Quant.W8A16: (WoqKind.INT8, None, False, False),
    Quant.WFP4A16: (WoqKind.MXFP4, 32, False, False),
    Quant.W4AFP8: (WoqKind.INT4, 128, False, True),
}
# --quant's names: each quant (W4AFP8's as ModelOpt's W4A8_AWQ, static FP8 input scales), and w4afp8_dynamic: W4AFP8
# with each row's FP8 scale taken at run time (compressed-tensors' W4AFP8 scheme), no input scales stored
QUANTS: dict[str, tuple[Quant, ActScale]] = {
    **{q.value: (q, ActScale.STATIC if q is Quant.W4AFP8 else ActScale.DYNAMIC) for q in WOQ_LAYERS},
    "w4afp8_dynamic": (Quant.W4AFP8, ActScale.DYNAMIC)}
# the forced-off fusions, per quant: the AWQ FC2 pre-quant scale in the activation; the FC1 one in the expansion;
# the finalize in the decode GEMM2's epilogue (WFP4A16's matrix never fuses it); the digits tile's token digits in the
# expansion and the activation (a layer with no GEMM on the digits tile refuses the variant: recorded unavailable);
# the gated activation in the mixed-input wgmma GEMM1's epilogue (int4 / int8 with 16-bit activations)
FORCED = {Quant.W4A16_AWQ: ("ours:expand_rows=plain", "ours:fc2_prequant=separate", "ours:finalize=separate",
                            "ours:token_digits=separate", "ours:fc1_activation=separate"),
          Quant.W8A16: ("ours:finalize=separate", "ours:fc1_activation=separate"),
          Quant.W4AFP8: ("ours:expand_rows=plain", "ours:fc2_prequant=separate", "ours:finalize=separate",
                         "ours:token_digits=separate", "ours:fc1_activation=separate")}
# W4AFP8's static FP8 input scales, for the bench's unit-variance tokens: GEMM1's input up to ~4.5 sigma times an AWQ
# scale below 2, the activation's up to ~3 times one below 2, saturating above (tests/gpu/test_runner_w4afp8.py's)
W4AFP8_INPUT_SCALES = (6.0 / 448, 4.0 / 448)
OTHERS = ("ours_bf16", "grouped_mm_dequant")
# Targets printed per point (issue 47; never asserted): ours (graph replay) within FLOOR_RATIO of the floor or the
# floor + FLOOR_SLACK_US at <= FLOOR_TARGET_MAX_TOKENS tokens; faster than ours_bf16 at 256; within BF16_RATIO of
# ours_bf16 at 4096.
FLOOR_RATIO, FLOOR_SLACK_US, FLOOR_TARGET_MAX_TOKENS = 1.3, 25.0, 16
BF16_RATIO = 1.25


def default_variants(quant: Quant, act_scale: ActScale = ActScale.STATIC) -> tuple[str, ...]:
    """What a point times unless --variants says otherwise: ours, each fusion its plan turns on forced off, then
    OTHERS (W4AFP8 with per-row scales makes its token digits by steps of their own, rules.digits_row_scale_pays,
    and runs no gated epilogue, rules.gated_epilogue_gemm)."""
    forced = FORCED.get(quant, ())
    if quant is Quant.W4AFP8 and act_scale is not ActScale.STATIC:
        forced = tuple(v for v in forced if v not in ("ours:token_digits=separate", "ours:fc1_activation=separate"))
    return ("ours", *forced, *OTHERS)


def check_variants(variants: Sequence[str]) -> None:
    """Refuse a weight-only bench variant that is neither a runner variant nor one of OTHERS (one line, exit 2)."""
    check_runner_variants(variants, OTHERS, "weight-only bench")


def layer_group(spec: MoESpec, quant: Quant) -> int | None:
    """The bench layer's group size: WOQ_LAYERS', halved for int4 until it divides the hidden and intermediate
    sizes (every int4 checkpoint's groups divide its K)."""
    kind, group, _, _ = WOQ_LAYERS[quant]
    while kind is WoqKind.INT4 and group and (spec.hidden_size % group or spec.intermediate_size % group):
        group //= 2
    return group


def woq_bench_spec(name: str, quant: Quant, act_scale: ActScale = ActScale.STATIC) -> MoESpec:
    """The bench layer `name` with `quant`'s experts (WOQ_LAYERS); W4AFP8's FP8 input scales static or dynamic."""
    _, _, zeros, awq = WOQ_LAYERS[quant]
    group = layer_group(bench_spec(name), quant)
    scales = {"act_scale": act_scale} if quant is Quant.W4AFP8 else {}
    return bench_spec(name).with_overrides(quant=quant, quant_group_size=group or 128, quant_zero_points=zeros,
                                           quant_per_channel=group is None, quant_prequant_scales=awq, **scales)


def stored_expert_bytes(w: WoqWeights) -> int:
    """One expert's stored bytes as the GEMMs read them: W1 / W2 data, scales and zero points."""
    per_expert = ("w1", "w2", "w1_scale", "w2_scale", "w1_zero", "w2_zero")
    return sum(t[0].numel() * t.element_size() for n, t in w.named() if n in per_expert)


def device_woq_weights(spec: MoESpec, quant: Quant, seed: int) -> MoEWeights:
    """Random fan-in-scaled weights quantized weight-only as WOQ_LAYERS says, one expert at a time on the GPU."""
    kind, _, zeros, awq = WOQ_LAYERS[quant]
    group = layer_group(spec, quant)
    g = torch.Generator(device="cuda").manual_seed(seed)
    E, H, I, N1 = spec.num_experts, spec.hidden_size, spec.intermediate_size, spec.fc1_out_features

    def quantized(rows: int, cols: int) -> list[torch.Tensor | None]:
        parts = [quantize_matrix(kind, torch.randn(rows, cols, device="cuda", generator=g) / math.sqrt(cols), group,
                                 zeros) for _ in range(E)]
        return [None if parts[0][i] is None else torch.stack([p[i] for p in parts]) for i in range(3)]

    (q1, s1, z1), (q2, s2, z2) = quantized(N1, H), quantized(H, I)
    pre = {}
    if awq:
        pre = {"fc1_act_scale": 0.5 + 1.5 * torch.rand(H, device="cuda", generator=g),
               "fc2_act_scale": 0.5 + 1.5 * torch.rand(I, device="cuda", generator=g)}
    if quant is Quant.W4AFP8 and spec.act_scale is ActScale.STATIC:
        pre.update(a1_scale=torch.tensor(W4AFP8_INPUT_SCALES[0], device="cuda"),
                   a2_scale=torch.tensor(W4AFP8_INPUT_SCALES[1], device="cuda"))
    woq = WoqWeights(kind, 32 if kind is WoqKind.MXFP4 else group, q1, q2, s1, s2, z1, z2, **pre)
    router = (torch.randn(E, H, device="cuda", generator=g) / math.sqrt(H)).to(torch.bfloat16)
    return MoEWeights(router_weight=router, w1=q1, w2=q2, woq=woq)


def bench_woq_shape(name: str, mode: str, tokens_list: Sequence[int], ceilings: dict[str, float],
                    ceiling_calls: CeilingCalls, iters: int, warmup: int, input_sets: int,
                    log: Callable[[str], None], variants: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Every variant (None: default_variants) at every token count of one weight-only layer (`mode`: a QUANTS
    name); one record per (mode, shape, tokens)."""
    from ..runner import MoERunner

    quant, act_scale = QUANTS[mode]
    spec, spec16 = woq_bench_spec(name, quant, act_scale), bench_spec(name)
    t0 = time.time()
    w = device_woq_weights(spec, quant, seed=list(SHAPES).index(name))
    # the bf16 layer the others run: the AWQ scales folded in exactly as the reference applies them is not a
    # bf16 layer, so the bf16 variants run the dequantized weights without pre-quant scales (their own reference,
    # which dequantizes a chunk of experts at a time); made by the first of them, dropped after setup
    dequantized16 = functools.cache(lambda: w.dequantized(torch.bfloat16))
    variants = default_variants(quant, act_scale) if variants is None else tuple(variants)
    max_tokens = max(tokens_list)
    out_buf = torch.empty(max_tokens, spec.hidden_size, device="cuda", dtype=torch.bfloat16)

    def make(v: str) -> VariantSetup:
        force = runner_force(v)
        if force is not None:
            return runner_setup(MoERunner(spec, w, max_tokens=max_tokens, force=force or None), out_buf)
        if v == "ours_bf16":
            return runner_setup(MoERunner(spec16, dequantized16(), max_tokens=max_tokens), out_buf)
        if v == "grouped_mm_dequant":
            return grouped_mm_peer(spec16, dequantized16()), None, {
                "weights": "the weights dequantized to bf16 once, outside the timed region"}
        raise ValueError(f"unknown variant {v!r}")

    fns, runners, meta = set_up_variants(variants, make, log, f"{mode} {name}")
    dequantized16.cache_clear()
    log(f"{mode} {name}: setup {time.time() - t0:.1f}s")
    expert_bytes = stored_expert_bytes(w.woq)
    records = []
    for T in tokens_list:
        sets = make_inputs(spec, T, input_sets, seed=T, correction_bias=None)
        touched = statistics.mean(s.touched for s in sets)
        rows = check_rows(spec, sets[0], None)
        refs = {"woq": reference_by_experts(spec, w, sets[0], rows),
                "bf16": reference_by_experts(spec16, w, sets[0], rows)}
        rec: dict[str, Any] = {"quant": mode, "shape": name, "H": spec.hidden_size,
                               "I": spec.intermediate_size, "E": spec.num_experts, "top_k": spec.top_k,
                               "tokens": T, "touched_experts": touched, "check_rows": int(rows.numel()),
                               "group": w.woq.group_size, "stored_expert_bytes": expert_bytes, "variants": {}}
        timers = ceiling_calls.timers()
        for v in variants:
            entry: dict[str, Any] = dict(meta.get(v, {}))
            rec["variants"][v] = entry
            if v in fns:
                kind = "woq" if v.startswith("ours") and v != "ours_bf16" else "bf16"
                limit = (W4AFP8_REL_ERR_LIMIT if quant is Quant.W4AFP8 else WOQ_REL_ERR_LIMIT) if kind == "woq" \
                    else REL_ERR_LIMIT
                check_variant(v, fns[v], runners.get(v), entry, sets, out_buf, rows, refs[kind], limit, True, timers)
        medians_ms = time_variants(rec, timers, iters, warmup)
        rec.update(point_floor(spec16, T, touched, medians_ms, ceilings))
        rec["bf16_floor_us"] = rec["floor_us"]
        rec.update(floor_us(spec16, T, touched, rec["ceilings"], expert_bytes=expert_bytes))
        woq_ratios(rec)
        records.append(rec)
        log(f"{mode:>9} " + point_line(rec))
    return records


def woq_ratios(rec: dict[str, Any]) -> None:
    """rec["ratios"] and rec["targets"]: runners graph replay over graph replay, the torch peer eager over ours
    eager; > 1 where ours is faster."""
    v = rec["variants"]
    ours = v.get("ours", {})
    T, floor = rec["tokens"], rec["floor_us"]
    r = rec["ratios"] = {
        "ours_over_floor": ratio(ours.get("graph_us"), floor),
        "ours_bf16_over_ours": ratio(v.get("ours_bf16", {}).get("graph_us"), ours.get("graph_us")),
        "grouped_mm_dequant_over_ours": ratio(v.get("grouped_mm_dequant", {}).get("us"), ours.get("us")),
        "forced_over_ours": {n: ratio(e.get("graph_us"), ours.get("graph_us")) for n, e in v.items()
                             if n.startswith("ours:")},
    }
    t: dict[str, Any] = {}
    if T <= FLOOR_TARGET_MAX_TOKENS and ours.get("graph_us"):
        limit = max(FLOOR_RATIO * floor, floor + FLOOR_SLACK_US)
        t["floor"] = {"limit_us": limit, "met": ours["graph_us"] <= limit}
    speedup = r["ours_bf16_over_ours"]
    if speedup and T == 256:
        t["vs_bf16"] = {"at_least": 1.0, "met": speedup > 1.0}
    elif speedup and T >= 4096:
        t["vs_bf16"] = {"at_least": 1 / BF16_RATIO, "met": speedup >= 1 / BF16_RATIO}
    t["fusions"] = {n: {"wins": over > 1.0 if over else None} for n, over in r["forced_over_ours"].items()}
    rec["targets"] = t


def table(results: dict[str, Any]) -> str:
    """The short table printed last (us, medians; ours and ours_bf16 graph-replayed)."""
    lines = [f"{'quant':<15}{'shape':<17}{'T':>5}{'floor':>9}{'ours':>9}{'x fl':>6}{'fl tgt':>7}{'bf16':>9}"
             f"{'bf16/o':>7}{'bf tgt':>7}{'deq':>9}  fusions (forced-off / ours, graph)"]
    for p in results["points"]:
        v, r, t = p["variants"], p["ratios"], p["targets"]
        us = lambda k, f="us": f"{v[k][f]:.1f}" if v.get(k, {}).get(f) else "-"  # noqa: E731
        x = lambda val: f"{val:.2f}" if val else "-"  # noqa: E731
        mark = lambda tg: "-" if tg is None else "ok" if tg["met"] else "MISS"  # noqa: E731
        fusions = "; ".join(f"{k.split(':', 1)[1]} {x(r['forced_over_ours'].get(k))}" for k in t["fusions"])
        errors = "; ".join(f"{k}: {e['error'][:60]}" for k, e in v.items() if e.get("error"))
        lines.append(f"{p['quant']:<15}{p['shape']:<17}{p['tokens']:>5}{p['floor_us']:>9.1f}"
                     f"{us('ours', 'graph_us'):>9}{x(r['ours_over_floor']):>6}{mark(t.get('floor')):>7}"
                     f"{us('ours_bf16', 'graph_us'):>9}{x(r['ours_bf16_over_ours']):>7}{mark(t.get('vs_bf16')):>7}"
                     f"{us('grouped_mm_dequant'):>9}  {fusions}{'  ' + errors if errors else ''}")
    return "\n".join(lines)


def run_woq_bench(modes: Sequence[str], shapes: Sequence[str] = tuple(SHAPES), tokens_list: Sequence[int] = TOKENS,
                  out_json: Path | None = None, iters: int = 20, warmup: int = 3, input_sets: int = 4,
                  log: Callable[[str], None] = print, variants: Sequence[str] | None = None) -> dict[str, Any]:
    """The whole weight-only comparison of `modes` (QUANTS names; `variants` at every point, None: each quant's
    default_variants); writes JSON after every shape when a path is given."""
    require_bench_gpu()
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise MoeBuildError("shapes", f"unknown {unknown}", tuple(SHAPES))
    if variants is not None:
        check_variants(variants)
    torch.manual_seed(0)
    ceiling_calls = CeilingCalls(fp8=False)
    ceilings = measure_ceilings(ceiling_calls)
    log(ceilings_text(ceilings))
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "ceilings": ceilings,
        "quant": list(modes),
        "method": {"iters": iters, "warmup": warmup, "input_sets": input_sets, "stat": "median",
                   "layers": {m: {"kind": k.value, "group": g, "zero_points": z, "awq_scales": a,
                                  **({"act_scale": QUANTS[m][1].value} if QUANTS[m][0] is Quant.W4AFP8 else {})}
                              for m in modes for k, g, z, a in [WOQ_LAYERS[QUANTS[m][0]]]},
                   "variants": {"ours": "our weight-only runner, default plan; ours:STAGE=CHOICE that stage forced",
                                "ours_bf16": "our bf16 runner on the weights dequantized to bf16 (no AWQ scales)",
                                "grouped_mm_dequant": "bf16 torch._grouped_mm on the same dequantized weights"},
                   "floor": "max((touched experts' stored bytes: weights, scales, zero points + bf16 activations in "
                            "and out) / the higher of copy and read rates, FLOPs / bf16 matmul rate); "
                            "bf16_floor_us: the same layer in bf16",
                   "check": f"fp64 references on sampled rows, rel-norm err < {WOQ_REL_ERR_LIMIT} for ours against "
                            f"the weight-only layer's (w4afp8: < {W4AFP8_REL_ERR_LIMIT}), < {REL_ERR_LIMIT} for the "
                            "bf16 variants against the dequantized bf16 layer's",
                   "ratios": "runners graph replay over graph replay; the torch peer eager over ours eager"},
        "points": [],
    }
    gather_points(results, (functools.partial(bench_woq_shape, name, mode, tokens_list, ceilings, ceiling_calls,
                                              iters, warmup, input_sets, log, variants)
                            for mode in modes for name in shapes), out_json)
    return results
