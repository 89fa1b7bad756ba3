"""Host time of the TensorRT plugin's enqueue core (`plugins.moe_plugin.run_enqueue`) per call.

Why: a TensorRT engine calls the plugin's enqueue once per MoE layer per step; at decode the GPU
work of a layer is tens of microseconds, so the host time of this Python enqueue is what a step
waits on unless the engine runs from a CUDA graph. This calls it as TensorRT would (raw pointers,
shapes, dtypes, a workspace of the plugin's size, a non-default stream) with the runner kept
between calls, queued back to back; with --profile it names where the time goes (cProfile).

Usage: PYTHONPATH=. python bench/enqueue_host_probe.py [--shapes a,b] [--tokens 1] [--calls 500] [--profile]
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from eager_host_probe import host_us, print_profile, probe_args  # bench/, this script's own folder

from moe_build.bench import _device_weights, bench_spec
from moe_build.planner import Plan, make_plan
from moe_build.spec import MoESpec
from moe_build.target import Flavour, Target
from moe_build.weights import MoEWeights
from plugins import moe_plugin as mp


def enqueue_call(spec: MoESpec, plan: Plan, weights: MoEWeights, tokens: int) -> Callable[[], object]:
    """One run_enqueue call as TensorRT makes it, on buffers made here, with one RunnerCache kept
    across calls (as a plugin instance keeps it)."""
    slots = mp.input_slots(spec)
    given = mp.plan_weights(plan, weights)
    hidden = torch.randn(tokens, spec.hidden_size, device="cuda").to(mp.TORCH_DTYPE[spec.dtype])
    logits = torch.randn(tokens, spec.num_experts, device="cuda")
    inputs = [hidden, logits] + [getattr(given, s.name) for s in slots[2:]]
    out = torch.empty_like(hidden, dtype=mp.output_dtype(spec))
    ws_bytes = mp.workspace_size(spec, plan, tokens)
    workspace = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    cache = mp.RunnerCache()
    args = ([t.data_ptr() for t in inputs], [tuple(t.shape) for t in inputs], [t.dtype for t in inputs],
            out.data_ptr(), out.dtype, workspace.data_ptr(), ws_bytes, stream.cuda_stream, cache)

    def call() -> None:
        mp.run_enqueue(spec, plan, *args)
    call.keep_alive = (inputs, out, workspace, stream)  # the memory behind args' raw pointers
    return call


def main() -> None:
    a = probe_args(__doc__.splitlines()[0])
    major, minor = torch.cuda.get_device_capability()
    for name in a.shapes.split(","):
        spec = bench_spec(name)
        plan = make_plan(spec, Target(sm=major * 10 + minor, flavour=Flavour.TENSORRT), tokens=a.tokens)
        call = enqueue_call(spec, plan, _device_weights(spec, 0), a.tokens)
        print(f"{name:>18} T={a.tokens}: {host_us(call, a.calls):7.1f} us host per enqueue", flush=True)
        if a.profile:
            print_profile(call, a.calls)
        del call
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
