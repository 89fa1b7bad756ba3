"""The builder config: Polygraphy's CreateConfig (CreateConfigRTX for TensorRT-RTX) with our profile.

Why a wrapper: Polygraphy's `Profile` names each input, and only the network knows its inputs
(the OOTB graph's follow the routing input; the plugin path's are hidden + router_logits), so
the token profile is put on every input's token dimension when the config is made, from the
network it is made for. Everything else is a CreateConfig argument: builder optimization level,
workspace pool limit, the timing cache (full TensorRT), TensorRT-RTX's compute capability, and
the progress monitor.
"""
from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from polygraphy.backend.base import BaseLoader

from ..target import TokenProfile
from .interrupts import HeldInterrupts
from .options import BuildOptions
from .preflight import Toolchain
from .progress import BuildProgress, make_monitor


class TokenProfileConfig(BaseLoader):
    """A config loader: `create_config(profiles=[the token profile], **kwargs)(builder, network)`."""

    def __init__(self, loaders: ModuleType, create_config: Any, tokens: TokenProfile, **config_kwargs: Any):
        self._loaders, self._create_config, self._tokens, self._kwargs = loaders, create_config, tokens, config_kwargs

    def call_impl(self, builder: Any, network: Any) -> Any:
        t, profile = self._tokens, self._loaders.Profile()
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            shape = tuple(tensor.shape)
            if shape and shape[0] == -1:
                profile.add(tensor.name, (t.min, *shape[1:]), (t.opt, *shape[1:]), (t.max, *shape[1:]))
            else:
                profile.add(tensor.name, shape, shape, shape)
        return self._create_config(profiles=[profile], **self._kwargs)(builder, network)


def engine_config(chain: Toolchain, options: BuildOptions, progress: BuildProgress, held: HeldInterrupts,
                  timing_cache: Path | None) -> TokenProfileConfig:
    """The config loader for one build; `timing_cache` is the build's (None where the flavour has none),
    `held` the signals its progress monitor cancels the build for."""
    backend = chain.backend
    kwargs: dict[str, Any] = {"builder_optimization_level": options.optimization_level}
    if options.workspace_bytes is not None:
        kwargs["memory_pool_limits"] = {backend.trt.MemoryPoolType.WORKSPACE: options.workspace_bytes}
    if timing_cache is not None and timing_cache.exists():
        kwargs["load_timing_cache"] = str(timing_cache)
    if chain.compute_capability is not None:
        kwargs["compute_capabilities"] = [chain.compute_capability]
    if backend.has_progress_monitor:
        kwargs["progress_monitor"] = make_monitor(backend, progress, held)
    return TokenProfileConfig(chain.loaders, chain.create_config, chain.target.profile, **kwargs)
