"""Load and run a built MoE engine from PyTorch.

Every refusal happens before deserialisation, with one line that says why: a tampered or
mismatched manifest (VerificationError), a flavour that is missing or of another version, no
CUDA device, or a GPU the engine cannot run on. Execution itself is a few TensorRT calls on
torch's current stream into a preallocated output (optionally replayed from a CUDA graph).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import MoeBuildError
from ..graph.ootb import INPUT_HIDDEN, INPUT_LOGITS, INPUT_TOPK_IDS, INPUT_TOPK_WEIGHTS, OUTPUT
from ..spec import MoESpec
from ..target import Flavour
from ..weights.dtypes import TORCH_DTYPE, TORCH_OUT_DTYPE
from .backend import Backend, load_backend
from .manifest import verify

# Compute capabilities the TensorRT-RTX 1.7 runtime runs on (ENVIRONMENT.md).
RTX_RUNTIME_SMS = (80, 86, 89, 120, 121)


def _cc(sm: int) -> str:
    return f"{sm // 10}.{sm % 10}"


def check_device(flavour: Flavour, engine_sm: int, device_sm: int | None) -> None:
    """Refuse, in one line, a device this engine cannot run on."""
    if device_sm is None:
        raise MoeBuildError("device", "no CUDA device is available; a TensorRT engine needs an NVIDIA GPU")
    if flavour is Flavour.TENSORRT_RTX and device_sm not in RTX_RUNTIME_SMS:
        raise MoeBuildError("device", f"TensorRT-RTX engines cannot run on compute capability {_cc(device_sm)} "
                            "(supported: 8.0, 8.6, 8.9, 12.x)")
    if device_sm != engine_sm:
        raise MoeBuildError("device", f"the engine was built for compute capability {_cc(engine_sm)}; "
                            f"this GPU is {_cc(device_sm)} (rebuild with --sm {device_sm})")


def detect_device_sm() -> int | None:
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def check_flavour(manifest: dict[str, Any]) -> Backend:
    """The installed flavour must be the one that built the engine, at the same version
    (TensorRT engines are not portable across versions)."""
    backend = load_backend(manifest["flavour"]["name"])
    if backend.version != manifest["flavour"]["version"]:
        raise MoeBuildError("flavour", f"engine built with {backend.flavour.value} {manifest['flavour']['version']}, "
                            f"installed is {backend.version}; rebuild the engine")
    return backend


def ensure_runnable_here(manifest: dict[str, Any],
                         detect: Callable[[], int | None] = detect_device_sm) -> tuple[Backend, int]:
    """Flavour, version and GPU checks, in that order; returns the backend and the device SM."""
    backend = check_flavour(manifest)
    sm = detect()
    check_device(backend.flavour, manifest["target"]["sm"], sm)
    assert sm is not None
    return backend, sm


def deserialize(backend: Backend, engine: bytes, plan_path: str = "ootb") -> Any:
    """The ICudaEngine; a plugin-path engine needs the MoE plugin's creator registered first, so
    TensorRT can rebuild the plugin layer from its serialized fields."""
    trt = backend.trt
    if plan_path == "plugin":
        from ..plugins.moe_plugin import register_moe_plugin
        register_moe_plugin(trt)
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    cuda_engine = runtime.deserialize_cuda_engine(engine)
    if cuda_engine is None:
        raise MoeBuildError("engine", "TensorRT could not deserialise the engine on this GPU")
    return cuda_engine


class Engine:
    """A deserialised MoE engine bound to one execution context.

    Outputs are written into a buffer preallocated for the profile's max tokens; a call returns
    a view of it, valid until the next call (clone it to keep it).
    """

    def __init__(self, manifest: dict[str, Any], context: Any, device: torch.device,
                 stream: Callable[[], int]):
        self.manifest = manifest
        self.spec = MoESpec.from_dict(manifest["spec"])
        self.context = context
        self.device = device
        self._stream = stream
        self.min_tokens, self.max_tokens = manifest["profile"]["min"], manifest["profile"]["max"]
        self.dtype = TORCH_DTYPE[self.spec.dtype]
        self.routing_input: str = manifest["graph"]["routing_input"]
        self._out = torch.empty(self.max_tokens, self.spec.hidden_size,
                                dtype=TORCH_OUT_DTYPE[self.spec.out_dtype], device=device)
        self._graphs: dict[int, tuple[Any, dict[str, torch.Tensor]]] = {}
        self._keep: tuple[Any, ...] = ()

    @classmethod
    def load(cls, path: str | Path) -> "Engine":
        """Verify, check flavour/version/GPU, then deserialise and create a context."""
        manifest, engine_bytes = verify(path)
        backend, _ = ensure_runnable_here(manifest)
        cuda_engine = deserialize(backend, engine_bytes, manifest["plan"]["path"])
        context = cuda_engine.create_execution_context()
        stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
        engine = cls(manifest, context, torch.device("cuda", torch.cuda.current_device()), stream)
        engine._keep = (cuda_engine,)  # the context needs its engine alive
        return engine

    def _inputs_spec(self) -> dict[str, tuple[int, torch.dtype]]:
        """Engine input name -> (width, dtype), from the routing input the engine was built with."""
        spec = self.spec
        inputs = {INPUT_HIDDEN: (spec.hidden_size, self.dtype)}
        if self.routing_input == "logits":
            inputs[INPUT_LOGITS] = (spec.num_experts, self.dtype)
        elif self.routing_input == "topk":
            inputs[INPUT_TOPK_IDS] = (spec.top_k, torch.int32)
            inputs[INPUT_TOPK_WEIGHTS] = (spec.top_k, torch.float32)
        return inputs

    def _check(self, name: str, t: torch.Tensor, width: int, dtype: torch.dtype, tokens: int) -> None:
        if t.dim() != 2 or t.shape[1] != width:
            raise MoeBuildError(name, f"shape {tuple(t.shape)}", f"[tokens, {width}]")
        if not self.min_tokens <= t.shape[0] <= self.max_tokens:
            raise MoeBuildError(name, f"{t.shape[0]} tokens is outside the engine's profile",
                                f"{self.min_tokens}..{self.max_tokens}")
        if t.shape[0] != tokens:
            raise MoeBuildError(name, f"{t.shape[0]} rows but hidden has {tokens}", f"{tokens} rows")
        if t.dtype != dtype or t.device != self.device or not t.is_contiguous():
            raise MoeBuildError(name, f"{t.dtype} on {t.device} (contiguous={t.is_contiguous()})",
                                f"contiguous {dtype} on {self.device}")

    def _bind(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Shapes and addresses for one call; returns the output view."""
        out = self._out[:inputs[INPUT_HIDDEN].shape[0]]
        for name, t in inputs.items():
            self.context.set_input_shape(name, tuple(t.shape))
            self.context.set_tensor_address(name, t.data_ptr())
        self.context.set_tensor_address(OUTPUT, out.data_ptr())
        return out

    def __call__(self, hidden: torch.Tensor, router_logits: torch.Tensor | None = None,
                 topk_ids: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
        """Run the layer on `hidden` [tokens, H] plus what the engine takes: nothing, router logits
        [tokens, E], or top-k ids [tokens, K] int32 and weights [tokens, K] fp32."""
        given = {INPUT_HIDDEN: hidden, INPUT_LOGITS: router_logits, INPUT_TOPK_IDS: topk_ids,
                 INPUT_TOPK_WEIGHTS: topk_weights}
        expected = self._inputs_spec()
        for name, t in given.items():
            if (t is None) == (name in expected):
                raise MoeBuildError(name, f"this engine (routing input {self.routing_input!r}) "
                                    + ("needs it" if t is None else "does not take it"),
                                    ", ".join(expected))
        inputs = {name: given[name] for name in expected}
        for name, (width, dtype) in expected.items():
            self._check(name, inputs[name], width, dtype, hidden.shape[0])
        graph = self._graphs.get(hidden.shape[0])
        if graph is not None:
            g, static = graph
            for name, t in inputs.items():
                static[name].copy_(t)
            g.replay()
            return self._out[:hidden.shape[0]]
        out = self._bind(inputs)
        if not self.context.execute_async_v3(self._stream()):
            raise MoeBuildError("engine", "TensorRT failed to enqueue the engine")
        return out

    def capture(self, tokens: int) -> None:
        """Record one CUDA graph for `tokens` tokens; later calls with that count replay it."""
        static = {name: torch.zeros(tokens, width, dtype=dtype, device=self.device)
                  for name, (width, dtype) in self._inputs_spec().items()}
        if INPUT_TOPK_IDS in static:  # valid expert ids: 0..top_k-1 on every row
            static[INPUT_TOPK_IDS].copy_(torch.arange(self.spec.top_k, device=self.device).expand(tokens, -1))
        self(*[static.get(n) for n in (INPUT_HIDDEN, INPUT_LOGITS, INPUT_TOPK_IDS, INPUT_TOPK_WEIGHTS)])  # warm-up
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._bind(static)
            self.context.execute_async_v3(self._stream())
        self._graphs[tokens] = (graph, static)
