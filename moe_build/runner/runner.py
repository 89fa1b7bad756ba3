"""MoERunner: one MoE layer executed by our CUDA kernels exactly as its plan says.

The runner never decides a fusion, a weight layout or a GEMM tactic: it runs a plan (the caller's, e.g.
the plugin's from an engine, or one made here by the pure planner for this GPU, with the caller's
`force=`), turns it into steps with `kernel_sequence` and the tactics of the call's token count, and
launches them on the current stream into buffers sized once for the plan's max tokens.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Mapping

import torch

from .. import kernels
from ..errors import MoeBuildError
from ..planner import STEP_STAGES, Plan, make_plan
from ..spec import MoESpec
from ..target import Target, TokenProfile, peak_memory_bytes_per_s, resolve_target
from ..weights import MoEWeights
from ..weights.dtypes import TORCH_DTYPE
from . import sequence as S
from .batch import Batch
from .experts import FusedExperts
from .graph import GraphedMoE
from .prepare_finalize import PrepareFinalize
from .programs import LaunchPrograms
from .workspace import BufferSpec, Workspace, layout_bytes, workspace_layout


CACHED_TOKEN_COUNTS = 64  # token counts whose steps, tactics and caller-workspace layout a runner keeps


def require_cuda(device: torch.device | str) -> torch.device:
    """The runner's kernels exist only on CUDA devices: refuse anything else with one clear line."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise MoeBuildError("device", f"the fused runner runs CUDA kernels, got device {str(dev)!r}", "cuda")
    if not torch.cuda.is_available():
        raise MoeBuildError("device", "no CUDA device is available (torch.cuda.is_available() is False)",
                            "a machine with an NVIDIA GPU")
    return dev


def serving_target(base: Target, max_tokens: int) -> Target:
    """`base` with the profile of a runner serving 1..max_tokens tokens (opt: 16, or max_tokens if fewer)."""
    return dataclasses.replace(base, profile=TokenProfile(1, min(16, max_tokens), max_tokens))


def device_target(device: torch.device, max_tokens: int, base: Target | None = None) -> Target:
    """The target of a runner on `device` serving 1..max_tokens tokens: `base` where given, else full TensorRT
    on the device's SM as `resolve_target` fills it (the environment's gates included) with the device's
    multiprocessor count, L2 size and peak DRAM rate (what the tactic rules read; the rate the SM's default where
    this torch does not report the memory clock); either with the runner's profile."""
    if base is None:
        props = torch.cuda.get_device_properties(device)
        resolved = resolve_target(sm=props.major * 10 + props.minor, flavour="tensorrt")
        memory = peak_memory_bytes_per_s(getattr(props, "memory_clock_rate", 0),
                                         getattr(props, "memory_bus_width", 0))
        base = dataclasses.replace(resolved, sm_count=props.multi_processor_count, l2_bytes=props.L2_cache_size,
                                   memory_bytes_per_s=memory, sm_source="detected")  # 0: Target's default
    return serving_target(base, max_tokens)


class MoERunner:
    """A callable MoE layer: `runner(hidden, router_logits=None, topk_ids=None, topk_weights=None, out=None)`.

    `plan` runs as given (checked against `spec` and the device); without one, the runner plans for this
    device (or `target`) and `max_tokens` with `force`. `self.weights` holds W1 / b1 in the plan's w1_order
    and W1 / W2 in its weight_layout, converted once here; `weights_prepared=True` says the given weights
    already are (an engine's buffers).
    """

    def __init__(self, spec: MoESpec, weights: MoEWeights, target: Target | None = None, max_tokens: int = 4096,
                 force: Mapping[str, str] | None = None, device: torch.device | str = "cuda",
                 plan: Plan | None = None, weights_prepared: bool = False) -> None:
        self.device = require_cuda(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        major, minor = torch.cuda.get_device_capability(self.device)
        if plan is None:
            if not isinstance(max_tokens, int) or max_tokens < 1:
                raise MoeBuildError("max_tokens", f"must be a positive integer, got {max_tokens!r}", "integers >= 1")
            plan = make_plan(spec, device_target(self.device, max_tokens, target), tokens=max_tokens, force=force)
        elif force:
            raise MoeBuildError("force", "a given plan already holds its forced stages", "plan or force, not both")
        elif plan.spec != spec.to_dict():
            raise MoeBuildError("plan", "was made for a different spec", "a plan from make_plan(spec, ...)")
        if plan.target["sm"] != major * 10 + minor:
            raise MoeBuildError("sm", f"the plan targets sm{plan.target['sm']} but {self.device} is sm{major}{minor}",
                                f"sm{major}{minor}")
        S.check_runnable(plan)
        weights.check(spec)
        self.spec = spec
        self.plan: Plan = plan
        self.max_tokens = int(plan.target["profile"]["max"])
        self.dtype = TORCH_DTYPE[spec.dtype]
        self.w1_interleaved = S.w1_interleaved(plan)
        self.weights_blocked = S.weights_blocked(plan)
        self.weights = _to_device(weights, self.device, self.dtype)
        if not weights_prepared:
            self.weights = S.plan_weights(plan, self.weights)

        # The runner's own workspaces, one per CUDA stream (by handle), each allocated by the first call on
        # that stream not given a workspace: calls on two streams may then run at once (two micro-batches
        # overlapped), where one shared workspace would let each overwrite the other's buffers. Kept for the
        # runner's lifetime: a captured graph may still use one.
        self._workspaces: dict[int, Workspace] = {}
        deterministic = bool(self.plan.target.get("deterministic", False))
        self.prepare_finalize = PrepareFinalize(spec, self.weights, kernels, deterministic)
        steps = S.steps_up_to(plan, self.max_tokens)
        mixed = tuple(name for name, on in (("w1", steps & S.GEMM1_WOQ_WGMMA_STEPS),
                                            ("w2", steps & S.GEMM2_WOQ_WGMMA_STEPS)) if on)
        digits = tuple(name for name, on in (("w1", S.GEMM1_WOQ_DIGITS in steps),
                                             ("w2", steps & S.GEMM2_WOQ_DIGITS_STEPS)) if on)
        self.experts = FusedExperts(spec, self.weights, kernels, weights_blocked=self.weights_blocked,
                                    woq_wgmma=mixed, woq_digits=digits, fp8_accumulation=S.fp8_accumulation(plan),
                                    w1_interleaved=self.w1_interleaved)
        self._steps = self._step_table()
        # The launches of the last calls, by everything their arguments depend on (programs.py): a call whose
        # key was seen replays them instead of running the torch wrappers again.
        self._programs = LaunchPrograms(self._steps)
        # Per token count, what every call at that count would recompute: its steps and tactics, and the
        # layout of a caller's workspace (kernel size queries). Kept for the last few counts. The cached
        # functions hold the spec and plan, not the runner: a cycle through `self` would leave a dropped
        # runner's weights to the cyclic collector instead of freeing them at once.
        self._call_plan = functools.lru_cache(maxsize=CACHED_TOKEN_COUNTS)(functools.partial(_call_plan, self.plan))
        self._layout = functools.lru_cache(maxsize=CACHED_TOKEN_COUNTS)(
            functools.partial(runner_layout, spec, self.plan))

    @property
    def workspace(self) -> Workspace:
        """The runner's own workspace for the current stream, sized once for max_tokens (allocated by the
        first use on that stream, on that stream, so the caching allocator reuses it only in its order)."""
        return self._stream_workspace(torch.cuda.current_stream(self.device).cuda_stream)

    def _stream_workspace(self, stream: int) -> Workspace:
        ws = self._workspaces.get(stream)
        if ws is None:
            ws = self._workspaces[stream] = Workspace(runner_layout(self.spec, self.plan, self.max_tokens),
                                                      self.device)
        return ws

    def workspace_bytes(self, tokens: int) -> int:
        """Bytes of the flat workspace a call of `tokens` tokens takes (bind_workspace's), from the kept layouts."""
        return layout_bytes(self._layout(tokens))

    def bind_workspace(self, flat: torch.Tensor, tokens: int) -> Workspace:
        """A caller's flat buffer carved for calls of `tokens` tokens: a caller that reuses one buffer
        (TensorRT's workspace) carves it once instead of on every call."""
        return Workspace(self._layout(tokens), flat=flat)

    def _step_table(self) -> dict[str, Callable[[Batch], None]]:
        pf, ex = self.prepare_finalize, self.experts
        return {
            S.ROUTER_GEMM: pf.router_gemm, S.ROUTING: pf.routing,
            S.PROLOGUE_FUSED: ex.prologue_fused, S.PROLOGUE_FUSED_ROUTING: ex.prologue_fused_routing,
            S.PROLOGUE_THREE_STEP: ex.prologue_three_step,
            S.PROLOGUE_THREE_STEP_ZERO_OUTPUT: ex.prologue_three_step_zero_output,
            S.PROLOGUE_THREE_STEP_ROUTING: ex.prologue_three_step_routing,
            S.PROLOGUE_THREE_STEP_ROUTING_ZERO_OUTPUT: ex.prologue_three_step_routing_zero_output,
            S.EXPAND_ROWS: ex.expand_rows, S.EXPAND_ROWS_ZERO_OUTPUT: ex.expand_rows_zero_output,
            S.GEMM1_SM90: ex.gemm1_sm90, S.GEMM1_SM90_GATED: ex.gemm1_sm90_gated,
            S.GEMM1_SM80: ex.gemm1_sm80, S.GEMM1_SM80_ACT: ex.gemm1_sm80_act,
            S.GEMM1_SM80_FUSED_GATED: ex.gemm1_sm80_fused_gated, S.FC1_ACTIVATION: ex.fc1_activation,
            S.GEMM2_SM90_FINALIZE: ex.gemm2_sm90_finalize,
            S.GEMM2_SM90: ex.gemm2_sm90, S.GEMM2_SM80: ex.gemm2_sm80,
            S.FINALIZE: pf.weight_and_reduce, S.SHARED_EXPERTS: pf.shared_experts,
            S.EXPAND_ROWS_FP8: ex.expand_rows_fp8, S.QUANTIZE_INPUT: ex.quantize_input,
            S.EXPAND_ROWS_FP8_PREQUANTIZED: ex.expand_rows_fp8_prequantized, S.GEMM1_FP8: ex.gemm1_fp8,
            S.GEMM1_FP8_GATED: ex.gemm1_fp8_gated, S.GEMM1_FP8_GATED_QUANTIZED: ex.gemm1_fp8_gated_quantized,
            S.EXPAND_ROWS_FP8_ZERO_OUTPUT: ex.expand_rows_fp8_zero_output,
            S.EXPAND_ROWS_FP8_PREQUANTIZED_ZERO_OUTPUT: ex.expand_rows_fp8_prequantized_zero_output,
            S.FC1_ACTIVATION_FP8: ex.fc1_activation_fp8, S.QUANTIZE_FC2_INPUT: ex.quantize_fc2_input,
            S.GEMM2_FP8: ex.gemm2_fp8, S.GEMM2_FP8_FINALIZE: ex.gemm2_fp8_finalize,
            S.GEMM2_FP8_QUANTIZING_FINALIZE: ex.gemm2_fp8_quantizing_finalize,
            S.FC1_PREQUANT: ex.fc1_prequant, S.EXPAND_ROWS_PREQUANT_INPUT: ex.expand_rows_prequant_input,
            S.EXPAND_ROWS_PREQUANT_INPUT_ZERO_OUTPUT: ex.expand_rows_prequant_input_zero_output,
            S.EXPAND_ROWS_PREQUANT: ex.expand_rows_prequant,
            S.EXPAND_ROWS_PREQUANT_ZERO_OUTPUT: ex.expand_rows_prequant_zero_output,
            S.GEMM1_WOQ: ex.gemm1_woq,
            S.FC1_ACTIVATION_PREQUANT: ex.fc1_activation_prequant, S.FC2_PREQUANT: ex.fc2_prequant,
            S.GEMM2_WOQ: ex.gemm2_woq, S.GEMM1_WOQ_DENSE: ex.gemm1_woq_dense, S.GEMM2_WOQ_DENSE: ex.gemm2_woq_dense,
            S.GEMM1_WOQ_WGMMA: ex.gemm1_woq_wgmma, S.GEMM2_WOQ_WGMMA: ex.gemm2_woq_wgmma,
            S.GEMM2_WOQ_WGMMA_FINALIZE: ex.gemm2_woq_wgmma_finalize,
            S.GEMM1_WOQ_WGMMA_GATED: ex.gemm1_woq_wgmma_gated,
            S.GEMM1_WOQ_WGMMA_GATED_PREQUANT: ex.gemm1_woq_wgmma_gated_prequant,
            S.GEMM1_WOQ_WGMMA_GATED_FP8_DEQUANTIZED: ex.gemm1_woq_wgmma_gated_fp8_dequantized,
            S.GEMM1_WOQ_WGMMA_GATED_PREQUANT_FP8_DEQUANTIZED: ex.gemm1_woq_wgmma_gated_prequant_fp8_dequantized,
            S.GEMM1_WOQ_DIGITS: ex.gemm1_woq_digits, S.GEMM2_WOQ_DIGITS: ex.gemm2_woq_digits,
            S.GEMM2_WOQ_DIGITS_FINALIZE: ex.gemm2_woq_digits_finalize,
            S.TOKEN_DIGITS_GEMM1: ex.token_digits_gemm1, S.TOKEN_DIGITS_GEMM2: ex.token_digits_gemm2,
            S.EXPAND_ROWS_DIGITS: ex.expand_rows_digits, S.EXPAND_ROWS_DIGITS_ZERO_OUTPUT: ex.expand_rows_digits_zero_output,
            S.EXPAND_ROWS_PREQUANT_DIGITS: ex.expand_rows_prequant_digits,
            S.EXPAND_ROWS_PREQUANT_DIGITS_ZERO_OUTPUT: ex.expand_rows_prequant_digits_zero_output,
            S.EXPAND_ROWS_PREQUANT_INPUT_DIGITS: ex.expand_rows_prequant_input_digits,
            S.EXPAND_ROWS_PREQUANT_INPUT_DIGITS_ZERO_OUTPUT: ex.expand_rows_prequant_input_digits_zero_output,
            S.FC1_ACTIVATION_DIGITS: ex.fc1_activation_digits,
            S.FC1_ACTIVATION_PREQUANT_DIGITS: ex.fc1_activation_prequant_digits,
            S.EXPAND_ROWS_16BIT: ex.expand_rows_16bit, S.EXPAND_ROWS_16BIT_ZERO_OUTPUT: ex.expand_rows_16bit_zero_output,
            S.GEMM2_WOQ_FINALIZE: ex.gemm2_woq_finalize,
            S.EXPAND_ROWS_FP8_DEQUANTIZED: ex.expand_rows_fp8_dequantized,
            S.EXPAND_ROWS_FP8_DEQUANTIZED_ZERO_OUTPUT: ex.expand_rows_fp8_dequantized_zero_output,
            S.EXPAND_ROWS_FP8_DEQUANTIZED_DIGITS: ex.expand_rows_fp8_dequantized_digits,
            S.EXPAND_ROWS_FP8_DEQUANTIZED_DIGITS_ZERO_OUTPUT: ex.expand_rows_fp8_dequantized_digits_zero_output,
            S.FC1_PREQUANT_FP8_DEQUANTIZED: ex.fc1_prequant_fp8_dequantized,
            S.FC1_PREQUANT_FP8_DEQUANTIZED_DIGITS: ex.fc1_prequant_fp8_dequantized_digits,
            S.FC1_ACTIVATION_FP8_DEQUANTIZED: ex.fc1_activation_fp8_dequantized,
            S.FC1_ACTIVATION_FP8_DEQUANTIZED_DIGITS: ex.fc1_activation_fp8_dequantized_digits,
            S.FC2_PREQUANT_FP8_DEQUANTIZED: ex.fc2_prequant_fp8_dequantized,
        }

    def kernel_sequence(self, tokens: int, routing_input: S.RoutingInput = "hidden") -> list[str]:
        return S.kernel_sequence(self.plan, tokens, routing_input)

    def __call__(self, hidden: torch.Tensor, router_logits: torch.Tensor | None = None,
                 topk_ids: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
                 out: torch.Tensor | None = None, workspace: torch.Tensor | Workspace | None = None) -> torch.Tensor:
        """The layer's output for `hidden` [T, H] or [B, S, H], on the current stream (calls on different
        streams may overlap: each stream has its own workspace).

        Routing may be pinned with `router_logits` [T, E] or `topk_ids`+`topk_weights` [T, K]
        (copied into the workspace). `out` (same shape/dtype as hidden, not overlapping it:
        where GEMM2 finalizes in its epilogue, the three-step routing prologue or the expansion zeroes it
        before every row of hidden is read) avoids the one
        allocation a call otherwise makes. `workspace` (flat uint8, >= workspace_bytes(spec,
        plan, T) bytes, e.g. TensorRT's, or that buffer already carved by `bind_workspace(flat, T)`)
        replaces the runner's own buffers for this call.
        """
        x = self.check_hidden(hidden)
        T = x.shape[0]
        if out is None:
            out = torch.empty_like(hidden)
        elif out.shape != hidden.shape or out.dtype != self.dtype or out.device != self.device \
                or not out.is_contiguous():
            raise MoeBuildError("out", "must be a contiguous tensor shaped and typed like hidden", str(self.dtype))
        elif _overlap(out, hidden):
            raise MoeBuildError("out", "overlaps hidden, which the layer still reads after zeroing out",
                                "a buffer apart from hidden")
        if T == 0:
            return out
        stream = torch.cuda.current_stream(self.device).cuda_stream
        if workspace is None:
            ws = self._stream_workspace(stream)
        elif isinstance(workspace, Workspace):
            if workspace.layout != self._layout(T):
                raise MoeBuildError("workspace", f"carved for another plan or token count, not {T} tokens",
                                    f"runner.bind_workspace(flat, {T})")
            ws = workspace
        else:
            ws = self.bind_workspace(workspace, T)
        views = ws.views(T)
        routing_input = _routing_input(router_logits, topk_ids)
        steps, (gemm1_tactic, gemm2_tactic, step_tactics) = self._call_plan(T, routing_input)
        b = Batch(T, x, out.view(T, -1), views, stream, gemm1_tactic, gemm2_tactic, step_tactics,
                  topk_ids=views["topk_ids"], topk_weights=views["topk_weights"])
        self.bind_routing(b, router_logits, topk_ids, topk_weights)
        # Every address a launch of this call takes: the workspace (its carving fixed by T and whether it is the
        # runner's own, sized for max_tokens), the caller's tensors, and the logits' dtype (the routing kernel's).
        logits = b.logits
        key = (T, routing_input, stream, workspace is None, ws.flat.data_ptr(), x.data_ptr(), out.data_ptr(),
               None if logits is None else (logits.data_ptr(), logits.dtype))
        # The caller's tensors are checked above and the rest are the runner's own, right by
        # construction, so the kernel wrappers skip their per-tensor checks.
        with kernels.trusted_tensors():
            self._programs.run(key, steps, b)
        return out

    def grouped_experts(self, rows: torch.Tensor, expert_offsets: torch.Tensor, out: torch.Tensor,
                        workspace: torch.Tensor) -> torch.Tensor:
        """Every expert's GEMM1 (+ activation) and GEMM2 over `rows` [P, H] already grouped by expert (expert e's
        rows from expert_offsets[e] to [e + 1], int64 on the device, as dispatch_with_permute lays them out): each
        row's expert output into `out` [P, H], unweighted, on the current stream; no host synchronization, so the
        call can be captured in a CUDA graph. P must be a multiple of top_k (the workspace's rows per token);
        `workspace` (flat uint8, workspace_bytes(P // top_k)) holds the intermediate rows. The plan's ep_format
        must be permuted or batched (sequence.grouped_sequence)."""
        K, H = self.spec.top_k, self.spec.hidden_size
        P = rows.shape[0]
        if rows.dim() != 2 or rows.shape[1] != H or P % K or rows.dtype != self.dtype or not rows.is_contiguous():
            raise MoeBuildError("rows", f"{tuple(rows.shape)} {rows.dtype}", f"contiguous [a multiple of {K}, {H}] "
                                f"{self.dtype}")
        if out.shape != rows.shape or out.dtype != rows.dtype or not out.is_contiguous():
            raise MoeBuildError("out", f"{tuple(out.shape)} {out.dtype}", f"contiguous {tuple(rows.shape)} {rows.dtype}")
        tokens = P // K
        steps = S.grouped_sequence(self.plan, tokens)
        choices = self.plan.choices(tokens)
        views = dict(self.bind_workspace(workspace, tokens).views(tokens))
        views.update(permuted_input=rows, expert_offsets=expert_offsets, gemm2_out=out)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        b = Batch(tokens, rows, out, views, stream, *_tactics(choices))
        for step in steps:
            self._steps[step](b)
        return out

    def capture_graph(self, tokens: int, routing_input: S.RoutingInput = "hidden") -> GraphedMoE:
        """A CUDA graph of one call at `tokens` tokens, over static input/output tensors."""
        return GraphedMoE(self, tokens, routing_input)

    # ---- input checks -------------------------------------------------------------------------
    def check_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """`hidden` as [T, H] rows, refused in one line unless contiguous, of this layer's dtype and device, and
        within max_tokens."""
        H = self.spec.hidden_size
        if hidden.dim() not in (2, 3) or hidden.shape[-1] != H:
            raise MoeBuildError("hidden", f"shape {tuple(hidden.shape)}", f"[T, {H}] or [B, S, {H}]")
        if hidden.dtype != self.dtype or hidden.device != self.device or not hidden.is_contiguous():
            raise MoeBuildError("hidden", f"{hidden.dtype} on {hidden.device} (contiguous={hidden.is_contiguous()})",
                                f"contiguous {self.dtype} on {self.device}")
        x = hidden.view(-1, H)
        if x.shape[0] > self.max_tokens:
            raise MoeBuildError("tokens", f"{x.shape[0]} exceeds max_tokens={self.max_tokens}",
                                f"1..{self.max_tokens}")
        return x

    def bind_routing(self, b: Batch, logits: torch.Tensor | None, ids: torch.Tensor | None,
                     weights: torch.Tensor | None) -> None:
        """The caller's pinned routing, checked, into the call: top-k ids / weights copied into b's, or the
        router logits bound as b.logits (routing then runs on them); nothing where neither is given."""
        T, K, E = b.tokens, self.spec.top_k, self.spec.num_experts
        if (ids is None) != (weights is None):
            raise MoeBuildError("topk_ids", "topk_ids and topk_weights must be given together", "both or neither")
        if ids is not None:
            if logits is not None:
                raise MoeBuildError("router_logits", "give router_logits or topk_ids/topk_weights, not both",
                                    "one of them")
            for name, t in (("topk_ids", ids), ("topk_weights", weights)):
                if tuple(t.shape) != (T, K) or t.device != self.device:
                    raise MoeBuildError(name, f"shape {tuple(t.shape)} on {t.device}", f"[{T}, {K}] on {self.device}")
            b.topk_ids.copy_(ids)
            b.topk_weights.copy_(weights)
            return
        if logits is not None:
            if tuple(logits.shape) != (T, E) or logits.device != self.device or not logits.is_contiguous() \
                    or logits.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                raise MoeBuildError("router_logits", f"{tuple(logits.shape)} {logits.dtype} on {logits.device}",
                                    f"contiguous [{T}, {E}] fp32/fp16/bf16 on {self.device}")
            b.logits = logits


def _routing_input(logits: torch.Tensor | None, ids: torch.Tensor | None) -> S.RoutingInput:
    return "topk" if ids is not None else "logits" if logits is not None else "hidden"


def _call_plan(plan: Plan, tokens: int, routing_input: S.RoutingInput
               ) -> tuple[tuple[str, ...], tuple[object, object, dict[str, kernels.StepTactic]]]:
    """One call's steps and its tactics (_tactics), read off the plan's bands."""
    return tuple(S.kernel_sequence(plan, tokens, routing_input)), _tactics(plan.choices(tokens))


def _tactics(choices: Mapping[str, str]) -> tuple[object, object, dict[str, kernels.StepTactic]]:
    """The two GEMM tactics and the FP8 row steps' tactics (by stage, where the layer has the step) of one token
    count's choices, as the kernels take them."""
    steps = {stage: kernels.StepTactic[choices[stage].upper()] for stage in STEP_STAGES if choices[stage] != "none"}
    return kernels.tactic_struct(choices["gemm1_tactic"]), kernels.tactic_struct(choices["gemm2_tactic"]), steps


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous tensors share any byte."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def runner_layout(spec: MoESpec, plan: Plan, max_tokens: int) -> dict[str, BufferSpec]:
    """The runner's buffer layout for calls of up to `max_tokens` tokens, kernel scratch included."""
    steps = S.steps_up_to(plan, max_tokens)
    r, E = max_tokens * spec.top_k, spec.local_experts

    def both(size: Callable[[int, int, int, int], int]) -> int:
        """One scratch shared by GEMM1 and GEMM2: the larger of their sizes."""
        return max(size(E, r, spec.fc1_out_features, spec.hidden_size),
                   size(E, r, spec.hidden_size, spec.intermediate_size))

    if S.is_weight_only(plan) or S.is_w4afp8(plan):  # the decode and mma kernels take no scratch; the wgmma ones do
        dense = (both(kernels.grouped_gemm_sm90_workspace_bytes)
                 if steps & {S.GEMM1_WOQ_DENSE, S.GEMM2_WOQ_DENSE} else 0)
        mixed = (kernels.grouped_gemm_woq_sm90_workspace_bytes(E)
                 if steps & (S.GEMM1_WOQ_WGMMA_STEPS | S.GEMM2_WOQ_WGMMA_STEPS) else 0)
        gemm = max(dense, mixed)
    elif S.is_fp8(plan):
        gemm = both(kernels.grouped_gemm_fp8_workspace_bytes)
    elif plan.stage("gemm_kernel").choice == "tma_warp_specialized":
        gemm = both(kernels.grouped_gemm_sm90_workspace_bytes)
    else:
        gemm = kernels.grouped_gemm_sm80_workspace_bytes(E)
    three = kernels.three_step_workspace_bytes(max_tokens, spec.top_k, E) if steps & S.THREE_STEP_PROLOGUES else 0
    return workspace_layout(spec, steps, max_tokens, gemm_workspace_bytes=gemm, three_step_workspace_bytes=three)


def workspace_bytes(spec: MoESpec, plan: Plan, max_tokens: int) -> int:
    """Bytes of the flat workspace a call of up to `max_tokens` tokens needs (TensorRT's getWorkspaceSize)."""
    return layout_bytes(runner_layout(spec, plan, max_tokens))


def _to_device(weights: MoEWeights, device: torch.device, dtype: torch.dtype) -> MoEWeights:
    """Weights in the layer dtype on the device, contiguous, converted once."""
    return weights.to(device, dtype).contiguous()
