"""`moe-build bench`: our fused runner against its peers and the hardware floor, in one process.

Why one process and these rules: peers, variants and ceilings measured side by side on the same
card in the same state are comparable; medians of CUDA-event timings after warm-up, the variants
timed in turn (one call each per round, in a shuffled order) so clock drift over the run favours
none, those that sync with the host timed apart (their idle gaps speed up whatever follows),
rotating among several input sets so no variant is flattered by a warm cache; every timed variant
is first checked against the fp64 reference on sampled rows of the very input it is timed on.

floor = max(bytes of the touched experts' weights / measured copy bandwidth,
            FLOPs / measured bf16 matmul rate), touched experts counted from the actual routing.
The two ceilings are timed at every point among the variants, in the same shuffled rounds, so that
both run in the power state the variants run in: at 4096 tokens a layer holds the GPU at its power
limit and the SM clock drops (H200, bench/power_state_probe.py: Qwen3-30B-A3B's layer at 1245-1303 MHz,
the 8192^3 matmul at 1453-1473 MHz when hot, both at 1980 MHz after an idle gap), so ceilings measured
once at the start of the run, cool, against variants timed hot would put the difference in power
state into the ratio. Those start-of-run ("burst") ceilings are still measured and each point also
reports its ratio to the floor they give.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .bench_peers import grouped_mm_peer, hf_eager_peer, naive_peer, softmax_topk
from .errors import MoeBuildError
from .reference import moe_reference
from .spec import MoESpec, Routing, RoutingMethod
from .weights import MoEWeights

# (name, H, I, E, top_k, transformers family for the hf_eager peer)
SHAPES: dict[str, tuple[int, int, int, int, str]] = {
    "mixtral-8x7b": (4096, 14336, 8, 2, "mixtral"),
    "qwen3-30b-a3b": (2048, 768, 128, 8, "qwen3_moe"),
    "deepseek-v2-lite": (2048, 1408, 64, 6, "qwen3_moe"),
    "gpt-oss-20b": (2880, 2880, 32, 4, "qwen3_moe"),
}
TOKENS = (1, 16, 256, 4096)
# Our runner's variants: the default plan, then each fusion forced off one at a time, and the fused
# finalize forced on (the planner turns it on at every size for intermediate sizes >= 2048, else past 8
# rows per expert, tokens x top-k > 8 x experts; this shows what it costs below that).
RUNNER_VARIANTS: dict[str, dict[str, str]] = {
    "ours": {},
    "ours:prologue=three_step": {"routing_prologue": "three_step"},
    "ours:finalize=separate": {"finalize": "separate"},
    "ours:finalize=fused": {"finalize": "fused"},
    "ours:fc1=separate": {"fc1_activation": "separate"},
    "ours:ampere+fused_gated": {"gemm_kernel": "ampere", "fc1_activation": "fused_gated"},
    "ours:ampere+fc1=separate": {"gemm_kernel": "ampere", "fc1_activation": "separate"},
}
PEERS = ("naive", "grouped_mm", "hf_eager")
# Every runner variant is also replayed from CUDA graphs (one per input set), recorded as
# "graph_us": what a deployment that captures its step sees, without the per-kernel Python/ctypes
# launch cost, so fused and unfused variants compare on the GPU work alone.
REL_ERR_LIMIT = 1e-2
CHECK_ROWS = 64

Fn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def bench_spec(name: str) -> MoESpec:
    H, I, E, K, family = SHAPES[name]
    return MoESpec(H, I, E, K, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True), name=name,
                   family=family)


def _median_ms(fn: Callable[[int], object], iters: int, warmup: int) -> float:
    """Median CUDA-event time of fn(i) over `iters` calls after `warmup` calls (i rotates the inputs)."""
    for i in range(warmup):
        fn(i)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(i)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def _interleaved_median_ms(fns: dict[Any, Callable[[int], object]], iters: int, warmup: int,
                           before: Callable[[], object] | None = None, seed: int = 0) -> dict[Any, float]:
    """Median CUDA-event time of each fn(i) over `iters` rounds; every round calls each fn once, in
    an order shuffled anew each round (a fixed seed, so a run is repeatable).

    Why shuffled, one call per round: under its power limit the GPU runs faster for a while after any
    idle gap, so whichever fn sits right after a gap is flattered. Timing the fns in fixed blocks put up
    to 7% between two runs of one plan at 4096 tokens (whichever ran first won); blocks rotated by one
    place per round still gave the same fn the place after the host-syncing peers' gaps, and identical
    Mixtral-4096 plans spread by 14% (4.05 vs 4.61 ms; 4.21-4.40 shuffled; 4.66-4.73 in either order
    with no syncing fn among them). Shuffled per call, no fn owns a place; callers also keep fns that
    sync with the host in a group of their own (`bench_shape`).
    `before` (e.g. an L2 flush) is enqueued ahead of every timed call, outside its events."""
    names = list(fns)
    for name in names:
        for i in range(warmup):
            fns[name](i)
    order = random.Random(seed)
    marks: dict[Any, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {name: [] for name in names}
    for r in range(iters):
        for name in order.sample(names, len(names)):
            if before is not None:
                before()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[name](r)
            end.record()
            marks[name].append((start, end))
    torch.cuda.synchronize()
    return {name: statistics.median(s.elapsed_time(e) for s, e in marks[name]) for name in names}


class CeilingCalls:
    """The two ceiling measurements as calls to time: a 1 GiB device copy and an 8192^3 bf16 matmul
    (into preallocated outputs, so no call allocates), with the work each does."""

    COPY_BYTES = 1 << 30
    MATMUL_N = 8192

    def __init__(self) -> None:
        self.src = torch.empty(self.COPY_BYTES, dtype=torch.uint8, device="cuda").random_()
        self.dst = torch.empty_like(self.src)
        m = self.MATMUL_N
        self.x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        self.y = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        self.z = torch.empty(m, m, device="cuda", dtype=torch.bfloat16)

    def copy(self, i: int) -> object:
        return self.dst.copy_(self.src)

    def matmul(self, i: int) -> object:
        return torch.matmul(self.x, self.y, out=self.z)

    @classmethod
    def rates(cls, copy_ms: float, matmul_ms: float) -> dict[str, float]:
        """Ceilings from the two calls' times: copy bytes read + written per second, matmul FLOP/s."""
        return {"copy_bytes_per_s": 2 * cls.COPY_BYTES / (copy_ms * 1e-3),
                "bf16_flops_per_s": 2 * cls.MATMUL_N ** 3 / (matmul_ms * 1e-3)}


# Each ceiling call (a CeilingCalls method) and its timer key among a point's variants.
CEILING_TIMERS = {"copy": ("ceiling", "copy_us"), "matmul": ("ceiling", "matmul_us")}


def measure_ceilings(calls: CeilingCalls, iters: int = 10) -> dict[str, float]:
    """The ceilings in a burst, here and now (3 warm-up calls, then `iters` timed ones)."""
    return calls.rates(_median_ms(calls.copy, iters, 3), _median_ms(calls.matmul, iters, 3))


def floor_us(spec: MoESpec, tokens: int, touched_experts: float, ceilings: dict[str, float]) -> dict[str, float]:
    """The lower bound from the two ceilings (weights of touched experts + activations in/out)."""
    H, I, N1, K = spec.hidden_size, spec.intermediate_size, spec.fc1_out_features, spec.top_k
    item = spec.dtype.itemsize
    nbytes = touched_experts * (N1 * H + H * I) * item + 2 * tokens * H * item
    flops = 2.0 * tokens * K * (N1 * H + H * I)
    t_bytes = nbytes / ceilings["copy_bytes_per_s"] * 1e6
    t_flops = flops / ceilings["bf16_flops_per_s"] * 1e6
    return {"floor_us": max(t_bytes, t_flops), "bytes": nbytes, "flops": flops, "bytes_us": t_bytes,
            "flops_us": t_flops, "bound": "bytes" if t_bytes >= t_flops else "flops"}


def _device_weights(spec: MoESpec, seed: int) -> MoEWeights:
    """Random fan-in-scaled weights generated on the GPU (CPU generation of Mixtral takes too long)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    E, H, I, N1 = spec.num_experts, spec.hidden_size, spec.intermediate_size, spec.fc1_out_features

    def rnd(*shape: int, fan_in: int) -> torch.Tensor:
        t = torch.empty(*shape, device="cuda", dtype=torch.bfloat16)
        for i in range(shape[0]):  # per expert: keeps the fp32 temporary small
            t[i] = torch.randn(*shape[1:], device="cuda", generator=g) / math.sqrt(fan_in)
        return t

    return MoEWeights(router_weight=rnd(E, H, fan_in=H), w1=rnd(E, N1, H, fan_in=H), w2=rnd(E, H, I, fan_in=I))


@dataclass
class InputSet:
    hidden: torch.Tensor    # [T, H] bf16
    logits: torch.Tensor    # [T, E] fp32
    touched: int            # distinct experts this set routes to


def _inputs(spec: MoESpec, tokens: int, count: int, seed: int) -> list[InputSet]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    sets = []
    for _ in range(count):
        h = torch.randn(tokens, spec.hidden_size, device="cuda", generator=g).to(torch.bfloat16)
        lg = torch.randn(tokens, spec.num_experts, device="cuda", generator=g)
        _, ids = softmax_topk(spec, lg)
        sets.append(InputSet(h, lg, int(ids.unique().numel())))
    return sets


def _reference_rows(spec: MoESpec, w64: MoEWeights, inp: InputSet) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 reference on sampled rows (first, last, random): tokens are independent, so rows suffice."""
    T = inp.hidden.shape[0]
    g = torch.Generator().manual_seed(T)
    rows = torch.unique(torch.cat([torch.tensor([0, T - 1]), torch.randint(0, T, (CHECK_ROWS,), generator=g)]))
    rows = rows.to("cuda")
    return rows, moe_reference(spec, w64, inp.hidden[rows], router_logits=inp.logits[rows])


def _check(fn: Fn, inp: InputSet, rows: torch.Tensor, ref: torch.Tensor) -> float:
    """rel-norm error on the sampled rows; inf if any output element is not finite (unwritten poison)."""
    out = fn(inp.hidden, inp.logits)
    torch.cuda.synchronize()
    if not torch.isfinite(out).all():
        return math.inf
    got = out[rows].double().cpu()
    return float((got - ref).norm() / ref.norm())


def _sync_debug_mode(mode: str) -> None:
    with warnings.catch_warnings():  # torch warns that the mode is a prototype on every switch
        warnings.filterwarnings("ignore", message="Synchronization debug mode")
        torch.cuda.set_sync_debug_mode(mode)


def _syncs_host(fn: Fn, inp: InputSet) -> bool:
    """Whether fn waits on the GPU from the host (nonzero, .tolist(), bincount's size): such a call
    idles the GPU, and that gap speeds up whatever runs next, so these are timed apart."""
    torch.cuda.synchronize()
    _sync_debug_mode("error")
    try:
        fn(inp.hidden, inp.logits)
        return False
    except RuntimeError as e:
        if "synchronizing" not in str(e):
            raise
        return True
    finally:
        _sync_debug_mode("default")
        torch.cuda.synchronize()


def _runner_fn(runner: Any, out: torch.Tensor) -> Fn:
    def run(hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return runner(hidden, router_logits=logits, out=out[: hidden.shape[0]])
    return run


def bench_shape(name: str, tokens_list: Sequence[int], ceilings: dict[str, float], ceiling_calls: CeilingCalls,
                iters: int, warmup: int, input_sets: int, variants: Sequence[str],
                log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every variant at every token count of one shape; returns one record per (shape, tokens).
    `ceilings` are the run's burst ceilings; each point's floor comes from `ceiling_calls` timed
    among its variants (point_floor)."""
    from .runner import MoERunner

    spec = bench_spec(name)
    t0 = time.time()
    w = _device_weights(spec, seed=list(SHAPES).index(name))
    w64 = w.to("cpu", torch.float64)
    max_tokens = max(tokens_list)
    fns: dict[str, Fn] = {}
    runners: dict[str, Any] = {}
    meta: dict[str, dict[str, Any]] = {}
    out_buf = torch.empty(max_tokens, spec.hidden_size, device="cuda", dtype=torch.bfloat16)
    for v in variants:
        try:
            if v in RUNNER_VARIANTS:
                r = runners[v] = MoERunner(spec, w, max_tokens=max_tokens, force=RUNNER_VARIANTS[v] or None)
                fns[v] = _runner_fn(r, out_buf)
            elif v == "naive":
                fns[v] = naive_peer(spec, w)
            elif v == "grouped_mm":
                fns[v] = grouped_mm_peer(spec, w)
            elif v == "hf_eager":
                fns[v], block = hf_eager_peer(spec, w, SHAPES[name][4])
                meta[v] = {"block": block}
        except (MoeBuildError, ImportError, RuntimeError, ValueError) as e:
            meta[v] = {"error": f"{type(e).__name__}: {e}"}
            log(f"  {name}: {v} unavailable: {e}")
    log(f"{name}: setup {time.time() - t0:.1f}s")
    records = []
    for T in tokens_list:
        sets = _inputs(spec, T, input_sets, seed=T)
        touched = statistics.mean(s.touched for s in sets)
        rows, ref = _reference_rows(spec, w64, sets[0])
        rec: dict[str, Any] = {"shape": name, "H": spec.hidden_size, "I": spec.intermediate_size,
                               "E": spec.num_experts, "top_k": spec.top_k, "tokens": T,
                               "touched_experts": touched, "variants": {}}
        timers: dict[tuple[str, str], Callable[[int], object]] = {
            key: getattr(ceiling_calls, call) for call, key in CEILING_TIMERS.items()}
        for v in variants:
            entry: dict[str, Any] = dict(meta.get(v, {}))
            rec["variants"][v] = entry
            if v not in fns:
                continue
            fn = fns[v]
            try:
                out_buf.fill_(float("nan"))
                if v in runners:
                    # the choices at this token count (the plan is made at the largest one)
                    entry["plan"] = runners[v].plan.choices(T)
                    entry["kernel_sequence"] = runners[v].kernel_sequence(T, "logits")
                err = _check(fn, sets[0], rows, ref)
                entry["rel_err"] = err
                if not err < REL_ERR_LIMIT:
                    entry["error"] = f"wrong result: rel err {err:.3g} >= {REL_ERR_LIMIT}"
                    continue
                entry["host_sync"] = _syncs_host(fn, sets[0])
                timers[(v, "us")] = lambda i, fn=fn: fn(sets[i % len(sets)].hidden, sets[i % len(sets)].logits)
                if v in runners:
                    checked, replay = _graph_replay(runners[v], sets, out_buf, rows, ref)
                    entry.update(checked)
                    if replay is not None:
                        timers[(v, "graph_us")] = replay
            except Exception as e:  # a failing variant must not take the others down
                entry["error"] = f"{type(e).__name__}: {e}"
        medians_ms: dict[tuple[str, str], float] = {}
        try:
            syncing = {v for v, e in rec["variants"].items() if e.get("host_sync")}
            for group in ({k: f for k, f in timers.items() if k[0] not in syncing},
                          {k: f for k, f in timers.items() if k[0] in syncing}):
                medians_ms.update(_interleaved_median_ms(group, iters, warmup))
        except Exception as e:
            for v, _ in timers:
                if v in rec["variants"]:
                    rec["variants"][v]["error"] = f"timing failed: {type(e).__name__}: {e}"
        for (v, field), ms in medians_ms.items():
            if v in rec["variants"]:
                rec["variants"][v][field] = 1e3 * ms
        rec.update(point_floor(spec, T, touched, medians_ms, ceilings))
        _ratios(rec)
        records.append(rec)
        log(_row(rec))
    del fns, runners, w, w64
    torch.cuda.empty_cache()
    return records


def _graph_replay(runner: Any, sets: list[InputSet], out_buf: torch.Tensor, rows: torch.Tensor,
                  ref: torch.Tensor) -> tuple[dict[str, Any], Callable[[int], object] | None]:
    """Capture the runner once per input set and check set 0's replay; returns the check's record
    and a rotating replay to time (None when the replay is wrong)."""
    T = sets[0].hidden.shape[0]
    out = out_buf[:T]
    graphs = []
    for s in sets:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            runner(s.hidden, router_logits=s.logits, out=out)
        graphs.append(g)
    out_buf.fill_(float("nan"))
    graphs[0].replay()
    err = _check(lambda h, lg: out, sets[0], rows, ref)
    if not err < REL_ERR_LIMIT:
        return {"graph_error": f"wrong result from graph replay: rel err {err:.3g} >= {REL_ERR_LIMIT}"}, None
    return {"graph_rel_err": err}, lambda i: graphs[i % len(graphs)].replay()


def point_floor(spec: MoESpec, tokens: int, touched: float, medians_ms: dict[tuple[str, str], float],
                burst: dict[str, float]) -> dict[str, Any]:
    """A point's floor fields from the ceiling calls' median times among its variants (`medians_ms`,
    keyed as the timers; `ceilings_source` "side_by_side"), or from the burst ceilings when those
    calls have no time ("burst"); plus `burst_floor_us`, the floor the run's burst ceilings give."""
    copy_key, matmul_key = CEILING_TIMERS["copy"], CEILING_TIMERS["matmul"]
    if copy_key in medians_ms and matmul_key in medians_ms:
        ceilings = CeilingCalls.rates(medians_ms[copy_key], medians_ms[matmul_key])
        source = "side_by_side"
    else:
        ceilings, source = burst, "burst"
    return {**floor_us(spec, tokens, touched, ceilings), "ceilings": ceilings, "ceilings_source": source,
            "burst_floor_us": floor_us(spec, tokens, touched, burst)["floor_us"]}


def _ratios(rec: dict[str, Any]) -> None:
    """ours/floor (eager and graph-replayed; graph also against the burst floor), and each peer's time
    over ours eager (> 1: we are faster)."""
    ours = rec["variants"].get("ours", {})
    rec["ours_over_floor"] = ours["us"] / rec["floor_us"] if ours.get("us") else None
    rec["graph_over_floor"] = ours["graph_us"] / rec["floor_us"] if ours.get("graph_us") else None
    rec["graph_over_burst_floor"] = ours["graph_us"] / rec["burst_floor_us"] if ours.get("graph_us") else None
    rec["speedup_vs"] = {v: e["us"] / ours["us"] for v, e in rec["variants"].items()
                         if ours.get("us") and v != "ours" and e.get("us")}


def _row(rec: dict[str, Any]) -> str:
    cells = [f"{rec['shape']:>16} T={rec['tokens']:<5} floor={rec['floor_us']:8.1f}"]
    for v, e in rec["variants"].items():
        cells.append(f"{v}={e['us']:.1f}" if e.get("us") else f"{v}=ERR")
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


def plot(results: dict[str, Any], png: Path) -> None:
    """One panel per shape: time vs tokens for ours, the peers and the floor (log-log)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in results["points"]))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        pts = [r for r in results["points"] if r["shape"] == shape]
        xs = [r["tokens"] for r in pts]
        ax.plot(xs, [r["floor_us"] for r in pts], "k--", label="floor")
        lines = [("ours", "us", "ours (eager)"), ("ours", "graph_us", "ours (graph replay)")]
        for v, field, label in lines + [(p, "us", p) for p in PEERS]:
            ys = [r["variants"].get(v, {}).get(field) for r in pts]
            if any(ys):
                ax.plot([x for x, y in zip(xs, ys) if y], [y for y in ys if y], "o-", label=label)
        ax.set(xscale="log", yscale="log", title=shape, xlabel="tokens", ylabel="us (median)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"bf16 SwiGLU MoE layer on {results['device']}")
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def run_bench(shapes: Sequence[str] = tuple(SHAPES), tokens_list: Sequence[int] = TOKENS,
              out_json: Path | None = None, png: Path | None = None, iters: int = 20, warmup: int = 3,
              input_sets: int = 4, variants: Sequence[str] = (*RUNNER_VARIANTS, *PEERS),
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the whole comparison; write JSON/PNG when paths are given; return the results dict."""
    if not torch.cuda.is_available():
        raise MoeBuildError("device", "moe-build bench needs a CUDA GPU", "a machine with an NVIDIA GPU")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise MoeBuildError("shapes", f"unknown {unknown}", sorted(SHAPES))
    torch.manual_seed(0)
    ceiling_calls = CeilingCalls()
    ceilings = measure_ceilings(ceiling_calls)
    log(f"burst ceilings: copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
        f"bf16 matmul {ceilings['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s")
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "ceilings": ceilings,
        "method": {"iters": iters, "warmup": warmup, "input_sets": input_sets, "stat": "median",
                   "timer": "cuda events per call",
                   "order": "variants (eager and graph) timed in turn, one call each per round, order shuffled "
                            "each round; variants that sync with the host (host_sync) timed after, "
                            "as a group of their own",
                   "ceilings": "a 1 GiB copy and an 8192^3 bf16 matmul, timed at every point among its "
                               "non-syncing variants (the point's floor); also once at the start, cool "
                               "(burst_floor_us, top-level ceilings)",
                   "check": f"fp64 reference on <= {CHECK_ROWS + 2} sampled rows, "
                                                             f"rel-norm err < {REL_ERR_LIMIT}",
                   "router_linear": "excluded for every variant (all take fp32 router logits)"},
        "points": [],
    }
    for name in shapes:
        results["points"] += bench_shape(name, tokens_list, ceilings, ceiling_calls, iters, warmup, input_sets,
                                         variants, log)
        if out_json is not None:  # partial results survive a time-out
            Path(out_json).write_text(json.dumps(results, indent=1, default=str))
    if png is not None:
        plot(results, Path(png))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="moe-build bench", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--input-sets", type=int, default=4)
    p.add_argument("--variants", default=",".join((*RUNNER_VARIANTS, *PEERS)))
    p.add_argument("--json", type=Path, default=Path("bench.json"))
    p.add_argument("--png", type=Path, default=Path("bench.png"))
    a = p.parse_args(argv)
    res = run_bench(a.shapes.split(","), [int(t) for t in a.tokens.split(",")], a.json, a.png, a.iters,
                    a.warmup, a.input_sets, a.variants.split(","))
    print(table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
