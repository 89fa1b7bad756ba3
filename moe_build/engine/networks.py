"""Network loaders in Polygraphy's style: lazy steps that return (builder, network[, keep-alive]).

- OOTB: `ExportOnnx` (the graph of graph/ootb.py, written when first needed) feeds Polygraphy's
  `NetworkFromOnnxPath` with the strongly typed flag: the types come from the ONNX graph.
- plugin: `MoePluginNetwork` takes a `CreateNetwork`-style loader and adds the `hidden` and
  `router_logits` inputs and the MoE plugin layer. Its third value holds the plugin object and
  the host copies of the weights, which TensorRT reads only when it builds: Polygraphy's
  `EngineBytesFromNetwork` keeps a network loader's whole return value (where a parser would
  be) until the engine is serialized, so they live exactly as long as they must.
- `RecordNetwork` passes either through and notes what the manifest says about the network
  (I/O and layers) in a `NetworkRecord`, since the built network is not returned by the builder.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from polygraphy import util
from polygraphy.backend.base import BaseLoader

from ..graph.ootb import INPUT_HIDDEN, INPUT_LOGITS, OUTPUT, export_onnx
from ..planner import Plan
from ..spec import MoESpec
from ..weights import MoEWeights
from .manifest import describe_network
from .progress import BuildProgress

NetworkLoader = Callable[[], tuple[Any, ...]]


class ExportOnnx(BaseLoader):
    """Export the OOTB graph to `path` and return the path (a Polygraphy `path` argument)."""

    def __init__(self, spec: MoESpec, weights: MoEWeights, plan: Plan, path: Path, routing_input: str,
                 progress: BuildProgress):
        self._spec, self._weights, self._plan, self._path = spec, weights, plan, path
        self._routing_input, self._progress = routing_input, progress

    def call_impl(self) -> str:
        self._progress.begin("exporting ONNX")
        return str(export_onnx(self._spec, self._weights, self._plan, self._path, self._routing_input))


class MoePluginNetwork(BaseLoader):
    """(builder, network, keep-alive): `hidden` [T, H] and `router_logits` [T, E] inputs in the spec's
    dtype, the MoE plugin layer with the weights as constants (FP8 experts: FP8 W1 / W2 and fp32 scale
    constants, in `plugins/slots.py` input_slots order), its output marked as `output`."""

    def __init__(self, network: NetworkLoader, trt: ModuleType, spec: MoESpec, plan: Plan, weights: MoEWeights,
                 progress: BuildProgress):
        self._network, self._trt, self._spec, self._plan, self._weights = network, trt, spec, plan, weights
        self._progress = progress

    def call_impl(self) -> tuple[Any, Any, list[Any]]:
        from ..plugins.moe_plugin import add_moe_plugin, register_moe_plugin, trt_dtype_of
        from ..weights.dtypes import TORCH_DTYPE
        ret, _ = util.invoke_if_callable(self._network)
        builder, network = ret[0], ret[1]
        self._progress.begin("adding the MoE plugin layer")
        trt, spec = self._trt, self._spec
        register_moe_plugin(trt)
        dtype = trt_dtype_of(trt, TORCH_DTYPE[spec.dtype])
        hidden = network.add_input(INPUT_HIDDEN, dtype, trt.Dims([-1, spec.hidden_size]))
        logits = network.add_input(INPUT_LOGITS, dtype, trt.Dims([-1, spec.num_experts]))
        layer, keep_alive = add_moe_plugin(network, trt, spec, self._plan, hidden, logits, self._weights)
        out = layer.get_output(0)
        out.name = OUTPUT
        network.mark_output(out)
        return builder, network, keep_alive


@dataclass
class NetworkRecord:
    """What RecordNetwork saw: the manifest's I/O and layer list of the network that was built."""

    description: dict[str, Any] = field(default_factory=dict)


class RecordNetwork(BaseLoader):
    """Passthrough network loader that describes the network into `record` before it is built."""

    def __init__(self, network: NetworkLoader, record: NetworkRecord):
        self._network, self._record = network, record

    def call_impl(self) -> tuple[Any, ...]:
        ret, _ = util.invoke_if_callable(self._network)
        self._record.description = describe_network(ret[1])
        return ret
