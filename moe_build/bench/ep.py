"""`moe-build bench-ep`: expert parallelism on the GPUs of one host, one process per GPU (torchrun).

Timed per rank with CUDA events in rounds of calls issued back to back (each round started together after a
barrier), each point's median per call over its rounds, the slowest rank's reported (the all-to-alls make every
rank wait for the slowest). Paths that synchronize with the host (the blocking dispatches: exact sizes come from
the counts) are called eagerly; the rest are also replayed from CUDA graphs, as a serving engine runs decode.
Each point is timed beside its ceiling, in the same run:
- `link`: a large equal-split all_to_all_single (256 MiB per rank): the fabric's all-to-all bandwidth, the
  physical ceiling a dispatch can reach;
- `dispatch+combine`, ours (`nvlink`: rows written into the peers' memory, blocking and non-blocking; `nccl`: the
  plan's form for a call that gives every rank's token count, as the worst case's equal splits assume (within the
  plan's band the all-gather form, eager and replayed), and `nccl_exact`, counts first, exact sizes, for a call
  that does not; nvlink and nccl_exact send a token's row once per rank) against plain all_to_all_single with
  worst-case buffers (every rank sends each of its tokens to every rank, T rows per destination, no counts),
  there and back: time and algorithm bandwidth (rows another rank needed x hidden x 2 bytes, there and back,
  over the time);
- the whole layer (`ExpertParallelMoE`, each backend, with dual-batch overlap off and on) against the
  single-GPU runner holding every expert, same tokens per GPU (the single GPU runs one rank's tokens);
- memory: the peak bytes a dispatch + combine allocates at a large token count, against the worst-case
  preallocation (ep_size x tokens rows received, the same returned).
Routing is uniform random top-k (every rank draws its own), so rows per destination follow the real spread.
"""
from __future__ import annotations

import functools
import json
import os
import statistics
import sys
from dataclasses import replace
from typing import Callable

import torch
import torch.distributed as dist

from .. import kernels
from ..planner.gates import StageDecision
from .ep_targets import ep_targets, summary
from ..spec import MoESpec
from ..weights import MoEWeights

DISPATCH_TOKENS = (1, 16, 128, 512, 1024, 4096)
DISPATCH_HIDDEN = (2048, 7168)
LAYER_TOKENS = (1, 16, 256, 4096)
# (name, hidden, intermediate, experts, top_k): Qwen3-30B-A3B and a DeepSeek-V3-shaped layer, bf16
LAYERS = (("qwen3-30b-a3b", 2048, 768, 128, 8), ("deepseek-v3-shaped", 7168, 2048, 256, 8))
MEMORY_TOKENS = 131072
LAYER_HIDDEN = {name: hidden for name, hidden, *_ in LAYERS}


CALLS = 10  # calls per timed round, back to back


def _rounds(issue: Callable[[], None], iters: int) -> float:
    """Median ms per call over `iters` rounds of CALLS calls issued back to back by `issue` (each round started
    together after a barrier, the GPU idle), the slowest rank's: host launch costs count only where they keep the
    GPU waiting, as in a serving loop."""
    times = []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(CALLS):
            issue()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / CALLS)
    t = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _time(fn: Callable[[], object], iters: int, warmup: int = 3) -> float:
    """Eager calls of fn (host-synchronizing paths: the blocking dispatches): ms per call, see _rounds."""
    for _ in range(warmup):
        fn()
    return _rounds(fn, iters)


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """fn warmed up on a side stream, then captured in a CUDA graph, every rank together (the exchanges inside
    pair with the other ranks' replays)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    return graph


def time_graph(fn: Callable[[], object], iters: int) -> float:
    """fn captured once in a CUDA graph (every rank together) and replayed: ms per replay, see _rounds. The
    non-blocking nvlink mode and fixed-size all-to-alls capture; this is how a serving engine runs decode."""
    graph = capture(fn)
    graph.replay()
    ms = _rounds(graph.replay, iters)
    del graph
    return ms


def exchange(d: object, hidden: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
             tokens_per_rank: list[int] | None = None) -> Callable[[], None]:
    """One dispatch + combine of `hidden` through dispatcher `d` (either backend), no expert compute between:
    the received rows go back as they came; `tokens_per_rank` given to the nccl dispatch where not None."""
    counts = () if tokens_per_rank is None else (tokens_per_rank,)

    def call() -> None:
        got = d.dispatch(hidden, ids, w, *counts)  # type: ignore[attr-defined]
        d.combine(got.hidden, got, out)  # type: ignore[attr-defined]
    return call


def nccl_exchange(spec: MoESpec, tokens: int) -> StageDecision:
    """The plan's nccl_exchange decision for `spec`'s ranks at up to `tokens` tokens per rank (as
    ExpertParallelMoE plans it: every rank's tokens together)."""
    from ..planner import make_plan
    from ..runner.runner import device_target
    total = tokens * spec.ep_size
    plan = make_plan(spec, device_target(torch.device("cuda", torch.cuda.current_device()), total, None),
                     tokens=total, force={"dispatch": "nccl"})
    return plan.stage("nccl_exchange")


def random_routing(tokens: int, experts: int, top_k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random top-k ids (distinct per token) and weights on this GPU, from `seed` (each rank its own)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.rand(tokens, experts, device="cuda", generator=g)
    ids = scores.topk(top_k, dim=1).indices.int()
    return ids, torch.rand(tokens, top_k, device="cuda", generator=g)


def link_bandwidth(iters: int) -> dict:
    ep = dist.get_world_size()
    n = (256 << 20) // 2 // ep * ep
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    ms = _time(lambda: dist.all_to_all_single(y, x), iters)
    moved = 2 * n * (ep - 1) / ep  # bytes leaving (and reaching) each rank
    return {"bytes_per_rank": 2 * n, "ms": ms, "gb_s": moved / ms / 1e6}


def dispatch_points(spec: MoESpec, token_counts: tuple[int, ...], iters: int) -> list[dict]:
    """Ours (dispatch + combine, no expert compute between) against worst-case all_to_all_single, at each token
    count: the blocking backends called eagerly (each made once, for the largest count), the non-blocking
    `nvlink` mode (gathering ep_size x tokens rows: never overflows) and the all-to-alls replayed from CUDA
    graphs."""
    from ..runner.dispatch import NcclDispatch, NvlinkDispatch
    rank, ep, H = dist.get_rank(), dist.get_world_size(), spec.hidden_size
    planned = NcclDispatch(spec, kernels, exchange=nccl_exchange(spec, max(token_counts)))
    blocking = {"nccl_exact": NcclDispatch(spec, kernels), "nvlink": NvlinkDispatch(spec, kernels, max(token_counts))}
    points = []
    for tokens in token_counts:
        hidden = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
        ids, w = random_routing(tokens, spec.num_experts, spec.top_k, 1000 + rank)
        out = torch.empty_like(hidden)
        send_worst = hidden.repeat(ep, 1)  # T rows to every rank: nothing counted, nothing exchanged first
        recv_worst = torch.empty_like(send_worst)

        def worst() -> None:
            dist.all_to_all_single(recv_worst, send_worst)  # noqa: B023
            dist.all_to_all_single(send_worst, recv_worst)  # noqa: B023

        sent = blocking["nccl_exact"].dispatch(hidden, ids, w).send_splits
        needed = torch.tensor([sum(s for r, s in enumerate(sent) if r != rank)], device="cuda", dtype=torch.float64)
        dist.all_reduce(needed, op=dist.ReduceOp.MAX)
        moved = 2 * float(needed.item()) * 2 * H  # bytes of rows another rank needed, there and back (busiest)
        point = {"hidden": H, "tokens": tokens, "top_k": spec.top_k, "experts": spec.num_experts,
                 "rows_sent_busiest_rank": int(needed.item())}
        non_blocking = NvlinkDispatch(spec, kernels, tokens, recv_capacity=ep * tokens)
        equal = [tokens] * ep  # every rank's count, known to all (as the worst case's equal splits assume)
        timed = [*((n, _time(exchange(d, hidden, ids, w, out), iters)) for n, d in blocking.items()),
                 ("nccl", _time(exchange(planned, hidden, ids, w, out, equal), iters)),
                 ("nccl_graph", time_graph(exchange(planned, hidden, ids, w, out, equal), iters)),
                 ("nvlink_graph", time_graph(exchange(non_blocking, hidden, ids, w, out), iters)),
                 ("worst_case", _time(worst, iters)), ("worst_case_graph", time_graph(worst, iters))]
        del non_blocking
        for name, ms in timed:
            point[f"{name}_ms"] = ms
            point[f"{name}_algbw_gb_s"] = moved / ms / 1e6
        _progress(f"dispatch H={H} T={tokens}: " + " ".join(f"{n} {1e3 * ms:.1f} us" for n, ms in timed))
        points.append(point)
    return points


def _progress(line: str) -> None:
    if dist.get_rank() == 0:
        print(line, file=sys.stderr, flush=True)


def random_weights(spec: MoESpec, seed: int) -> MoEWeights:
    """Random bf16 weights made on the GPU (a DeepSeek-V3-shaped layer's 22 GB would take minutes on a CPU),
    scaled by fan-in like MoEWeights.random."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    E, H, I = spec.num_experts, spec.hidden_size, spec.intermediate_size

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda", generator=g, dtype=torch.bfloat16) / shape[-1] ** 0.5)

    return MoEWeights(router_weight=rnd(E, H), w1=rnd(E, spec.fc1_out_features, H), w2=rnd(E, H, I))


def layer_points(name: str, spec: MoESpec, weights: MoEWeights, token_counts: tuple[int, ...],
                 iters: int) -> list[dict]:
    """The EP layer against the single-GPU runner holding every expert, same tokens per GPU. Called eagerly: the
    blocking `nvlink` and `nccl` layers (and `nccl` with dual-batch overlap) and both in the permuted format
    (`nvlink`'s without a host synchronization), each made once for the largest
    count (a DeepSeek-V3-shaped layer's weight copies take seconds). Replayed from CUDA graphs: the non-blocking
    `nvlink` layer with overlap off and on, made per count with room for every row it may receive (ep_size x
    tokens: never overflows), the `nccl` layer in its all-gather form, and the single-GPU runner. The `nccl`
    layers' calls give every rank's token count (the plan's all-gather form), and without overlap are timed
    without it too (`ep_nccl_exact`: the two phases find the counts). Each layer is freed before the next is made
    (five weight copies of that layer at once would not fit beside each other)."""
    from ..runner import MoERunner
    from ..runner.expert_parallel import rank_layer
    rank, ep, most = dist.get_rank(), spec.ep_size, max(token_counts)
    eager: dict[str, Callable[[], Callable[..., object]]] = {
        key: functools.partial(rank_layer, spec, weights, rank, max_tokens=most,
                               force={"dispatch": b, "ep_format": fmt}, overlap=overlap)
        for key, b, overlap, fmt in (("ep_nvlink", "nvlink", False, "contiguous"),
                                     ("ep_nccl", "nccl", False, "contiguous"),
                                     ("ep_nccl_overlap", "nccl", True, "contiguous"),
                                     ("ep_nvlink_permuted", "nvlink", False, "permuted"),
                                     ("ep_nccl_permuted", "nccl", False, "permuted"))}
    inputs = {t: (torch.randn(t, spec.hidden_size, device="cuda", dtype=torch.bfloat16),
                  *random_routing(t, spec.num_experts, spec.top_k, 2000 + rank)) for t in token_counts}
    points = [{"layer": name, "tokens_per_gpu": t} for t in token_counts]
    for key, make in eager.items():
        layer = make()
        for point in points:
            counts = [point["tokens_per_gpu"]] * ep if "nccl" in key else None
            _time_layer(key, layer, point, inputs, iters, graph=False, tokens_per_rank=counts)
            if key == "ep_nccl":  # the all-gather form captures; the two phases run eagerly only
                _time_layer(f"{key}_graph", layer, point, inputs, iters, graph=True, tokens_per_rank=counts)
                _time_layer(f"{key}_exact", layer, point, inputs, iters, graph=False)
        del layer
        torch.cuda.empty_cache()  # that layer (its weight copies) is gone
    # the contiguous format with room for every row, with overlap off and on, and the permuted format (rows land
    # grouped by expert; every (token, k) row comes back: the deterministic plans' format)
    graphed = (("ep_nvlink_graph", False, "contiguous"), ("ep_nvlink_overlap_graph", True, "contiguous"),
               ("ep_nvlink_permuted_graph", False, "permuted"))
    for key, overlap, fmt in graphed:
        for point in points:
            t = point["tokens_per_gpu"]
            layer = rank_layer(spec, weights, rank, max_tokens=t, force={"dispatch": "nvlink", "ep_format": fmt},
                               overlap=overlap, recv_capacity=ep * t if fmt == "contiguous" else None)
            _time_layer(key, layer, point, inputs, iters, graph=True)
            del layer
            torch.cuda.empty_cache()
    single = MoERunner(replace(spec, ep_size=1), weights, max_tokens=most)
    for point in points:
        _time_layer("single_gpu_graph", single, point, inputs, iters, graph=True)
    del single
    torch.cuda.empty_cache()
    return points


def _time_layer(key: str, layer: Callable[..., object], point: dict,
                inputs: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], iters: int, graph: bool,
                tokens_per_rank: list[int] | None = None) -> None:
    """`layer` timed at the point's token count (eagerly or replayed from a CUDA graph), into its `{key}_ms`;
    `tokens_per_rank` passed to the call where given."""
    hidden, ids, w = inputs[point["tokens_per_gpu"]]
    out = torch.empty_like(hidden)
    extra = {} if tokens_per_rank is None else {"tokens_per_rank": tokens_per_rank}
    call = functools.partial(layer, hidden, topk_ids=ids, topk_weights=w, out=out, **extra)
    point[f"{key}_ms"] = (time_graph if graph else _time)(call, iters)
    _progress(f"layer {point['layer']} T={point['tokens_per_gpu']} {key}: {1e3 * point[f'{key}_ms']:.1f} us")


def memory_point(spec: MoESpec, tokens: int) -> dict:
    """Peak bytes one dispatch + combine allocates, against the worst case preallocated (the two-phase exact form:
    the plan's past its all-gather band, which 131072 tokens a rank are)."""
    from ..runner.dispatch import NcclDispatch
    rank, ep, H = dist.get_rank(), dist.get_world_size(), spec.hidden_size
    d = NcclDispatch(spec, kernels)
    hidden = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
    ids, w = random_routing(tokens, spec.num_experts, spec.top_k, 3000 + rank)
    out = torch.empty_like(hidden)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    got = d.dispatch(hidden, ids, w)
    d.combine(got.hidden, got, out)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    worst = 2 * ep * tokens * H * 2  # ep * T rows received, as many returned
    t = torch.tensor([peak], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {"tokens": tokens, "hidden": H, "top_k": spec.top_k, "peak_bytes_ours": int(t.item()),
            "worst_case_bytes": worst}


def dispatch_spec(hidden: int) -> MoESpec:
    """This rank's spec for the dispatch points at `hidden`: top-k 8 over Qwen3's 128 experts at hidden 2048,
    DeepSeek-V3's 256 otherwise (the intermediate size plays no part in an exchange)."""
    return MoESpec(hidden, 256, 128 if hidden == 2048 else 256, 8, ep_size=dist.get_world_size(),
                   ep_rank=dist.get_rank())


def init_rank() -> None:
    """This process's rank under torchrun: the NCCL group, and its GPU."""
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", dist.get_rank())))


def run(iters: int, out_path: str | None, layers: tuple[str, ...] = tuple(name for name, *_ in LAYERS)) -> dict:
    rank, ep = dist.get_rank(), dist.get_world_size()
    result: dict = {"world": ep, "gpu": torch.cuda.get_device_name(), "link": link_bandwidth(iters)}
    _progress(f"link: all-to-all {result['link']['gb_s']:.0f} GB/s per rank")
    result["dispatch"] = []
    for H in DISPATCH_HIDDEN:
        spec = dispatch_spec(H)
        result["dispatch"] += dispatch_points(spec, DISPATCH_TOKENS, iters)
    result["memory"] = [memory_point(MoESpec(2048, 256, 128, k, ep_size=ep, ep_rank=rank), MEMORY_TOKENS)
                        for k in (8, 2)]
    for m in result["memory"]:
        _progress(f"memory top-{m['top_k']}: ours {m['peak_bytes_ours']} B, worst case {m['worst_case_bytes']} B")
    result["layers"] = []
    for name, H, inter, experts, top_k in (layer for layer in LAYERS if layer[0] in layers):
        spec = MoESpec(H, inter, experts, top_k, ep_size=ep, name=name)
        result["layers"] += layer_points(name, spec, random_weights(spec, seed=7), LAYER_TOKENS, iters)
        torch.cuda.empty_cache()  # the shape's layers (their weight copies) are gone
    if rank == 0:
        result["targets"] = ep_targets(result, LAYER_HIDDEN)
        if out_path:
            with open(out_path, "w") as f:
                json.dump(result, f, indent=1)
        print(table(result))
    return result


def table(r: dict) -> str:
    lines = [f"{r['world']} x {r['gpu']}: all-to-all link {r['link']['gb_s']:.0f} GB/s per rank",
             "dispatch+combine (us; eager | graph): hidden tokens | nvlink nccl nccl-exact worst-case | nvlink nccl "
             "worst-case | nvlink graph GB/s"]
    for p in r["dispatch"]:
        lines.append(f"  {p['hidden']:5d} {p['tokens']:5d} | {1e3 * p['nvlink_ms']:7.1f} {1e3 * p['nccl_ms']:7.1f} "
                     f"{1e3 * p['nccl_exact_ms']:7.1f} {1e3 * p['worst_case_ms']:7.1f} | "
                     f"{1e3 * p['nvlink_graph_ms']:7.1f} {1e3 * p['nccl_graph_ms']:7.1f} "
                     f"{1e3 * p['worst_case_graph_ms']:7.1f} | {p['nvlink_graph_algbw_gb_s']:6.1f}")
    for m in r["memory"]:
        lines.append(f"memory at {m['tokens']} tokens/rank top-{m['top_k']}: ours {m['peak_bytes_ours'] / 2**20:.0f} "
                     f"MiB, worst case {m['worst_case_bytes'] / 2**20:.0f} MiB")
    lines.append("layer (us; eager | graph): name tokens/GPU | EP nvlink, nccl, nccl exact, nccl overlapped, "
                 "nvlink permuted, nccl permuted | EP nvlink, overlapped, permuted, nccl | single GPU")
    for p in r["layers"]:
        lines.append(f"  {p['layer']:20s} {p['tokens_per_gpu']:5d} | {1e3 * p['ep_nvlink_ms']:7.1f} "
                     f"{1e3 * p['ep_nccl_ms']:7.1f} {1e3 * p['ep_nccl_exact_ms']:7.1f} "
                     f"{1e3 * p['ep_nccl_overlap_ms']:7.1f} "
                     f"{1e3 * p['ep_nvlink_permuted_ms']:7.1f} {1e3 * p['ep_nccl_permuted_ms']:7.1f} | "
                     f"{1e3 * p['ep_nvlink_graph_ms']:7.1f} {1e3 * p['ep_nvlink_overlap_graph_ms']:7.1f} "
                     f"{1e3 * p['ep_nvlink_permuted_graph_ms']:7.1f} {1e3 * p['ep_nccl_graph_ms']:7.1f} | "
                     f"{1e3 * p['single_gpu_graph_ms']:7.1f}")
    lines.append(summary(ep_targets(r, LAYER_HIDDEN)))
    return "\n".join(lines)


def main() -> None:
    """Entry point of one rank (under torchrun)."""
    init_rank()
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    out_path = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None
    layers = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else tuple(name for name, *_ in LAYERS)
    run(iters, out_path, layers)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
