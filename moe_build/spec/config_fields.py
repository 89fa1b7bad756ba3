"""Typed reads of a Hugging Face config's keys, each failure naming the key, so errors point at the file."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

from ..errors import MoeBuildError

MAX_LAYERS = 1024  # decoder layers of a config (the largest released MoE models have under 100)


def one_config_group(q: Mapping[str, Any], matches: Callable[[Mapping[str, Any]], bool],
                     scheme: str) -> tuple[str, Mapping[str, Any]] | None:
    """compressed-tensors' config group that `matches` (FP8 or int weights), as (name, group); None when none does.
    Several groups are refused, since moe-build would have to match their targets to module names to know which one
    the experts follow."""
    groups = q.get("config_groups") or {}
    if not isinstance(groups, Mapping):
        raise MoeBuildError("config_groups", f"must be an object, got {groups!r}", "an object of groups")
    found = [name for name, g in groups.items() if isinstance(g, Mapping) and matches(g)]
    if not found:
        return None
    if len(groups) > 1:
        raise MoeBuildError("config_groups", f"{len(groups)} groups ({', '.join(groups)}): moe-build reads one "
                            f"{scheme} scheme for every expert", "one config group")
    return found[0], groups[found[0]]


class ConfigFields:
    """Typed reads of a config dict; every failure names the config key, so errors point at the file."""

    def __init__(self, data: Mapping[str, Any]):
        self.data = data

    def first(self, *keys: str) -> tuple[str, Any] | None:
        """The first present (non-null) alias; two aliases with different values are a contradiction."""
        found = [(k, self.data[k]) for k in keys if self.data.get(k) is not None]
        for key, value in found[1:]:
            if value != found[0][1]:
                raise MoeBuildError(key, f"{value!r} contradicts {found[0][0]}={found[0][1]!r}",
                                    f"the same value as {found[0][0]}")
        return found[0] if found else None

    def int(self, *keys: str, default: int | None = None, minimum: int = 1, maximum: int | None = None) -> int:
        hit = self.first(*keys)
        allowed = f"integers {minimum}..{maximum}" if maximum is not None else f"integers >= {minimum}"
        if hit is None:
            if default is None:
                raise MoeBuildError(keys[0], "missing from the config", allowed)
            return default
        key, value = hit
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum or \
                (maximum is not None and value > maximum):
            raise MoeBuildError(key, f"must be an integer in that range, got {value!r}", allowed)
        return value

    def float(self, *keys: str, default: float | None = None) -> float:
        hit = self.first(*keys)
        if hit is None:
            if default is None:
                raise MoeBuildError(keys[0], "missing from the config", "a positive number")
            return default
        key, value = hit
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise MoeBuildError(key, f"must be a positive number, got {value!r}", "numbers > 0")
        return float(value)

    def bool(self, *keys: str, default: bool | None = None) -> bool:
        hit = self.first(*keys)
        if hit is None:
            if default is None:
                raise MoeBuildError(keys[0], "missing from the config", "true, false")
            return default
        key, value = hit
        if not isinstance(value, bool):
            raise MoeBuildError(key, f"must be true or false, got {value!r}", "true, false")
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: str | None = None) -> str:
        value = self.data.get(key, default)
        if value is None:
            raise MoeBuildError(key, "missing from the config", allowed)
        if value not in allowed:
            raise MoeBuildError(key, f"{value!r} is not supported", allowed)
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise MoeBuildError(key, f"must be a list of layer indices, got {value!r}", "a list of integers")
        return value

    def layers(self) -> range:
        """Every decoder layer (DBRX spells the count `n_layers`)."""
        return range(self.int("num_hidden_layers", "n_layers", maximum=MAX_LAYERS))

    def same(self, key: str, value: Any, problem: str) -> None:
        """Refuse `key` unless it is absent or equals `value`: the keys transformers ignores but a family's
        released code reads, where another value would mean another architecture."""
        if self.data.get(key) is not None and self.data[key] != value:
            raise MoeBuildError(key, f"{self.data[key]!r}: {problem}", repr(value))


@contextmanager
def prefixed(prefix: str) -> Iterator[None]:
    """Name the keys a parser reports by their path from where it looked (quantization_config.fmt)."""
    try:
        yield
    except MoeBuildError as exc:
        raise MoeBuildError(f"{prefix}.{exc.field}", exc.problem, exc.allowed) from None
