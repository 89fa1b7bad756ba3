"""`moe-build bench`: our fused runner against its peers and the hardware floor, in one process.

Why one process: peers, variants and ceilings measured side by side on the same card in the same state
are comparable. Timing follows `timing` (medians of CUDA events, shuffled interleaved rounds, host-syncing
fns apart, ceilings timed among the variants of every point); inputs rotate among several sets so no
variant is flattered by a warm cache; every timed variant is first checked against the fp64 reference on
sampled rows of the very input it is timed on, and its graph replay is checked too.
"""
from __future__ import annotations

import functools
import json
import statistics
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from ..errors import MoeBuildError
from ..planner import parse_force
from ..spec import MoESpec, Quant
from .peers import grouped_mm_peer, hf_eager_peer, naive_peer
from .timing import (CeilingCalls, ceiling_rates, ceilings_text, flush_l2, interleaved_median_ms, measure_ceilings,
                     syncs_host)
from .workload import (CHECK_ROWS, REL_ERR_LIMIT, SHAPES, TOKENS, Fn, InputSet, bench_spec, device_weights, floor_us,
                       make_inputs, reference_rows, rel_err)

# Our runner's variants: "ours" (the default plan) or "ours:STAGE=CHOICE[+STAGE=CHOICE...]" (those stages
# forced, e.g. "ours:gemm1_tactic=wgmma:pingpong64x128:plain:evict_last"). The default set: each fusion
# forced off one at a time, and the fused finalize forced on (the planner turns it on at every size for
# intermediate sizes >= 2048, else past 8 rows per expert; this shows what it costs below that).
RUNNER_VARIANTS = ("ours", "ours:routing_prologue=three_step", "ours:finalize=separate", "ours:finalize=fused",
                   "ours:fc1_activation=separate", "ours:gemm_kernel=ampere+fc1_activation=fused_gated",
                   "ours:gemm_kernel=ampere+fc1_activation=separate")
PEERS = ("naive", "grouped_mm", "hf_eager")
Timers = dict[tuple[str, str], Callable[[int], object]]  # (variant or "ceiling", field) -> fn(input index)


def runner_force(variant: str) -> dict[str, str] | None:
    """The stages a runner variant forces ({} for "ours"), or None when `variant` is not a runner variant."""
    if variant == "ours":
        return {}
    if not variant.startswith("ours:"):
        return None
    items = variant[len("ours:"):].split("+")
    if not all(stage and choice for stage, _, choice in (item.partition("=") for item in items)):
        raise MoeBuildError("variants", f"{variant!r}: expected ours:STAGE=CHOICE[+STAGE=CHOICE]",
                            "ours, ours:STAGE=CHOICE, " + ", ".join(PEERS))
    return parse_force(items, field="variants")


def require_bench_gpu() -> None:
    """Every bench times the local GPU: without one, one line before anything asks torch.cuda about it."""
    if not torch.cuda.is_available():
        raise MoeBuildError("device", "moe-build bench needs a CUDA GPU", "a machine with an NVIDIA GPU")


def check_runner_variants(variants: Sequence[str], others: Sequence[str], bench: str) -> None:
    """Refuse a variant of `bench` that is neither a runner variant (ours, ours:STAGE=CHOICE) nor one of its
    `others` (one line, exit 2)."""
    for v in variants:
        if runner_force(v) is None and v not in others:
            raise MoeBuildError("variants", f"unknown {bench} variant {v!r}", ["ours", "ours:STAGE=CHOICE", *others])


# Every runner variant is also replayed from CUDA graphs (one per input set), recorded as "graph_us": what
# a deployment that captures its step sees, without the per-kernel Python/ctypes launch cost, so fused and
# unfused variants compare on the GPU work alone. `eager=False` times the graph replays only (the sweep).
def runner_fn(runner: Any, out: torch.Tensor) -> Fn:
    def run(hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return runner(hidden, router_logits=logits, out=out[: hidden.shape[0]])
    return run


# A variant as set up: its callable, the runner behind it (None for a torch peer) and fields for its record.
VariantSetup = tuple[Fn, Any, "dict[str, Any] | None"]


def runner_setup(runner: Any, out: torch.Tensor) -> VariantSetup:
    """One of our runners as a variant (its calls write into `out`)."""
    return runner_fn(runner, out), runner, None


def set_up_variants(variants: Sequence[str], make: Callable[[str], VariantSetup], log: Callable[[str], None],
                    label: str) -> tuple[dict[str, Fn], dict[str, Any], dict[str, dict[str, Any]]]:
    """Every variant's callable, runner and record fields, by `make`; one whose setup fails (a plan its forced stages
    refuse, a peer that torch or transformers lacks) is recorded with its error and left out of the timing instead of
    ending the bench."""
    fns: dict[str, Fn] = {}
    runners: dict[str, Any] = {}
    meta: dict[str, dict[str, Any]] = {}
    for v in variants:
        try:
            fn, runner, info = make(v)
        except (MoeBuildError, ImportError, RuntimeError, ValueError) as e:
            meta[v] = {"error": f"{type(e).__name__}: {e}"}
            log(f"  {label}: {v} unavailable: {e}")
            continue
        fns[v] = fn
        if runner is not None:
            runners[v] = runner
        if info:
            meta[v] = info
    return fns, runners, meta


def bench_shape(name: str, tokens_list: Sequence[int], ceilings: dict[str, float], ceiling_calls: CeilingCalls,
                iters: int, warmup: int, input_sets: int, variants: Sequence[str],
                log: Callable[[str], None], eager: bool = True) -> list[dict[str, Any]]:
    """Every variant at every token count of one shape; returns one record per (shape, tokens).
    `ceilings` are the run's burst ceilings; each point's floor comes from `ceiling_calls` timed
    among its variants (point_floor)."""
    from ..runner import MoERunner

    spec = bench_spec(name)
    t0 = time.time()
    w = device_weights(spec, seed=list(SHAPES).index(name))
    w64 = w.to("cpu", torch.float64)
    max_tokens = max(tokens_list)
    out_buf = torch.empty(max_tokens, spec.hidden_size, device="cuda", dtype=torch.bfloat16)

    def make(v: str) -> VariantSetup:
        force = runner_force(v)
        if force is not None:
            return runner_setup(MoERunner(spec, w, max_tokens=max_tokens, force=force or None), out_buf)
        if v == "naive":
            return naive_peer(spec, w), None, None
        if v == "grouped_mm":
            return grouped_mm_peer(spec, w), None, None
        if v == "hf_eager":
            fn, block = hf_eager_peer(spec, w, SHAPES[name][4])
            return fn, None, {"block": block}
        raise ValueError(f"unknown variant {v!r}")

    fns, runners, meta = set_up_variants(variants, make, log, name)
    log(f"{name}: setup {time.time() - t0:.1f}s")
    records = []
    for T in tokens_list:
        sets = make_inputs(spec, T, input_sets, seed=T)
        touched = statistics.mean(s.touched for s in sets)
        rows, ref = reference_rows(spec, w64, sets[0])
        rec: dict[str, Any] = {"shape": name, "H": spec.hidden_size, "I": spec.intermediate_size,
                               "E": spec.num_experts, "top_k": spec.top_k, "tokens": T,
                               "touched_experts": touched, "variants": {}}
        timers = ceiling_calls.timers()
        for v in variants:
            entry: dict[str, Any] = dict(meta.get(v, {}))
            rec["variants"][v] = entry
            if v in fns:
                check_variant(v, fns[v], runners.get(v), entry, sets, out_buf, rows, ref, REL_ERR_LIMIT, eager,
                              timers)
        medians_ms = time_variants(rec, timers, iters, warmup)
        rec.update(point_floor(spec, T, touched, medians_ms, ceilings))
        ratios(rec)
        records.append(rec)
        log(point_line(rec))
    return records


def check_variant(v: str, fn: Fn, runner: Any | None, entry: dict[str, Any], sets: list[InputSet],
                  out_buf: torch.Tensor, rows: torch.Tensor, ref: torch.Tensor, limit: float, eager: bool,
                  timers: Timers) -> None:
    """Check variant `v` on input set 0 against `ref` on `rows` (rel err < `limit`), then add its timers:
    the eager call (unless a runner is timed by graph replay only, `eager` False) and, for a runner, its
    checked graph replays. Results and failures are written into `entry`: a failing variant must not
    take the others down."""
    T = sets[0].hidden.shape[0]
    try:
        out_buf.fill_(float("nan"))
        if runner is not None:
            # the choices at this token count (the plan is made at the largest one)
            entry["plan"] = runner.plan.choices(T)
            entry["kernel_sequence"] = runner.kernel_sequence(T, "logits")
        err = rel_err(fn(sets[0].hidden, sets[0].logits), rows, ref)
        entry["rel_err"] = err
        if not err < limit:
            entry["error"] = f"wrong result: rel err {err:.3g} >= {limit}"
            return
        if eager or runner is None:
            entry["host_sync"] = syncs_host(lambda: fn(sets[0].hidden, sets[0].logits))
            timers[(v, "us")] = lambda i: fn(sets[i % len(sets)].hidden, sets[i % len(sets)].logits)
        if runner is not None:
            checked, replay = _graph_replay(runner, sets, out_buf, rows, ref, limit)
            entry.update(checked)
            if replay is not None:
                timers[(v, "graph_us")] = replay
    except Exception as e:
        entry["error"] = f"{type(e).__name__}: {e}"


def _flush_before_replays(key: tuple[str, str]) -> None:
    """L2 emptied ahead of a graph replay (timing.py's rule), so no replay finds what the call before it left."""
    if key[1] == "graph_us":
        flush_l2()


def time_variants(rec: dict[str, Any], timers: Timers, iters: int, warmup: int) -> dict[tuple[str, str], float]:
    """Time every timer of a point (timing's interleaved rounds; host-syncing variants as a group of their
    own), write each variant's medians (us) into rec["variants"], and return all medians (ms, the ceiling
    calls' included) by timer key."""
    medians_ms: dict[tuple[str, str], float] = {}
    seed = zlib.crc32(f"{rec.get('quant')}:{rec['shape']}:{rec['tokens']}".encode())  # the point's own order
    try:
        syncing = {v for v, e in rec["variants"].items() if e.get("host_sync")}
        for group in ({k: f for k, f in timers.items() if k[0] not in syncing},
                      {k: f for k, f in timers.items() if k[0] in syncing}):
            medians_ms.update(interleaved_median_ms(group, iters, warmup, before=_flush_before_replays, seed=seed))
    except Exception as e:
        for v, _ in timers:
            if v in rec["variants"]:
                rec["variants"][v]["error"] = f"timing failed: {type(e).__name__}: {e}"
    for (v, field), ms in medians_ms.items():
        if v in rec["variants"]:
            rec["variants"][v][field] = 1e3 * ms
    return medians_ms


def rotating_replay(runner: Any, sets: Sequence[InputSet], out: torch.Tensor) -> Callable[[int], object]:
    """The runner captured into `out` once per input set (router logits in); call i replays set i % len(sets)."""
    graphs = []
    for s in sets:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            runner(s.hidden, router_logits=s.logits, out=out)
        graphs.append(g)
    return lambda i: graphs[i % len(graphs)].replay()


def _graph_replay(runner: Any, sets: list[InputSet], out_buf: torch.Tensor, rows: torch.Tensor,
                  ref: torch.Tensor, limit: float) -> tuple[dict[str, Any], Callable[[int], object] | None]:
    """Capture the runner once per input set and check set 0's replay (rel err < `limit`); returns the
    check's record and a rotating replay to time (None when the replay is wrong)."""
    out = out_buf[:sets[0].hidden.shape[0]]
    replay = rotating_replay(runner, sets, out)
    out_buf.fill_(float("nan"))
    replay(0)
    err = rel_err(out, rows, ref)
    if not err < limit:
        return {"graph_error": f"wrong result from graph replay: rel err {err:.3g} >= {limit}"}, None
    return {"graph_rel_err": err}, replay


def point_floor(spec: MoESpec, tokens: int, touched: float, medians_ms: dict[tuple[str, str], float],
                burst: dict[str, float]) -> dict[str, Any]:
    """A point's floor fields from the ceiling calls' median times among its variants (`medians_ms`,
    keyed as the timers; `ceilings_source` "side_by_side"), or from the burst ceilings when those
    calls have no time ("burst"); plus `burst_floor_us`, the floor the run's burst ceilings give."""
    side_by_side = ceiling_rates(medians_ms, fp8=spec.quant in (Quant.FP8, Quant.FP8_BLOCK))
    ceilings, source = (side_by_side, "side_by_side") if side_by_side is not None else (burst, "burst")
    return {**floor_us(spec, tokens, touched, ceilings), "ceilings": ceilings, "ceilings_source": source,
            "burst_floor_us": floor_us(spec, tokens, touched, burst)["floor_us"]}


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b where both were measured (None where either is missing: a variant that failed or was not run)."""
    return a / b if a and b else None


def gather_points(results: dict[str, Any], shapes: Iterable[Callable[[], list[dict[str, Any]]]],
                  out_json: Path | None) -> None:
    """results["points"] extended by each shape's points in turn, the shape's weights and runners freed after it;
    with a path, the JSON written after every shape, so that a time-out keeps what was measured."""
    for points in shapes:
        results["points"] += points()
        torch.cuda.empty_cache()
        if out_json is not None:
            Path(out_json).write_text(json.dumps(results, indent=1, default=str))


def ratios(rec: dict[str, Any]) -> None:
    """ours/floor (eager and graph-replayed; graph also against the burst floor), and each peer's time
    over ours eager (> 1: we are faster)."""
    ours = rec["variants"].get("ours", {})
    rec["ours_over_floor"] = ratio(ours.get("us"), rec["floor_us"])
    rec["graph_over_floor"] = ratio(ours.get("graph_us"), rec["floor_us"])
    rec["graph_over_burst_floor"] = ratio(ours.get("graph_us"), rec["burst_floor_us"])
    rec["speedup_vs"] = {v: ratio(e.get("us"), ours.get("us")) for v, e in rec["variants"].items()
                         if ours.get("us") and v != "ours" and e.get("us")}


def point_line(rec: dict[str, Any]) -> str:
    """One point's progress line: its floor and every variant's eager and graph-replayed time (ERR where
    it failed its check)."""
    cells = [f"{rec['shape']:>16} T={rec['tokens']:<5} floor={rec['floor_us']:8.1f}"]
    for v, e in rec["variants"].items():
        if e.get("us"):
            cells.append(f"{v}={e['us']:.1f}")
        elif e.get("error") or e.get("graph_error"):
            cells.append(f"{v}=ERR")
        if e.get("graph_us"):
            cells.append(f"{v}@graph={e['graph_us']:.1f}")
    return "  ".join(cells)


def table(results: dict[str, Any]) -> str:
    """The short table `device_run.sh` prints last (us, medians): ours eager and graph-replayed,
    peers (eager), floor, and each forced-off variant graph-replayed. "x fl": over the point's floor
    (side-by-side ceilings); "x bfl": graph over the floor of the run's burst ceilings."""
    lines = [f"{'shape':<17}{'T':>5}{'floor':>9}{'ours':>9}{'x fl':>6}{'graph':>9}{'x fl':>6}{'x bfl':>6}"
             f"{'naive':>10}{'grouped':>9}{'hf':>10}  forced-off, graph-replayed (us)"]
    for r in results["points"]:
        v = r["variants"]
        us = lambda k, f="us": f"{v[k][f]:.1f}" if v.get(k, {}).get(f) else "-"  # noqa: E731
        ratio = lambda k: f"{r[k]:.2f}" if r.get(k) else "-"  # noqa: E731
        forced = " ".join(f"{k.split(':', 1)[1]}={us(k, 'graph_us')}" for k in v if k.startswith("ours:"))
        lines.append(f"{r['shape']:<17}{r['tokens']:>5}{r['floor_us']:>9.1f}{us('ours'):>9}"
                     f"{ratio('ours_over_floor'):>6}{us('ours', 'graph_us'):>9}{ratio('graph_over_floor'):>6}"
                     f"{ratio('graph_over_burst_floor'):>6}{us('naive'):>10}{us('grouped_mm'):>9}{us('hf_eager'):>10}  {forced}")
    return "\n".join(lines)


def time_panel(ax: Any, pts: Sequence[dict[str, Any]], series: Sequence[tuple[str, str, str]], floor_label: str,
               title: str, fontsize: int) -> None:
    """One log-log panel of bench points over tokens: the floor dashed, then each (variant, field, label) series
    where it was timed (the bf16 and the FP8 bench draw theirs with it)."""
    xs = [p["tokens"] for p in pts]
    if pts:
        ax.plot(xs, [p["floor_us"] for p in pts], "k--", label=floor_label)
    for v, field, label in series:
        ys = [p["variants"].get(v, {}).get(field) for p in pts]
        if any(ys):
            ax.plot([x for x, y in zip(xs, ys) if y], [y for y in ys if y], "o-", label=label)
    ax.set(xscale="log", yscale="log", title=title, xlabel="tokens", ylabel="us (median)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=fontsize)


def plot(results: dict[str, Any], png: Path) -> None:
    """One panel per shape: time vs tokens for ours, the peers and the floor (log-log)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in results["points"]))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 4), squeeze=False)
    series = [("ours", "us", "ours (eager)"), ("ours", "graph_us", "ours (graph replay)"), *((p, "us", p) for p in PEERS)]
    for ax, shape in zip(axes[0], shapes):
        time_panel(ax, [r for r in results["points"] if r["shape"] == shape], series, "floor", shape, fontsize=8)
    fig.suptitle(f"bf16 SwiGLU MoE layer on {results['device']}")
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def run_bench(shapes: Sequence[str] = tuple(SHAPES), tokens_list: Sequence[int] = TOKENS,
              out_json: Path | None = None, png: Path | None = None, iters: int = 20, warmup: int = 3,
              input_sets: int = 4, variants: Sequence[str] = (*RUNNER_VARIANTS, *PEERS),
              log: Callable[[str], None] = print, eager: bool = True) -> dict[str, Any]:
    """Run the whole comparison; write JSON/PNG when paths are given; return the results dict."""
    require_bench_gpu()
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise MoeBuildError("shapes", f"unknown {unknown}", sorted(SHAPES))
    torch.manual_seed(0)
    ceiling_calls = CeilingCalls()
    ceilings = measure_ceilings(ceiling_calls)
    log(ceilings_text(ceilings))
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "ceilings": ceilings,
        "method": {"iters": iters, "warmup": warmup, "input_sets": input_sets, "stat": "median",
                   "timer": "cuda events per call",
                   "order": "variants (eager and graph) timed in turn, one call each per round, order shuffled "
                            "each round; variants that sync with the host (host_sync) timed after, "
                            "as a group of their own",
                   "ceilings": "a 1 GiB copy, a read-only sum of 1 GiB and an 8192^3 bf16 matmul, timed at "
                               "every point among its non-syncing variants (the point's floor uses the higher "
                               "of the copy and read rates); also once at the start, cool (burst_floor_us, "
                               "top-level ceilings)",
                   "check": f"fp64 reference on <= {CHECK_ROWS + 2} sampled rows, "
                                                             f"rel-norm err < {REL_ERR_LIMIT}",
                   "router_linear": "excluded for every variant (all take fp32 router logits)"},
        "points": [],
    }
    gather_points(results, (functools.partial(bench_shape, name, tokens_list, ceilings, ceiling_calls, iters, warmup,
                                              input_sets, variants, log, eager) for name in shapes), out_json)
    if png is not None:
        plot(results, Path(png))
    return results
