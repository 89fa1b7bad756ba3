"""Eager calls of the nccl dispatch's all-gather form, kept as CUDA graphs and replayed.

Why: eagerly, at decode sizes, a dispatch + combine of that form cost its host time, not its GPU time: on 2 H200s
120-250 us at 1-1024 tokens against 17-19 us replayed from a CUDA graph. Calling its kept launches again without
the wrappers still took 50-59 us, about the worst-case all_to_all_single pair's own, since most of it is NCCL's
launch of a group, which a graph launch replaces (docs/performance.md, "Expert parallelism on 2 x H200: eager calls
replayed as CUDA graphs"). A call's launches depend only on what its key holds
(every rank's counts, the addresses, types and layouts of the tensors it reads and writes, the stream), so the
first eager call with a key runs through the wrappers as always, and its launches are then captured into a graph
(every rank makes the same calls in the same order, as for the collectives themselves); a later call with that
key replays the graph. The buffers such a call writes and returns (the gathered rows, ids and weights) are kept
with its graph, which wrote their addresses: a kept call's result is overwritten by the next call with its key
(one call in flight per dispatch, as its counts buffer already says).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch

KEPT_BYTES = 64 << 20  # buffers a dispatch keeps for the replays of its eager calls
KEPT_CALLS = 64        # calls (keys) a dispatch keeps (a decode loop reuses a few buffers)


def tensor_key(t: torch.Tensor) -> tuple[object, ...]:
    """Everything a launch reads of `t`: where it is, its type and its layout."""
    return t.data_ptr(), t.dtype, t.shape, t.stride()


class KeptGraphs:
    """The CUDA graphs of recent eager calls by key, each with what the call returned (and the buffers it wrote,
    kept alive with it): at most `calls` of them within `budget` bytes of those buffers, the least recent dropped
    first."""

    def __init__(self, budget: int = KEPT_BYTES, calls: int = KEPT_CALLS) -> None:
        self.budget, self.calls = budget, calls
        self._kept: OrderedDict[Hashable, tuple[torch.cuda.CUDAGraph, object, int]] = OrderedDict()
        self._bytes = 0
        self._side: torch.cuda.Stream | None = None

    def __len__(self) -> int:
        return len(self._kept)

    def call(self, key: tuple[object, ...], run: Callable[[], tuple[Callable[[], None], object, int]],
             device: torch.device) -> object:
        """One call's result: where the call is eager and a call with `key` (and the current stream of `device`) is
        kept, that call's graph replayed and its result; else `run()`'s, which makes the call's buffers, runs its
        launches once and returns (the launches, the result, the buffers' bytes), kept for the next call (not
        while the caller captures a graph of its own: the launches then go into that graph)."""
        if torch.cuda.is_current_stream_capturing():
            return run()[1]
        key = (*key, torch.cuda.current_stream(device).cuda_stream)
        kept = self.replay(key)
        if kept is not None:
            return kept
        launches, result, nbytes = run()
        self.keep(key, launches, result, nbytes)
        return result

    def replay(self, key: Hashable) -> object | None:
        """What the call kept under `key` returned, its graph replayed on the current stream; None where no call
        is kept."""
        kept = self._kept.get(key)
        if kept is None:
            return None
        self._kept.move_to_end(key)
        kept[0].replay()
        return kept[1]

    def keep(self, key: Hashable, launches: Callable[[], None], result: object, nbytes: int) -> None:
        """`launches` (the call's, just run eagerly on the current stream: NCCL's connections are made) captured
        into a graph kept under `key` with `result` and its `nbytes` of buffers; a call past the budget alone is
        not kept."""
        if nbytes > self.budget:
            return
        self._kept[key] = (self._capture(launches), result, nbytes)
        self._bytes += nbytes
        while self._bytes > self.budget or len(self._kept) > self.calls:
            self._bytes -= self._kept.popitem(last=False)[1][2]

    def _capture(self, launches: Callable[[], None]) -> torch.cuda.CUDAGraph:
        """`launches` captured on a side stream (a graph is not captured on the default stream), ordered after the
        current stream's work; nothing runs."""
        main = torch.cuda.current_stream()
        if self._side is None:
            self._side = torch.cuda.Stream(device=main.device)
        graph = torch.cuda.CUDAGraph()
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                launches()
            finally:
                graph.capture_end()
        main.wait_stream(self._side)
        return graph
