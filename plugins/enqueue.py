"""The body of the MoE plugin's `enqueue` (IPluginV3OneRuntime), without TensorRT: the layer run on raw device
buffers by the runner the plan describes. PyTorch only, so the GPU test calls `run_enqueue` directly: the GPU
machine has no TensorRT of any kind."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Mapping, Sequence

import torch

from moe_build.errors import MoeBuildError
from moe_build.planner import Plan
from moe_build.runner.sequence import weights_int4_tiled
from moe_build.spec import MoESpec
from moe_build.weights import MoEWeights
from moe_build.weights.dtypes import TORCH_DTYPE
from moe_build.weights.fp8 import Fp8Scales
from moe_build.weights.woq import QUANT_KIND, WoqWeights

from .build_rules import check_input_dims, output_dims, plan_max_tokens, workspace_size
from .fields import PLUGIN_NAME
from .slots import (FP8_SLOT_PREFIX, WOQ_SLOT_PREFIX, input_slots, output_dtype, scale_granularity,
                    woq_group)

# Same-size integer stand-ins: the CUDA array interface has no bf16 or e4m3 typestr, so raw device memory
# is wrapped as integers of the element size and reinterpreted with `Tensor.view(dtype)`.
_RAW_TYPESTR = {1: "|u1", 2: "<i2", 4: "<i4"}


class _DeviceBuffer:
    """A raw device allocation seen through the CUDA array interface, so torch can wrap it in place."""

    def __init__(self, pointer: int, shape: Sequence[int], itemsize: int):
        self.__cuda_array_interface__ = {"shape": tuple(int(s) for s in shape), "typestr": _RAW_TYPESTR[itemsize],
                                         "data": (int(pointer), False), "strides": None, "version": 3}


def wrap_device_pointer(pointer: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A contiguous CUDA tensor over memory someone else owns (TensorRT's buffers): no copy."""
    raw = torch.as_tensor(_DeviceBuffer(pointer, shape, dtype.itemsize), device="cuda")
    return raw.view(dtype)


class RunnerCache:
    """One execution context's enqueue state: the runner, kept per set of weight addresses, and
    what enqueues at a token count and buffer addresses seen before would otherwise rebuild (the
    workspace size, tensors wrapping TensorRT's pointers, the carved workspace, the stream object).

    TensorRT keeps constant weights at fixed addresses for an execution context's life; a change
    of any address (another context, refit to new memory) builds a new runner and drops the rest.
    Everything kept wraps addresses TensorRT owns; nothing here owns device memory but the runner,
    which also holds what it derives from the weights when it is made (a weight-only layer's scales as
    the mixed-input wgmma GEMM reads them): a refit that rewrites weights in place, at the same
    addresses, is not seen.
    """

    MEMO_ENTRIES = 64  # per context: a few token counts x a few buffer sets

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._runner: Any = None
        self._memo: OrderedDict[tuple[Any, ...], Any] = OrderedDict()

    def get(self, key: tuple[Any, ...], make: Any) -> Any:
        if key != self._key:
            if self._key is not None:  # entries made for the previous runner's buffers
                self._memo.clear()
            self._runner, self._key = make(), key
        return self._runner

    def memo(self, key: tuple[Any, ...], make: Any) -> Any:
        """make()'s value for `key`, made once while among the last MEMO_ENTRIES keys used."""
        if key in self._memo:
            self._memo.move_to_end(key)
            return self._memo[key]
        value = self._memo[key] = make()
        if len(self._memo) > self.MEMO_ENTRIES:
            self._memo.popitem(last=False)
        return value


def cached_workspace_size(cache: RunnerCache, spec: MoESpec, plan: Plan, tokens: int) -> int:
    """`workspace_size` at `tokens`, kept in `cache`: every enqueue asks for it (the adapter for the
    bytes it passes, `run_enqueue` for its check), and it rebuilds the runner's layout."""
    return cache.memo(("workspace_bytes", tokens), lambda: workspace_size(spec, plan, tokens))


def run_enqueue(spec: MoESpec, plan: Plan, input_pointers: Sequence[int], input_shapes: Sequence[Sequence[int]],
                input_dtypes: Sequence[torch.dtype], output_pointer: int, output_dtype_: torch.dtype,
                workspace_pointer: int, workspace_bytes: int, stream_pointer: int,
                cache: RunnerCache | None = None) -> None:
    """The body of `enqueue`, without TensorRT: run the layer on raw device buffers.

    Wraps the pointers as CUDA tensors (no copies), and runs the runner, made from the plan's
    target and forced stages, on `stream_pointer` (as a torch ExternalStream) with the
    `workspace_pointer` buffer as its workspace. Asynchronous like any enqueue: returns once the
    work is queued. `cache` keeps the runner, and the wrappers and carved workspace of addresses
    seen before, between calls (all are made afresh without it).
    """
    slots = input_slots(spec)
    check_input_dims(spec, input_shapes)
    for slot, dtype in zip(slots, input_dtypes):
        if dtype not in slot.dtypes:
            raise MoeBuildError(f"{PLUGIN_NAME} input {slot.name!r}", f"dtype {dtype} not accepted", slot.dtypes)
    if output_dtype_ != output_dtype(spec):
        raise MoeBuildError(f"{PLUGIN_NAME} output", f"dtype {output_dtype_} not produced", [output_dtype(spec)])
    tokens = int(input_shapes[0][0])
    if tokens == 0:
        return
    cache = cache or RunnerCache()
    max_tokens = cache.memo(("max_tokens",), lambda: plan_max_tokens(plan))
    if tokens > max_tokens:
        raise MoeBuildError("tokens", f"{tokens} exceeds the plan's profile max", f"1..{max_tokens}")
    need = cached_workspace_size(cache, spec, plan, tokens)
    if workspace_bytes < need:
        raise MoeBuildError(f"{PLUGIN_NAME} workspace", f"{workspace_bytes} bytes given, {need} needed for "
                            f"{tokens} tokens", f">= {need}")
    # The weights are wrapped only when a runner is made; its key is their addresses.
    key = (torch.cuda.current_device(),) + tuple(int(p) for p in input_pointers[2:])
    runner = cache.get(key, lambda: _make_runner(spec, plan, {
        slot.name: slot.as_stored(wrap_device_pointer(p, shape, dtype))
        for slot, p, shape, dtype in zip(slots[2:], input_pointers[2:], input_shapes[2:], input_dtypes[2:])}))

    def wrapped(pointer: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        shape = tuple(int(d) for d in shape)
        return cache.memo(("tensor", int(pointer), shape, dtype), lambda: wrap_device_pointer(pointer, shape, dtype))

    hidden = wrapped(input_pointers[0], input_shapes[0], input_dtypes[0])
    logits = wrapped(input_pointers[1], input_shapes[1], input_dtypes[1])
    out = wrapped(output_pointer, output_dims(input_shapes), output_dtype_)
    workspace = cache.memo(("workspace", tokens, int(workspace_pointer), int(workspace_bytes)),
                           lambda: runner.bind_workspace(
                               wrap_device_pointer(workspace_pointer, (workspace_bytes,), torch.uint8), tokens))
    stream = cache.memo(("stream", int(stream_pointer)), lambda: torch.cuda.ExternalStream(stream_pointer))
    with torch.cuda.stream(stream):
        runner(hidden, router_logits=logits, out=out, workspace=workspace)


def check_local_dispatch(plan: Plan) -> None:
    """Refuse (one line) a runner for a plan whose experts are split over ranks: the exchange of tokens needs a
    process group, which only ExpertParallelMoE holds."""
    choice = plan.stage("dispatch").choice
    if choice != "none":
        raise MoeBuildError("dispatch", f"{choice}: the plugin runs a rank's experts only through "
                            "moe_build.runner.expert_parallel.ExpertParallelMoE, which needs a process group (per-rank "
                            "OOTB engines build with --moe-plugin disable)", "none")


def _make_runner(spec: MoESpec, plan: Plan, weights: Mapping[str, torch.Tensor]) -> Any:
    """A runner over TensorRT's weight buffers (already in the plan's layouts) that runs the plan as it is:
    `check_spec_and_plan` has shown the planner gives back this plan, so nothing is decided anew here.
    `weights` maps slot names to tensors; the `fp8.*` scales become the layer's Fp8Scales. A plan that splits the
    experts over ranks (dispatch not `none`) is refused: the plugin builds nothing distributed."""
    check_local_dispatch(plan)
    from moe_build.runner import MoERunner
    device = weights["w1"].device
    # The plugin receives router logits, so the router's own weight is never read: a zero-stride
    # placeholder of the right shape satisfies MoEWeights without a real [E, H] tensor.
    router_weight = torch.zeros((), dtype=TORCH_DTYPE[spec.dtype], device=device).expand(
        spec.num_experts, spec.hidden_size)
    tensors = {n: t for n, t in weights.items() if not n.startswith((FP8_SLOT_PREFIX, WOQ_SLOT_PREFIX))}
    granularity = scale_granularity(spec)
    fp8 = woq = None
    if granularity is not None:
        scale = {n[len(FP8_SLOT_PREFIX):]: t for n, t in weights.items() if n.startswith(FP8_SLOT_PREFIX)}
        fp8 = Fp8Scales(granularity, scale["w1_scale"], scale["w2_scale"], scale.get("a1_scale"),
                        scale.get("a2_scale"))
    if spec.quant in QUANT_KIND:
        stored = {n[len(WOQ_SLOT_PREFIX):]: t for n, t in weights.items() if n.startswith(WOQ_SLOT_PREFIX)}
        stored.update({n: stored[n].reshape(()) for n in ("a1_scale", "a2_scale") if n in stored})  # [1] -> []
        woq = WoqWeights(QUANT_KIND[spec.quant], woq_group(spec), tensors["w1"], tensors["w2"], **stored,
                         int4_tiles=weights_int4_tiled(plan))  # the inputs in the plan's weight_layout
    return MoERunner(spec, MoEWeights(router_weight=router_weight, fp8=fp8, woq=woq, **tensors), plan=plan,
                     device=device, weights_prepared=True)
