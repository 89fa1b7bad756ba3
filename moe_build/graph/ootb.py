"""The MoE layer as standard ONNX ops (the 'ootb' path), exported from a small torch module.

Why a torch module: one readable definition of routing + experts that torch.onnx turns into
ops every TensorRT flavour parses (TopK, MatMul, NonZero, Gather, ScatterND, elementwise).

Graph contract (documented for the CLI and the runtime):
- input `hidden` [tokens, hidden_size] in the spec's dtype; `tokens` is dynamic. 2-D because
  the layer is token-wise: a caller with [batch, seq, H] flattens batch*seq into tokens.
- `routing_input` says what else the engine takes: "hidden" (nothing: logits are computed from
  the router weight), "logits" (`router_logits` [tokens, num_experts] in the spec's dtype), or
  "topk" (`topk_ids` [tokens, top_k] int32 and `topk_weights` [tokens, top_k] fp32, routing done
  by the caller).
- output `output` [tokens, hidden_size] in the spec's output dtype.
- expert parallelism (spec.ep_rank set): the graph of one rank routes over all num_experts (the router
  is whole) and computes only its local_experts experts (global ids first_local_expert ..); `output` is
  then that rank's partial sum (each token's weighted sum over its top-k experts that live on the rank,
  rank 0 also adding the shared experts), and the ranks' outputs add up to the layer's (dispatch
  `allreduce`: no collective is inside an engine).
- all weights are initializers in the spec's dtype (the DeepSeek correction bias stays fp32), except
  FP8 experts (quant fp8 / fp8_block): their W1 / W2 stay FP8 initializers with fp32 scales, read
  through DequantizeLinear, and each expert GEMM's input goes through Q/DQ (fp8_qdq.py; opset 21).

Routing (logits, softmax/sigmoid, top-k, group selection) runs in fp32 on the exact
spec-dtype values: rounding the logits to 16 bits would flip near-tied expert choices, which
no tolerance can absorb. Expert GEMMs run in the spec's dtype (FP8 experts: in fp32 on the
dequantized FP8 values, so the scales stay exact).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import warnings
from pathlib import Path
from typing import Iterator

import onnx
import torch
from torch import nn

from ..errors import MoeBuildError
from ..planner import Plan
from ..spec import Activation, MoESpec, RoutingMethod
from ..weights import MoEWeights
from ..weights.dtypes import TORCH_DTYPE, TORCH_OUT_DTYPE
from .fp8_qdq import FP8_ONNX_OPSET, TRANSLATIONS, Fp8Experts

EXPERT_COMPUTE_CHOICES = ("dense_masked", "per_expert_gather")
INPUT_HIDDEN, INPUT_LOGITS, OUTPUT = "hidden", "router_logits", "output"
INPUT_TOPK_IDS, INPUT_TOPK_WEIGHTS = "topk_ids", "topk_weights"
ROUTING_INPUTS = ("hidden", "logits", "topk")
ONNX_OPSET = 18
# Protobuf cannot hold more than 2 GiB; above this many weight bytes, tensors go to external data.
EXTERNAL_DATA_THRESHOLD = 1 << 30


def check_routing_input(routing_input: str) -> None:
    """Refuse a routing input the graph does not take."""
    if routing_input not in ROUTING_INPUTS:
        raise MoeBuildError("routing_input", f"unknown value {routing_input!r}", ROUTING_INPUTS)


def apply_activation(spec: MoESpec, h: torch.Tensor, inter: int) -> torch.Tensor:
    """FC1 output [..., N1] -> activated [..., I]; gated layouts put the gate rows first."""
    act = spec.activation
    if not act.is_gated:
        if act is Activation.SILU:
            return nn.functional.silu(h)
        if act is Activation.GELU:
            return nn.functional.gelu(h, approximate="tanh")
        if act is Activation.RELU:
            return torch.relu(h)
        return h
    gate, up = h[..., :inter], h[..., inter:]
    if act is Activation.SWIGLU:
        return nn.functional.silu(gate) * up
    if act is Activation.GEGLU:
        return nn.functional.gelu(gate, approximate="tanh") * up
    # GPT-OSS: gate clamped from above, up clamped both sides, gate*sigmoid(alpha*gate)*(up+1)
    gate = gate.clamp(max=spec.swiglu_limit)
    up = up.clamp(min=-spec.swiglu_limit, max=spec.swiglu_limit)
    return gate * torch.sigmoid(gate * spec.swiglu_alpha) * (up + 1)


def route_fp32(spec: MoESpec, logits: torch.Tensor,
               correction_bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 logits [T, E] -> (weights [T, k] fp32, expert ids [T, k] int64) per spec.routing."""
    r, k = spec.routing, spec.top_k
    if r.method is RoutingMethod.TOPK_SOFTMAX:
        top, ids = torch.topk(logits, k, dim=-1)
        weights = torch.softmax(top, dim=-1)
    else:
        softmax = r.method is RoutingMethod.SOFTMAX_TOPK
        scores = torch.softmax(logits, dim=-1) if softmax else torch.sigmoid(logits)
        # the correction bias steers which experts are chosen, never their weights
        choice = scores if correction_bias is None else scores + correction_bias
        if r.num_groups > 1:
            choice = _mask_to_top_groups(spec, choice, by_top2_sum=not softmax)
        _, ids = torch.topk(choice, k, dim=-1)
        weights = torch.gather(scores, 1, ids)
    if r.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * r.routed_scaling_factor, ids


def _mask_to_top_groups(spec: MoESpec, choice: torch.Tensor, by_top2_sum: bool) -> torch.Tensor:
    """Grouped top-k: only experts in each token's best `topk_groups` groups stay eligible (the
    rest become -inf). A group scores its best expert (DeepSeek-V2, softmax routing) or the
    sum of its best two (DeepSeek-V3, sigmoid routing; its best one if a group has one expert)."""
    r = spec.routing
    per_group = spec.num_experts // r.num_groups
    grouped = choice.reshape(-1, r.num_groups, per_group)
    best_n = min(2, per_group) if by_top2_sum else 1
    group_scores = torch.topk(grouped, best_n, dim=-1).values.sum(dim=-1)
    _, best = torch.topk(group_scores, r.topk_groups, dim=-1)
    keep = (best.unsqueeze(-1) == torch.arange(r.num_groups, device=choice.device)).any(dim=1)  # [T, G]
    keep = keep.unsqueeze(-1).expand(-1, -1, per_group).reshape(choice.shape)
    return choice.masked_fill(~keep, float("-inf"))


class MoELayerModule(nn.Module):
    """The layer as torch ops, written to export cleanly: static expert loop, no Python data
    dependence, dense routing matrix built with one-hot comparisons (no scatter)."""

    def __init__(self, spec: MoESpec, weights: MoEWeights, expert_compute: str, routing_input: str = "hidden"):
        super().__init__()
        check_routing_input(routing_input)
        if expert_compute not in EXPERT_COMPUTE_CHOICES:
            raise MoeBuildError("expert_compute", f"unknown choice {expert_compute!r}", EXPERT_COMPUTE_CHOICES)
        if spec.out_dtype not in TORCH_OUT_DTYPE:
            raise MoeBuildError("output_dtype", f"{spec.out_dtype.value} output is not built by the OOTB graph",
                                [d.value for d in TORCH_OUT_DTYPE])
        weights.check(spec)
        self.spec, self.expert_compute, self.routing_input = spec, expert_compute, routing_input
        # The experts whose weights are held (local index j is global expert first + j); a whole layer: all.
        self.first, self.count = spec.first_local_expert, spec.stored_experts
        # Each rank sees every token, so only one rank may add the shared experts for the sum to be the layer's.
        self.adds_shared = bool(spec.shared.count) and not spec.ep_rank
        self.dtype, self.out_dtype = TORCH_DTYPE[spec.dtype], TORCH_OUT_DTYPE[spec.out_dtype]
        cast = weights.to(dtype=self.dtype)
        self.fp8 = None if weights.fp8 is None else Fp8Experts(cast, per_expert=expert_compute == "per_expert_gather")
        # Matrices are stored [in, out] (transposed once here) so the graph has no Transpose nodes.
        for name in ("router_weight", "w1", "w2", "shared_w1", "shared_w2", "shared_gate",
                     "router_bias", "correction_bias", "b1", "b2"):
            t = None if self.fp8 is not None and name in ("w1", "w2") else getattr(cast, name)
            if name.startswith("shared_") and not self.adds_shared:
                t = None  # another rank adds the shared experts: this graph need not carry them
            if t is not None and name in ("router_weight", "w1", "w2", "shared_w1", "shared_w2", "shared_gate"):
                t = t.transpose(-1, -2)
            self.register_buffer(name, None if t is None else t.contiguous())

    def forward(self, hidden: torch.Tensor, routing_a: torch.Tensor | None = None,
                routing_b: torch.Tensor | None = None) -> torch.Tensor:
        """(routing_a, routing_b) are (None, None), (router_logits, None) or (topk_ids, topk_weights),
        per `routing_input` (fixed names rather than *args keep torch.export's dynamic shapes simple)."""
        spec = self.spec
        if self.routing_input == "topk":
            ids, weights = routing_a.long(), routing_b.float()
        else:
            if self.routing_input == "logits":
                logits = routing_a.float()
            else:
                logits = hidden.float() @ self.router_weight.float()
                if self.router_bias is not None:
                    logits = logits + self.router_bias.float()
            weights, ids = route_fp32(spec, logits, self.correction_bias)
        if self.expert_compute == "dense_masked":
            out = self._dense_masked(hidden, weights, ids)
        else:
            out = self._per_expert_gather(hidden, weights, ids)
        if self.adds_shared:
            out = out + self._shared(hidden).float()
        return out.to(self.out_dtype)

    def _weight(self, name: str, e: int | None = None) -> torch.Tensor:
        """W1 / W2 [in, out] of held expert e (a local index), or all held [count, in, out]: FP8 ones
        dequantized in fp32."""
        if self.fp8 is not None:
            return self.fp8.weight(name, e)
        w = getattr(self, name)
        return w if e is None else w[e]

    def _gemm_input(self, x: torch.Tensor, gemm: int) -> torch.Tensor:
        """GEMM `gemm`'s (1 or 2) input as it sees it: x itself, or FP8-quantized and back in fp32."""
        return x if self.fp8 is None else self.fp8.quantize_input(x, gemm)

    def _expert_mlp(self, x: torch.Tensor, e: int) -> torch.Tensor:
        """Held expert e (a local index) on rows x that are already GEMM1's input (`_gemm_input(., 1)`)."""
        h = x @ self._weight("w1", e)
        if self.b1 is not None:
            h = h + self.b1[e].to(h.dtype)
        act = apply_activation(self.spec, h, self.spec.intermediate_size)
        y = self._gemm_input(act, 2) @ self._weight("w2", e)
        return y + self.b2[e].to(y.dtype) if self.b2 is not None else y

    def _dense_masked(self, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Every held expert on every token; the [T, count] routing matrix (columns: the held experts' global
        ids) is zero off the top-k, so a token's experts on other ranks add nothing here."""
        experts = torch.arange(self.first, self.first + self.count, device=hidden.device)
        onehot = (ids.unsqueeze(-1) == experts).to(weights.dtype)                 # [T, k, count]
        dense = (onehot * weights.unsqueeze(-1)).sum(dim=1)                       # [T, count] fp32
        h = torch.matmul(self._gemm_input(hidden, 1).unsqueeze(0), self._weight("w1"))  # [E, T, N1]
        if self.b1 is not None:
            h = h + self.b1.unsqueeze(1).to(h.dtype)
        act = apply_activation(self.spec, h, self.spec.intermediate_size)
        y = torch.matmul(self._gemm_input(act, 2), self._weight("w2"))
        if self.b2 is not None:
            y = y + self.b2.unsqueeze(1).to(y.dtype)                              # [E, T, H]
        # Weighted reduction in fp32: more accurate, and it keeps the final cast to the output dtype
        # a real node (a no-op cast of an already-16-bit sum is dropped by the exporter, leaving fp32).
        return (y.float() * dense.t().unsqueeze(-1)).sum(dim=0)

    def _per_expert_gather(self, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Per held expert: gather the tokens that chose it (by its global id), run its MLP, add back in
        place. A token picks an expert at most once, so each update writes distinct rows (no scatter reduction)."""
        out = torch.zeros_like(hidden, dtype=torch.float32)
        x = self._gemm_input(hidden, 1)  # quantized once per token, as each row feeds several experts
        for j in range(self.count):
            chosen = ids == self.first + j                                        # [T, k]
            tokens = torch.nonzero(chosen.any(dim=-1)).squeeze(-1)               # [n_e]
            w = (weights * chosen.to(weights.dtype)).sum(dim=-1)[tokens]          # [n_e]
            y = self._expert_mlp(x[tokens], j).float() * w.unsqueeze(-1)
            out = out.index_put((tokens,), out[tokens] + y)
        return out

    def _shared(self, hidden: torch.Tensor) -> torch.Tensor:
        h = apply_activation(self.spec, hidden @ self.shared_w1, self.spec.shared.intermediate_size)
        y = h @ self.shared_w2
        if self.shared_gate is not None:
            y = y * torch.sigmoid(hidden.float() @ self.shared_gate.float()).to(self.dtype)
        return y


def expert_compute_choice(plan: Plan) -> str:
    """The plan's OOTB expert-compute choice; the graph obeys it and never re-decides."""
    if plan.path != "ootb":
        raise MoeBuildError("path", f"the ONNX graph implements the ootb path, the plan chose {plan.path!r}", ["ootb"])
    return plan.stage("expert_compute").choice


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's chatter (torchvision op registration, deprecation notices) that
    says nothing about this graph; real export errors still raise."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", (FutureWarning, UserWarning, DeprecationWarning))
            yield
    finally:
        logger.setLevel(level)


def export_onnx(spec: MoESpec, weights: MoEWeights, plan: Plan, path: str | os.PathLike[str],
                routing_input: str = "hidden") -> Path:
    """Export the layer to `path` (dynamic tokens, opset 18; 21 with FP8 experts) and check it with onnx.checker.

    Weights above EXTERNAL_DATA_THRESHOLD bytes go to `<path>.data` next to it, because a
    protobuf cannot exceed 2 GiB (Mixtral-sized layers need this).
    """
    path = Path(path)
    module = MoELayerModule(spec, weights, expert_compute_choice(plan), routing_input).eval()
    dtype = TORCH_DTYPE[spec.dtype]
    tokens = torch.export.Dim("tokens", min=1, max=1 << 20)
    example_t = 4
    args: tuple[torch.Tensor, ...] = (torch.randn(example_t, spec.hidden_size, dtype=dtype),)
    names = [INPUT_HIDDEN]
    if routing_input == "logits":
        args += (torch.randn(example_t, spec.num_experts, dtype=dtype),)
        names.append(INPUT_LOGITS)
    elif routing_input == "topk":
        ids = torch.stack([torch.randperm(spec.num_experts)[: spec.top_k] for _ in range(example_t)]).int()
        args += (ids, torch.rand(example_t, spec.top_k))
        names += [INPUT_TOPK_IDS, INPUT_TOPK_WEIGHTS]
    dynamic = tuple({0: tokens} for _ in args)  # every input's first dim is the token count
    with torch.no_grad(), _quiet_exporter():
        program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=dynamic, input_names=names,
                                    output_names=[OUTPUT], optimize=True, verbose=False,
                                    opset_version=ONNX_OPSET if weights.fp8 is None else FP8_ONNX_OPSET,
                                    custom_translation_table=None if weights.fp8 is None else TRANSLATIONS)
    weight_bytes = sum(t.numel() for _, t in weights.named()) * spec.dtype.itemsize
    external = weight_bytes > EXTERNAL_DATA_THRESHOLD
    path.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(path), external_data=external)
    onnx.checker.check_model(str(path) if external else onnx.load(str(path)), full_check=not external)
    return path


def onnx_sha256(path: str | os.PathLike[str]) -> str:
    """Hash of the ONNX file plus the external data files it references: what the engine was built from."""
    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    locations = sorted({entry.value for init in model.graph.initializer for entry in init.external_data
                        if entry.key == "location"})
    h = hashlib.sha256()
    for p in (path, *(path.parent / loc for loc in locations)):
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def weights_sha256(weights: MoEWeights) -> str:
    """Hash of the canonical weight tensors (name, dtype, shape, bytes), for the manifest."""
    h = hashlib.sha256()
    for name, t in weights.named():
        t = t.detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
