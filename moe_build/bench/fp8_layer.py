"""`moe-build bench --quant fp8|fp8_static|fp8_block`: our FP8 layer against our bf16 layer, PyTorch's FP8 and bf16
grouped GEMMs and the FP8 floor, in one process.

Why one process, and how every point is timed and checked: as layer.py's bench (shuffled interleaved
rounds, host-syncing fns apart, the ceilings timed among the variants, every variant and graph replay
checked first against an fp64 reference on sampled rows of the input it is timed on). What differs:
- the layers: each bench shape (and DeepSeek-V3) with FP8 experts (workload.FP8_GRANULARITY: fp8 per
  output channel, fp8_block per 128 x 128 block, activations dynamic; fp8_static: fp8's weights with
  static input scales, MODES), random weights quantized with amax / 448 scales;
- the variants: "ours" (our FP8 runner, default plan) and each fusion forced off (the two FP8 input
  quantizations, the gated activation in GEMM1's epilogue, the finalize in GEMM2's epilogue, and the rowwise GEMMs'
  fast accumulation), "ours_bf16" (our
  bf16 runner on the FP8 weights dequantized to bf16), "scaled_grouped_mm" (peers.scaled_grouped_mm_peer;
  block-128 weights reach it dequantized and requantized per output channel) and "grouped_mm_dequant"
  (the bf16 torch._grouped_mm pipeline on the dequantized weights, dequantized once before timing);
- the checks: FP8 variants against the FP8 reference (rel err < FP8_REL_ERR_LIMIT), the bf16 ones against
  the bf16 reference of the dequantized weights (< REL_ERR_LIMIT), each reference reading only the experts
  its rows route to (workload.reference_by_experts);
- the floor: FP8 weight bytes and their scales over the byte ceiling, FLOPs over the e4m3 matmul rate
  (workload.floor_us), both timed among the variants.
"""
from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import torch

from ..errors import MoeBuildError
from ..spec import ActScale, Quant
from ..weights.fp8 import ScaleGranularity
from .layer import (VariantSetup, check_runner_variants, check_variant, gather_points, point_floor, point_line, ratio,
                    require_bench_gpu, runner_force, runner_setup, set_up_variants, time_panel, time_variants)
from .peers import grouped_mm_peer, rowwise_fp8_weights, scaled_grouped_mm_peer
from .timing import CeilingCalls, ceilings_text, measure_ceilings
from .workload import (CHECK_ROWS, FP8_REL_ERR_LIMIT, FP8_SHAPES, FP8_STATIC_INPUT_SCALES, REF_WEIGHT_ELEMENTS, REL_ERR_LIMIT, TOKENS, bench_spec,
                       check_rows, device_fp8_weights, floor_us, fp8_bench_spec, make_inputs,
                       reference_by_experts, rel_err)

class Fp8Mode(NamedTuple):
    """A bench FP8 layer: its --quant name, its quantization and its activation scales."""

    name: str
    quant: Quant
    act_scale: ActScale


# fp8: per-channel weight scales, activations per token row at run time (compressed-tensors' dynamic FP8);
# fp8_static: the same weights with static per-tensor input scales (ModelOpt's FP8 input_scale); fp8_block: 128 x 128
# weight blocks, activations per 1 x 128 group (DeepSeek-V3)
MODES = {m.name: m for m in (Fp8Mode("fp8", Quant.FP8, ActScale.DYNAMIC),
                             Fp8Mode("fp8_static", Quant.FP8, ActScale.STATIC),
                             Fp8Mode("fp8_block", Quant.FP8_BLOCK, ActScale.DYNAMIC))}
# Our FP8 runner (default plan) and each FP8 fusion forced off; then the comparisons. A variant whose stage the
# default plan already has off at every count (block-128: the activation kernel, promoted accumulation; rowwise with an
# intermediate size past FP8_QUANTIZING_MAX_K: GEMM2's input quantized after GEMM1's gated epilogue) is timed all the
# same and marked "off" in the table.
FP8_RUNNER_VARIANTS = ("ours", "ours:fc1_input_quant=separate", "ours:fc2_input_quant=separate",
                       "ours:fc1_activation=separate", "ours:finalize=separate", "ours:fp8_accumulation=promoted")
FP8_OTHERS = ("ours_bf16", "scaled_grouped_mm", "grouped_mm_dequant")
FP8_VARIANTS = (*FP8_RUNNER_VARIANTS, *FP8_OTHERS)
BF16_VARIANTS = ("ours_bf16", "grouped_mm_dequant")  # 16-bit weights: checked against the bf16 reference
REFERENCES = {"fp8": "the FP8 layer's fp64 reference",
              "bf16": "the fp64 reference of the bf16 layer of the dequantized weights",
              "rowwise": "the fp64 reference of the FP8 layer of the block-128 weights requantized per channel"}

# Targets printed per point (never asserted): ours (graph replay) within FLOOR_RATIO of the floor, or the
# floor + FLOOR_SLACK_US where the floor is tiny, up to FLOOR_TARGET_MAX_TOKENS tokens; at least
# BF16_SPEEDUP times faster than ours_bf16 from BF16_TARGET_MIN_TOKENS tokens; faster than
# scaled_grouped_mm everywhere; and each fusion the plan turns on faster than its forced-off variant.
FLOOR_RATIO, FLOOR_SLACK_US, FLOOR_TARGET_MAX_TOKENS = 1.25, 25.0, 256
BF16_SPEEDUP, BF16_TARGET_MIN_TOKENS = 1.6, 4096


def parse_quants(text: str) -> list[Fp8Mode]:
    """--quant: "none" (the bf16 bench: []) or fp8 / fp8_static / fp8_block, comma-separated (duplicates dropped)."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    allowed = ["none", *MODES]
    if not items:
        raise MoeBuildError("quant", "is empty", allowed)
    unknown = [q for q in items if q not in allowed]
    if unknown:
        raise MoeBuildError("quant", f"unknown {', '.join(repr(q) for q in unknown)}", allowed)
    if "none" in items:
        if len(items) > 1:
            raise MoeBuildError("quant", "none (the bf16 bench) cannot be combined with FP8 modes", allowed)
        return []
    return [MODES[q] for q in dict.fromkeys(items)]


def check_variants(variants: Sequence[str]) -> None:
    """Refuse an FP8 bench variant that is neither a runner variant nor one of FP8_OTHERS (one line, exit 2)."""
    check_runner_variants(variants, FP8_OTHERS, "FP8 bench")


def _reference_kind(variant: str, block: bool) -> str:
    if variant in BF16_VARIANTS:
        return "bf16"
    return "rowwise" if variant == "scaled_grouped_mm" and block else "fp8"


def bench_fp8_shape(name: str, mode: Fp8Mode, tokens_list: Sequence[int], ceilings: dict[str, float],
                    ceiling_calls: CeilingCalls, iters: int, warmup: int, input_sets: int, variants: Sequence[str],
                    log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every variant at every token count of one FP8 layer; one record per (mode, shape, tokens)."""
    from ..runner import MoERunner

    spec = fp8_bench_spec(name, mode.quant, mode.act_scale)
    spec16 = bench_spec(name)
    rowwise_spec = fp8_bench_spec(name, Quant.FP8)  # the layer scaled_grouped_mm computes
    t0 = time.time()
    w = device_fp8_weights(spec, seed=list(FP8_SHAPES).index(name))
    block = w.fp8.granularity is ScaleGranularity.BLOCK128
    # The bf16 variants' weights, made by the first of them. The bf16 variants are set up first and the copy is
    # dropped before the others are (their runner and peer hold what they use; the bf16 reference dequantizes a chunk
    # of experts at a time), so the FP8 runners' and the requantized peer's weights never sit beside it: on 80 GB,
    # DeepSeek-V3's did not fit.
    dequantized16 = functools.cache(lambda: w.dequantized(torch.bfloat16))
    w_row = functools.cache(lambda: rowwise_fp8_weights(w))
    max_tokens = max(tokens_list)
    out_buf = torch.empty(max_tokens, spec.hidden_size, device="cuda", dtype=torch.bfloat16)

    def make(v: str) -> VariantSetup:
        if v not in BF16_VARIANTS:
            dequantized16.cache_clear()
        force = runner_force(v)
        if force is not None:
            return runner_setup(MoERunner(spec, w, max_tokens=max_tokens, force=force or None), out_buf)
        if v == "ours_bf16":
            return runner_setup(MoERunner(spec16, dequantized16(), max_tokens=max_tokens), out_buf)
        if v == "scaled_grouped_mm":
            return scaled_grouped_mm_peer(rowwise_spec, w_row()), None, {
                "weights": "the block-128 weights dequantized and requantized per output channel" if block
                else "the layer's FP8 weights and per-channel scales"}
        if v == "grouped_mm_dequant":
            return grouped_mm_peer(spec16, dequantized16()), None, {
                "weights": "the FP8 weights dequantized to bf16 once, outside the timed region"}
        raise ValueError(f"unknown variant {v!r}")

    bf16_first = sorted(variants, key=lambda v: v not in BF16_VARIANTS)
    fns, runners, meta = set_up_variants(bf16_first, make, log, f"{mode.name} {name}")
    dequantized16.cache_clear()
    log(f"{mode.name} {name}: setup {time.time() - t0:.1f}s")
    rowwise = w_row() if "scaled_grouped_mm" in fns else None  # the peer's requantized weights
    layers = {"fp8": (spec, w), "bf16": (spec16, w), "rowwise": (rowwise_spec, rowwise)}
    kinds = {_reference_kind(v, block) for v in fns}
    kinds |= {"fp8"} if "rowwise" in kinds else set()  # the requantized peer is also compared with the layer
    records = []
    for T in tokens_list:
        sets = make_inputs(spec, T, input_sets, seed=T, correction_bias=w.correction_bias)
        touched = statistics.mean(s.touched for s in sets)
        rows = check_rows(spec, sets[0], w.correction_bias)
        refs = {k: reference_by_experts(*layers[k], sets[0], rows) for k in kinds}
        rec: dict[str, Any] = {"quant": mode.name, "shape": name, "H": spec.hidden_size,
                               "I": spec.intermediate_size, "E": spec.num_experts, "top_k": spec.top_k,
                               "tokens": T, "touched_experts": touched, "check_rows": int(rows.numel()),
                               "weight_scales": w.fp8.granularity.value, "variants": {}}
        timers = ceiling_calls.timers()
        for v in variants:
            entry: dict[str, Any] = dict(meta.get(v, {}))
            rec["variants"][v] = entry
            if v not in fns:
                continue
            kind = _reference_kind(v, block)
            entry["checked_against"] = REFERENCES[kind]
            check_variant(v, fns[v], runners.get(v), entry, sets, out_buf, rows, refs[kind],
                          REL_ERR_LIMIT if kind == "bf16" else FP8_REL_ERR_LIMIT, True, timers)
            if kind == "rowwise" and "error" not in entry:  # what requantizing costs it against the layer
                entry["rel_err_vs_layer_reference"] = rel_err(fns[v](sets[0].hidden, sets[0].logits), rows,
                                                              refs["fp8"])
        medians_ms = time_variants(rec, timers, iters, warmup)
        rec.update(point_floor(spec, T, touched, medians_ms, ceilings))
        rec["bf16_floor_us"] = floor_us(spec16, T, touched, rec["ceilings"])["floor_us"]
        fp8_ratios(rec)
        records.append(rec)
        log(f"{mode.name:>10} " + point_line(rec))
    return records


def fp8_ratios(rec: dict[str, Any]) -> None:
    """rec["ratios"] and rec["targets"] of an FP8 point. Runners compare graph replay with graph replay
    (GPU work alone; what a captured step sees), the torch peers eager with ours eager (both called from
    Python); ratios over ours are > 1 where ours is faster."""
    v = rec["variants"]

    def us(name: str, field: str) -> float | None:
        return v.get(name, {}).get(field)

    ours_graph, ours_eager = us("ours", "graph_us"), us("ours", "us")
    rec["ratios"] = {
        "ours_over_floor": ratio(ours_graph, rec["floor_us"]),
        "ours_eager_over_floor": ratio(ours_eager, rec["floor_us"]),
        "ours_over_burst_floor": ratio(ours_graph, rec["burst_floor_us"]),
        "ours_bf16_over_ours": ratio(us("ours_bf16", "graph_us"), ours_graph),
        "scaled_grouped_mm_over_ours": ratio(us("scaled_grouped_mm", "us"), ours_eager),
        "grouped_mm_dequant_over_ours": ratio(us("grouped_mm_dequant", "us"), ours_eager),
        "forced_over_ours": {name: ratio(e.get("graph_us"), ours_graph) for name, e in v.items()
                             if name.startswith("ours:")},
    }
    rec["targets"] = fp8_targets(rec)


def fp8_targets(rec: dict[str, Any]) -> dict[str, Any]:
    """The point's targets (module constants) with whether each is met (None: not measured)."""
    r, T, floor = rec["ratios"], rec["tokens"], rec["floor_us"]
    ours = rec["variants"].get("ours", {})
    targets: dict[str, Any] = {}
    if T <= FLOOR_TARGET_MAX_TOKENS:
        limit = max(FLOOR_RATIO * floor, floor + FLOOR_SLACK_US)
        targets["floor"] = {"limit_us": limit, "met": ours["graph_us"] <= limit if ours.get("graph_us") else None}
    if T >= BF16_TARGET_MIN_TOKENS:
        speedup = r["ours_bf16_over_ours"]
        targets["vs_bf16"] = {"at_least": BF16_SPEEDUP, "met": speedup >= BF16_SPEEDUP if speedup else None}
    faster = r["scaled_grouped_mm_over_ours"]
    targets["vs_scaled_grouped_mm"] = {"met": faster > 1.0 if faster else None}
    fusions = {}
    for name, over in r["forced_over_ours"].items():
        force = runner_force(name) or {}
        plan = ours.get("plan")
        on = None if plan is None else any(plan.get(stage) != choice for stage, choice in force.items())
        fusions[name] = {"on": on, "wins": over > 1.0 if on and over else None}
    targets["fusions"] = fusions
    return targets


def _mark(met: bool | None) -> str:
    return "-" if met is None else "ok" if met else "MISS"


def _fusion_mark(fusion: dict[str, Any]) -> str:
    if fusion["on"] is None:
        return "-"
    if not fusion["on"]:
        return "off"
    return "wins" if fusion["wins"] else "-" if fusion["wins"] is None else "loses"


def table(results: dict[str, Any]) -> str:
    """The short table printed last (us, medians): ours graph-replayed against the floor and its target,
    ours_bf16 (graph) and the torch peers (eager, over ours eager), each forced-off variant over ours
    (graph; "wins": the fusion the plan turns on is faster), then how many targets were met."""
    lines = [f"{'quant':<10}{'shape':<17}{'T':>5}{'floor':>9}{'ours':>9}{'x fl':>6}{'fl tgt':>7}{'bf16':>9}"
             f"{'bf16/o':>7}{'bf tgt':>7}{'sgm':>9}{'sgm/o':>7}{'deq':>9}  fusions (forced-off / ours, graph)"]
    met = total = 0
    for p in results["points"]:
        v, r, t = p["variants"], p["ratios"], p["targets"]
        us = lambda k, f="us": f"{v[k][f]:.1f}" if v.get(k, {}).get(f) else "-"  # noqa: E731
        x = lambda val: f"{val:.2f}" if val else "-"  # noqa: E731
        fusions = "; ".join(f"{k.split(':', 1)[1]} {x(r['forced_over_ours'].get(k))} {_fusion_mark(f)}"
                            for k, f in t["fusions"].items())
        for target in (t.get("floor"), t.get("vs_bf16"), t["vs_scaled_grouped_mm"]):
            if target is not None and target["met"] is not None:
                total += 1
                met += bool(target["met"])
        lines.append(f"{p['quant']:<10}{p['shape']:<17}{p['tokens']:>5}{p['floor_us']:>9.1f}{us('ours', 'graph_us'):>9}"
                     f"{x(r['ours_over_floor']):>6}{_mark(t.get('floor', {}).get('met')):>7}"
                     f"{us('ours_bf16', 'graph_us'):>9}{x(r['ours_bf16_over_ours']):>7}"
                     f"{_mark(t.get('vs_bf16', {}).get('met')):>7}{us('scaled_grouped_mm'):>9}"
                     f"{x(r['scaled_grouped_mm_over_ours']):>7}{us('grouped_mm_dequant'):>9}  {fusions}")
    lines.append(f"targets met: {met} of {total} (floor at <= {FLOOR_TARGET_MAX_TOKENS} tokens, "
                 f"{BF16_SPEEDUP}x ours_bf16 at >= {BF16_TARGET_MIN_TOKENS}, faster than scaled_grouped_mm "
                 f"eager-to-eager: 'sgm/o' > 1)")
    return "\n".join(lines)


def plot(results: dict[str, Any], png: Path) -> None:
    """One panel per (quant, shape): time vs tokens for ours, ours_bf16, the torch peers and the floor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quants = list(dict.fromkeys(p["quant"] for p in results["points"]))
    shapes = list(dict.fromkeys(p["shape"] for p in results["points"]))
    fig, axes = plt.subplots(len(quants), len(shapes), figsize=(5 * len(shapes), 4 * len(quants)), squeeze=False)
    lines = [("ours", "graph_us", "ours FP8 (graph replay)"), ("ours_bf16", "graph_us", "ours bf16 (graph replay)"),
             ("scaled_grouped_mm", "us", "torch._scaled_grouped_mm"),
             ("grouped_mm_dequant", "us", "torch._grouped_mm, dequantized")]
    for row, quant in zip(axes, quants):
        for ax, shape in zip(row, shapes):
            pts = [p for p in results["points"] if p["quant"] == quant and p["shape"] == shape]
            time_panel(ax, pts, lines, "FP8 floor", f"{shape} {quant}", fontsize=7)
    fig.suptitle(f"FP8 SwiGLU MoE layer on {results['device']}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def run_fp8_bench(quants: Sequence[Fp8Mode], shapes: Sequence[str] = FP8_SHAPES, tokens_list: Sequence[int] = TOKENS,
                  out_json: Path | None = None, png: Path | None = None, iters: int = 20, warmup: int = 3,
                  input_sets: int = 4, variants: Sequence[str] = FP8_VARIANTS,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole FP8 comparison; writes JSON (after every shape) and PNG when paths are given."""
    require_bench_gpu()
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        raise MoeBuildError("quant", f"FP8 needs compute capability 8.9 or later, this GPU is sm{major}{minor}",
                            "none on this GPU")
    unknown = [s for s in shapes if s not in FP8_SHAPES]
    if unknown:
        raise MoeBuildError("shapes", f"unknown {unknown}", FP8_SHAPES)
    check_variants(variants)
    torch.manual_seed(0)
    ceiling_calls = CeilingCalls(fp8=True)
    ceilings = measure_ceilings(ceiling_calls)
    log(ceilings_text(ceilings))
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "ceilings": ceilings,
        "quant": [q.name for q in quants],
        "method": {"iters": iters, "warmup": warmup, "input_sets": input_sets, "stat": "median",
                   "timer": "cuda events per call",
                   "order": "variants (eager and graph) timed in turn, one call each per round, order shuffled "
                            "each round; variants that sync with the host timed after, as a group of their own",
                   "layers": "fp8: e4m3 W1/W2 with fp32 per-output-channel scales; fp8_block: per 128 x 128 block "
                             "scales; activations quantized at run time (per token row; fp8_block per 1 x 128 "
                             "group); fp8_static: fp8's weights with static per-tensor input scales "
                             f"{[round(a * 448, 2) for a in FP8_STATIC_INPUT_SCALES]} / 448 (ModelOpt's "
                             "input_scale); random fan-in-scaled weights quantized with amax / 448 scales",
                   "variants": {"ours": "our FP8 runner, default plan; ours:STAGE=CHOICE that stage forced",
                                "ours_bf16": "our bf16 runner on the FP8 weights dequantized to bf16",
                                "scaled_grouped_mm": "torch._scaled_grouped_mm, rowwise scales (block-128 weights "
                                                     "dequantized and requantized per output channel)",
                                "grouped_mm_dequant": "bf16 torch._grouped_mm on the weights dequantized once, "
                                                      "outside the timed region"},
                   "ceilings": "a 1 GiB copy, a read-only sum of 1 GiB, an 8192^3 bf16 matmul and an 8192^3 e4m3 "
                               "torch._scaled_mm (tensor scales, fp32 accumulation promoted), timed at every "
                               "point among its non-syncing variants; also once at the start (burst)",
                   "floor": "max((touched experts' FP8 weights + fp32 scales + bf16 activations in/out) / the "
                            "higher of copy and read rates, FLOPs / e4m3 matmul rate); bf16_floor_us: the same "
                            "layer in bf16",
                   "check": f"fp64 reference on <= {CHECK_ROWS + 2} sampled rows (while their experts hold <= "
                            f"{REF_WEIGHT_ELEMENTS} weight elements), rel-norm err < {FP8_REL_ERR_LIMIT} for FP8 "
                            f"variants against the FP8 reference, < {REL_ERR_LIMIT} for bf16 ones against the "
                            f"bf16 reference of the dequantized weights",
                   "ratios": "runners graph replay over graph replay; torch peers eager over ours eager; > 1: "
                             "ours is faster",
                   "router_linear": "excluded for every variant (all take fp32 router logits)"},
        "points": [],
    }
    gather_points(results, (functools.partial(bench_fp8_shape, name, mode, tokens_list, ceilings, ceiling_calls,
                                              iters, warmup, input_sets, variants, log)
                            for mode in quants for name in shapes), out_json)
    if png is not None:
        plot(results, Path(png))
    return results
