"""`moe-build check`: one MoE layer's ONNX graph against the checkpoint's own transformers MoE block.

Why it is not circular: the graph comes from moe-build's reading of the checkpoint (config parser,
loader, graph); the expected output from transformers' reading of the same files: the model class
its config names, built on the meta device (nothing allocated), then only the layer's MoE block
filled from the safetensors through the machinery of `from_pretrained` (the family's key renames and
weight conversions, and its quantizer where the config names one), run with its eager experts. The
two share the files and the random hidden states, nothing else. A changed file changes both sides
alike (the manifest's sha256 is what catches that); a graph exported earlier (`--onnx`) is checked
against the files as they are now.

What runs: the graph in fp32 (or the `--onnx` graph's dtype) with onnxruntime's CPU provider, and
the block in fp32 on the checkpoint's exact weight values, both through Polygraphy's Comparator.
Expert choices: a token whose top-k is within round-off of a tie may pick different experts on the two
sides, which no tolerance absorbs. A token is near-tied when its fp64 choice changes under random
perturbations of its router logits of NEAR_TIE (relative to its largest logit), a margin far above
the graph's round-off; near-tied tokens are left out. A token that picks different experts without
a near-tie is a routing mismatch and fails the check. The remaining tokens are compared element-wise.
"""
from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
from polygraphy.common import TensorMetadata
from polygraphy.comparator import Comparator, SimpleCompareFunc
from polygraphy.logger import G_LOGGER

from .errors import MoeBuildError
from .spec import DType, MoESpec, Quant
from .weights import MoEWeights

SCHEMA = "moe-build.check/1"
MAX_TOKENS = 1 << 16
# What the graph runs in -> default rtol (an element fails when it exceeds both rtol * |expected| and
# atol, which defaults to rtol * the RMS of the expected output), and the near-tie margin.
DEFAULT_RTOL = {DType.FP32: 1e-4, DType.FP16: 1e-2}
NEAR_TIE = {DType.FP32: 1e-5, DType.FP16: 3e-3}
TIE_TRIALS = 16
# Modules beside the MoE block that transformers' decoder layer adds to its output (Granite's shared MLP).
LAYER_LEVEL_PARTS = ("shared_mlp",)
Log = Callable[[str], None]


@dataclass(frozen=True)
class CheckResult:
    checkpoint: str
    layer: int
    family: str
    tokens: int
    seed: int
    graph: str                      # what ran on onnxruntime
    graph_dtype: str
    reference: str                  # transformers' class and block path
    rtol: float
    atol: float
    tokens_compared: int
    tokens_near_tied: int
    tokens_with_different_experts: int | None  # None: the block's experts call shows no top-k ids
    max_abs: float | None
    max_rel: float | None
    rel_norm: float | None
    failure: str | None             # why the check failed; None when it passed

    @property
    def passed(self) -> bool:
        return self.failure is None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        tolerance = {"rtol": d.pop("rtol"), "atol": d.pop("atol"),
                     "rule": "element-wise: an element fails when |got - want| > atol and > rtol * |want|"}
        return {"schema": SCHEMA, **d, "tolerance": tolerance, "passed": self.passed}


def render(r: CheckResult) -> str:
    """The result as the lines `moe-build check` prints."""
    differ = "the block's experts call shows no top-k ids" if r.tokens_with_different_experts is None \
        else f"{r.tokens_with_different_experts} picked different experts on the two sides"
    lines = [f"checkpoint: {r.checkpoint}, layer {r.layer} ({r.family}); {r.tokens} random tokens, seed {r.seed}",
             f"graph:      {r.graph}, {r.graph_dtype}, onnxruntime CPU",
             f"reference:  transformers {r.reference}, fp32, eager experts",
             f"tokens:     {r.tokens_compared} of {r.tokens} compared; {r.tokens_near_tied} near an expert tie left "
             f"out; {differ}"]
    if r.max_abs is not None:
        lines.append(f"error:      max abs {r.max_abs:.3e}, max rel {r.max_rel:.3e}, rel-norm {r.rel_norm:.3e}")
    lines.append(f"tolerance:  rtol {r.rtol:.1e}, atol {r.atol:.3e} (an element fails past both)")
    lines.append("PASSED" if r.passed else f"FAILED: {r.failure}")
    return "\n".join(lines)


# ---- transformers' block --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' loading bar and warnings say nothing about one block (the rest of the model stays empty)."""
    from transformers.utils import logging as hf_logging
    level, bars_on = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars_on:
            hf_logging.enable_progress_bar()


def _model_class(config: Any) -> type:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    for name in config.architectures or []:
        if hasattr(transformers, name):
            return getattr(transformers, name)
    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        raise MoeBuildError("checkpoint", f"transformers has no model class for {config.model_type!r} "
                            f"(config architectures: {config.architectures})") from None


def _find_block(model: torch.nn.Module, layer: int) -> tuple[str, str]:
    """(decoder layer path, MoE block path) of decoder layer `layer`: the parent of the module named
    `experts` under a layer list's entry `layer`, found in the model rather than assumed per family."""
    found = set()
    for name, _ in model.named_modules():
        parts = name.split(".")
        numbers = [i for i, p in enumerate(parts) if p.isdigit()]
        if parts[-1] == "experts" and numbers and int(parts[numbers[-1]]) == layer:
            found.add((".".join(parts[:numbers[-1] + 1]), ".".join(parts[:-1])))
    if len(found) != 1:
        raise MoeBuildError("layer", f"transformers' model has {len(found)} MoE blocks at decoder layer {layer} "
                            f"({sorted(b for _, b in found)}), one expected")
    return found.pop()


@dataclass
class TransformersBlock:
    """The decoder layer's MoE part as transformers computes it: the block, plus LAYER_LEVEL_PARTS."""

    description: str
    modules: list[torch.nn.Module]

    def __call__(self, x: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Output [T, H] for x [T, H], and the top-k expert ids its experts module was called with."""
        seen: dict[str, torch.Tensor] = {}

        def grab(_: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            for a in (*args[1:], *kwargs.values()):
                if isinstance(a, torch.Tensor) and a.dtype in (torch.int32, torch.int64) and a.shape[-1] == top_k:
                    seen["ids"] = a.reshape(-1, top_k)
                    return

        hook = self.modules[0].get_submodule("experts").register_forward_pre_hook(grab, with_kwargs=True)
        try:
            with torch.no_grad():
                outs = [m(x[None]) for m in self.modules]
        finally:
            hook.remove()
        out = sum((o[0] if isinstance(o, tuple) else o) for o in outs)
        return out.reshape(x.shape), seen.get("ids")


def _dequantizing(config: Any) -> Any:
    """For a checkpoint whose config names a quantization method: that method's config asking transformers to
    dequantize while loading (what it does on a machine without the quantized kernels), or a refusal where the
    method cannot. None for an unquantized checkpoint."""
    from transformers.quantizers.auto import AutoQuantizationConfig
    stored = getattr(config, "quantization_config", None) or \
        getattr(config.get_text_config(decoder=True), "quantization_config", None)
    if stored is None:
        return None
    quant = AutoQuantizationConfig.from_dict(stored if isinstance(stored, dict) else stored.to_dict())
    if "dequantize" not in getattr(quant, "get_loading_attributes", dict)():
        raise MoeBuildError("checkpoint", f"its {quant.quant_method} weights cannot be dequantized by transformers "
                            "on the CPU, which the check runs on",
                            "unquantized, FP8, compressed-tensors int or MXFP4 checkpoints")
    quant.dequantize = True
    return quant


@dataclass
class TransformersBlockSource:
    """Decoder layer `layer`'s MoE part in transformers' model for the checkpoint, before any weight is read:
    the model built on the meta device, the block found in it, the checkpoint tensors that transformers' key
    conversions map into it. `load` then reads those and nothing else."""

    model: Any
    parts: list[str]        # the block, then LAYER_LEVEL_PARTS the decoder layer has
    wanted: dict[str, Path]  # checkpoint tensor -> shard
    load_config: Any

    @classmethod
    def prepare(cls, folder: Path, layer: int) -> "TransformersBlockSource":
        try:
            import transformers
        except ImportError:
            raise MoeBuildError("check", "needs transformers 5.x to run the checkpoint's own block",
                                "pip install 'moe-build[check]'") from None
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
        from transformers.modeling_utils import LoadStateDictConfig
        from transformers.quantizers.auto import get_hf_quantizer
        from transformers.utils.generic import ContextManagers

        from .weights.checkpoint import checkpoint_shards
        try:
            config = transformers.AutoConfig.from_pretrained(folder)
            model_class = _model_class(config)
            quantizer, config, _ = get_hf_quantizer(config, _dequantizing(config), None, True, {})
        except (ValueError, KeyError, OSError, ImportError) as exc:
            raise MoeBuildError("checkpoint", f"transformers {transformers.__version__} cannot load it: "
                                f"{str(exc).splitlines()[0]}") from None
        config._experts_implementation = "eager"  # transformers' reference implementation, on every sub-config
        with ContextManagers(model_class.get_init_context(torch.float32, quantizer is not None, False, False)):
            model = model_class(config)
            if quantizer is not None:
                quantizer.preprocess_model(model=model, dtype=torch.float32, device_map=None, use_kernels=False)
        layer_path, block_path = _find_block(model, layer)
        decoder_layer = model.get_submodule(layer_path)
        parts = [block_path] + [f"{layer_path}.{p}" for p in LAYER_LEVEL_PARTS
                                if hasattr(decoder_layer, p) and f"{layer_path}.{p}" != block_path]
        mapping = get_model_conversion_mapping(model, None, quantizer)
        renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in mapping if isinstance(m, WeightConverter)]
        in_memory, prefixes = model.state_dict(), tuple(p + "." for p in parts)
        wanted = {k: shard for k, shard in checkpoint_shards(folder).items()
                  if rename_source_key(k, renamings, converters, model.base_model_prefix, in_memory)[0]
                  .startswith(prefixes)}
        return cls(model, parts, wanted,
                   LoadStateDictConfig(dtype=torch.float32, hf_quantizer=quantizer, weight_mapping=mapping))

    def load(self) -> TransformersBlock:
        """Fill the block from the checkpoint through transformers' `convert_and_load_state_dict_in_model` (what
        `from_pretrained` runs), given only the block's tensors; refused if any of its tensors stays empty."""
        from safetensors import safe_open
        from transformers.core_model_loading import convert_and_load_state_dict_in_model
        with contextlib.ExitStack() as stack:
            shards = {s: stack.enter_context(safe_open(str(s), framework="pt")) for s in set(self.wanted.values())}
            tensors = {k: shards[s].get_slice(k) for k, s in self.wanted.items()}
            info, _ = convert_and_load_state_dict_in_model(self.model, tensors, self.load_config)
        modules = [self.model.get_submodule(p) for p in self.parts]
        empty = [f"{p}.{n}" for p, m in zip(self.parts, modules)
                 for n, t in [*m.named_parameters(), *m.named_buffers()] if t.is_meta]
        if info.conversion_errors or empty:
            why = next(iter(info.conversion_errors.values()), None) or "no checkpoint tensor maps to it"
            lines = [line.strip() for line in str(why).splitlines() if line.strip()]
            raise MoeBuildError("checkpoint", f"transformers did not load {(empty or list(info.conversion_errors))[0]}"
                                f" from the checkpoint ({lines[-1] if lines else why})")  # a traceback's last line
        # in fp32 throughout: a quantizer may dequantize into the checkpoint's 16-bit dtype (exact in fp32)
        return TransformersBlock(f"{type(self.model).__name__} {' + '.join(self.parts)}",
                                 [m.float().eval() for m in modules])


class TransformersRunner(BaseRunner):
    """transformers' block as a Polygraphy runner. It loads the block when it activates, after the graph's
    session is gone, so that one copy of the layer's weights is in memory at a time; it keeps the expert
    ids the block picked."""

    def __init__(self, source: TransformersBlockSource, spec: MoESpec, dtype: torch.dtype, log: Log):
        super().__init__(name="transformers")
        self.source, self.spec, self.dtype, self.log = source, spec, dtype, log
        self.description = ""
        self.ids: torch.Tensor | None = None

    def activate_impl(self) -> None:
        self.log(f"loading transformers' block ({len(self.source.wanted)} tensors)")
        with _quiet_transformers():
            self.block = self.source.load()
        self.description = self.block.description
        self.log(f"running transformers' block ({self.description})")

    def get_input_metadata_impl(self) -> TensorMetadata:
        return TensorMetadata().add("hidden", self.dtype, (None, self.spec.hidden_size))

    def infer_impl(self, feed_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        start = time.perf_counter()
        out, self.ids = self.block(torch.as_tensor(feed_dict["hidden"]).float(), self.spec.top_k)
        self.inference_time = time.perf_counter() - start
        return {"output": out}

    def deactivate_impl(self) -> None:
        del self.block


# ---- expert choices -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Router:
    """What the expert choices need of the loaded layer (its experts are not kept past the export)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    correction_bias: torch.Tensor | None

    def logits(self, hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """hidden and router rounded to `dtype`, the product in fp32 (or fp64 for fp64)."""
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        logits = hidden.to(dtype).to(compute) @ self.weight.to(dtype).to(compute).t()
        return logits if self.bias is None else logits + self.bias.to(dtype).to(compute)


def _sorted_choice(ids: torch.Tensor) -> torch.Tensor:
    return ids.long().sort(dim=-1).values


def graph_choices(spec: MoESpec, router: Router, hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[T, k] sorted: the experts the graph picks, by its own routing function (graph/ootb.route_fp32) on
    fp32 logits of the `dtype`-rounded hidden states and router, as the exported module computes them."""
    from .graph.ootb import route_fp32
    correction = None if router.correction_bias is None else router.correction_bias.float()
    return _sorted_choice(route_fp32(spec, router.logits(hidden, dtype), correction)[1])


def near_tied(spec: MoESpec, router: Router, hidden: torch.Tensor, margin: float, seed: int) -> torch.Tensor:
    """[T] bool: tokens whose fp64 expert choice changes when their logits move by `margin` x their
    largest |logit| in random directions (TIE_TRIALS of them, seeded)."""
    from .reference import route
    correction = None if router.correction_bias is None else router.correction_bias.double()
    logits = router.logits(hidden, torch.float64)
    base = _sorted_choice(route(spec, logits, correction)[0])
    scale = margin * logits.abs().amax(dim=-1, keepdim=True)
    g = torch.Generator().manual_seed(seed)
    tied = torch.zeros(len(logits), dtype=torch.bool)
    for _ in range(TIE_TRIALS):
        moved = logits + scale * torch.randn(logits.shape, generator=g, dtype=torch.float64)
        tied |= (_sorted_choice(route(spec, moved, correction)[0]) != base).any(dim=-1)
    return tied


# ---- the graph ------------------------------------------------------------------------------------------------------

_ONNX_DTYPES = {1: DType.FP32, 10: DType.FP16}  # onnx.TensorProto FLOAT, FLOAT16


def given_graph_dtype(path: Path, spec: MoESpec) -> DType:
    """The dtype of a graph given with --onnx, refused unless it takes only `hidden` [tokens, H] in fp32 or
    fp16 (onnxruntime's CPU provider runs no bf16 MatMul)."""
    import onnx
    from google.protobuf.message import DecodeError
    if not path.is_file():
        raise MoeBuildError("onnx", f"{path} is not a file", "an ONNX graph written by `moe-build export`")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (OSError, DecodeError) as exc:
        raise MoeBuildError("onnx", f"cannot read {path}: {str(exc).splitlines()[0] if str(exc) else 'not ONNX'}",
                            "an ONNX file") from None
    names = [i.name for i in model.graph.input]
    if names != ["hidden"]:
        raise MoeBuildError("onnx", f"{path} takes {names}; check feeds hidden states only",
                            "a graph exported with --routing-input hidden")
    tensor = model.graph.input[0].type.tensor_type
    dims = [d.dim_value for d in tensor.shape.dim]
    if len(dims) != 2 or dims[1] != spec.hidden_size:
        raise MoeBuildError("onnx", f"{path} takes hidden of shape {dims}; the layer's hidden size is "
                            f"{spec.hidden_size}", f"[tokens, {spec.hidden_size}]")
    if tensor.elem_type not in _ONNX_DTYPES:
        raise MoeBuildError("onnx", f"{path} takes {onnx.TensorProto.DataType.Name(tensor.elem_type)} hidden states, "
                            "which onnxruntime's CPU provider cannot run through this graph",
                            [d.value for d in _ONNX_DTYPES.values()])
    return _ONNX_DTYPES[tensor.elem_type]


def _export_fp32(spec: MoESpec, weights: MoEWeights, folder: Path, log: Log) -> tuple[Path, str]:
    """The layer's graph in fp32 (what the build exports, less the casts of a 16-bit engine). A quantized layer
    becomes the dense layer its stored weights mean, experts dequantized exactly (AWQ pre-quant scales folded in,
    MoEWeights.for_spec), since transformers' dequantizing load, the other side, computes that layer; what the
    FP8 activation quantization adds is checked by the tests against the fp64 reference, not here. W4AFP8's FP8
    activations are part of its format's meaning, which a dense graph cannot express.
    The dequantized experts are rounded as transformers rounds them: FP8 ones not at all (its compressed-tensors
    integration multiplies them out in fp32, integrations/compressed_tensors.py, CompressedTensorsDequantize), packed
    weight-only ones to the model's 16-bit dtype (compressed-tensors' decompressor multiplies in the dtype of the
    stored scales, which it writes in the model's); MXFP4 values are exact in either."""
    from .graph.ootb import export_onnx
    from .planner import make_plan
    from .target import DEFAULT_SM_WITHOUT_GPU, Flavour, MoePlugin, Target
    if spec.quant is Quant.W4AFP8:
        raise MoeBuildError("checkpoint", "w4afp8 quantizes the experts' inputs to FP8, which the check's fp32 graph "
                            "does not express", "unquantized, FP8, w4a16_awq, w8a16 or wfp4a16 checkpoints")
    spec32 = dataclasses.replace(spec, dtype=DType.FP32, output_dtype=None, quant=Quant.NONE)
    rounded = spec if weights.woq is not None else spec32
    weights = weights.for_spec(dataclasses.replace(rounded, quant=Quant.NONE)).to(dtype=torch.float32)
    plan = make_plan(spec32, Target(sm=DEFAULT_SM_WITHOUT_GPU, flavour=Flavour.TENSORRT, moe_plugin=MoePlugin.DISABLE))
    choice = plan.stage("expert_compute").choice
    log(f"exporting the layer's ONNX graph in fp32 (expert_compute={choice})")
    return export_onnx(spec32, weights, plan, folder / "layer.onnx"), f"moe-build's OOTB graph, expert_compute={choice}"


# ---- the check ------------------------------------------------------------------------------------------------------

def _refuse_bad_numbers(tokens: int, rtol: float | None, atol: float | None) -> None:
    if not 1 <= tokens <= MAX_TOKENS:
        raise MoeBuildError("tokens", f"must be from 1 to {MAX_TOKENS}, got {tokens}", f"1..{MAX_TOKENS}")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not value >= 0:
            raise MoeBuildError(name, f"must be a number >= 0, got {value}", "numbers >= 0")


def _refuse_partial_fp8_blocks(spec: MoESpec) -> None:
    """Block-128 FP8 experts whose hidden or intermediate size is not a multiple of 128 end in partial blocks, which
    transformers' dequantization gets wrong: it takes each block's size as the matrix's over the scale grid's
    (integrations/finegrained_fp8.py, Fp8Dequantize._dequantize_one), 96 columns for 192, where the format's block
    is 128 (DeepSeek-V3's weight_block_size, moe_build/weights/fp8.py). The check would report that as moe-build's
    error; the released models' sizes are multiples of 128."""
    from .weights.fp8 import FP8_GROUP
    if spec.quant is Quant.FP8_BLOCK and (spec.hidden_size % FP8_GROUP or spec.intermediate_size % FP8_GROUP):
        raise MoeBuildError("checkpoint", f"block-128 FP8 with hidden {spec.hidden_size} and intermediate "
                            f"{spec.intermediate_size}: transformers dequantizes the partial blocks of such sizes "
                            "wrongly (its block is rows over scale rows), so it is no reference for them",
                            "block-128 FP8 checkpoints whose sizes are multiples of 128")


def check_layer(checkpoint: str, layer: int | None = None, tokens: int = 64, seed: int = 0,
                rtol: float | None = None, atol: float | None = None, onnx: str | None = None,
                log: Log = lambda line: None) -> CheckResult:
    """Run the check (module docstring). Refusals that need no weights (MoeBuildError) come before any is read."""
    from .weights.dtypes import TORCH_DTYPE
    from .spec.hf_config import select_moe_layers
    from .spec.source import resolve_spec
    from .weights.checkpoint import load_moe_layer

    _refuse_bad_numbers(tokens, rtol, atol)
    folder = Path(checkpoint)
    spec = resolve_spec(folder)
    _refuse_partial_fp8_blocks(spec)
    layer = select_moe_layers(folder, layer, all_layers=False)[0]
    dtype = DType.FP32 if onnx is None else given_graph_dtype(Path(onnx), spec)
    rtol = DEFAULT_RTOL[dtype] if rtol is None else rtol
    hidden = torch.randn(tokens, spec.hidden_size, generator=torch.Generator().manual_seed(seed))
    hidden = hidden.to(TORCH_DTYPE[dtype])

    with _quiet_transformers():
        source = TransformersBlockSource.prepare(folder, layer)
    log(f"loading layer {layer} with moe-build's loader")
    loaded = load_moe_layer(folder, layer)
    w = loaded.weights
    router = Router(w.router_weight, w.router_bias, w.correction_bias)
    transformers_runner = TransformersRunner(source, spec, hidden.dtype, log)
    with tempfile.TemporaryDirectory(prefix="moe-build-check-") as scratch:
        graph, description = (Path(onnx), onnx) if onnx is not None else _export_fp32(spec, w, Path(scratch), log)
        del loaded, w  # the graph and, later, transformers' block hold the weights
        log(f"running the graph (onnxruntime, CPU, {tokens} tokens)")
        onnxrt = OnnxrtRunner(SessionFromOnnx(str(graph), providers=["CPUExecutionProvider"]), name="onnxruntime")
        with G_LOGGER.verbosity(G_LOGGER.ERROR):
            results = Comparator.run([onnxrt, transformers_runner], data_loader=[{"hidden": hidden}])

    tied = near_tied(spec, router, hidden.float(), NEAR_TIE[dtype], seed + 1)
    ids = transformers_runner.ids
    differ = None if ids is None else \
        (graph_choices(spec, router, hidden, TORCH_DTYPE[dtype]) != _sorted_choice(ids)).any(dim=-1)
    keep = ~tied if differ is None else ~tied & ~differ
    comparison = _compare(results, keep, rtol, atol)
    failure = comparison.pop("failure")
    mismatched = 0 if differ is None else int((differ & ~tied).sum())
    if mismatched:
        failure = f"{mismatched} token(s) picked different experts with no near-tie: the two route differently"
    return CheckResult(checkpoint=str(checkpoint), layer=layer, family=spec.family, tokens=tokens, seed=seed,
                       graph=description, graph_dtype=dtype.value, reference=transformers_runner.description,
                       rtol=rtol, tokens_compared=int(keep.sum()), tokens_near_tied=int(tied.sum()),
                       tokens_with_different_experts=None if differ is None else int(differ.sum()),
                       failure=failure, **comparison)


def _compare(results: Any, keep: torch.Tensor, rtol: float, atol: float | None) -> dict[str, Any]:
    """Polygraphy's element-wise comparison of the kept tokens' rows (graph against transformers):
    atol, max_abs, max_rel, rel_norm and the failure, if any."""
    got, want = (torch.as_tensor(results[name][0]["output"]).double()[keep] for name in ("onnxruntime", "transformers"))
    if atol is None:
        atol = rtol * float(want.pow(2).mean().sqrt()) if len(want) else 0.0
    if not len(want):
        return dict(atol=atol, max_abs=None, max_rel=None, rel_norm=None,
                    failure="no token left to compare: every token is near-tied")
    for name, rows in (("onnxruntime", got), ("transformers", want)):
        results[name][0]["output"] = rows
    with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
        accuracy = Comparator.compare_accuracy(
            results, compare_func=SimpleCompareFunc(check_error_stat="elemwise", rtol=rtol, atol=atol))
    (per_func,) = accuracy  # one AccuracyResult per compare function
    stats = per_func[("onnxruntime", "transformers")][0]["output"]
    failure = None if bool(stats) else \
        f"outside the tolerance (max abs error {stats.max_absdiff:.3e}, max rel error {stats.max_reldiff:.3e})"
    return dict(atol=atol, max_abs=stats.max_absdiff, max_rel=stats.max_reldiff,
                rel_norm=float((got - want).norm() / want.norm()), failure=failure)
