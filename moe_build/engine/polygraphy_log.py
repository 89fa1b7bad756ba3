"""Polygraphy's (and, through its logger, TensorRT's) messages during a build: kept, not printed.

Why: Polygraphy prints progress and configuration to stdout and fails with a generic
`PolygraphyException` ("Invalid Engine...", "Could not parse ONNX correctly") whose useful part,
TensorRT's or the ONNX parser's own error lines, went to the log just before. A build collects
those lines and turns the exception into one `MoeBuildError` line that quotes them, and the
CLI's stdout stays the plan table and the result.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator

from ..errors import MoeBuildError

MESSAGE_CHARS = 500  # a one-line error quotes at most this much of TensorRT's words


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = " ".join(record.getMessage().split())
        if text:
            self.messages.append(text)


@contextlib.contextmanager
def polygraphy_errors(field: str = "build") -> Iterator[list[str]]:
    """Route Polygraphy's ERROR/CRITICAL messages into the yielded list (nothing else is logged),
    and re-raise a PolygraphyException from the body as MoeBuildError(`field`) quoting them."""
    from polygraphy.exception import PolygraphyException
    from polygraphy.logger import G_LOGGER

    handler, python_logger = _Collect(), logging.getLogger("Polygraphy")
    saved = (G_LOGGER.colors, G_LOGGER.letter, G_LOGGER.use_python_logging_system, python_logger.propagate)
    G_LOGGER.colors = G_LOGGER.letter = False
    G_LOGGER.use_python_logging_system = True
    python_logger.addHandler(handler)
    python_logger.propagate = False
    try:
        with G_LOGGER.verbosity(G_LOGGER.ERROR):
            yield handler.messages
    except PolygraphyException as exc:
        failure = " ".join(str(exc).split())
        detail = " | ".join(dict.fromkeys([*handler.messages, failure]))  # in order, each once
        raise MoeBuildError(field, f"TensorRT could not build the engine: {detail[:MESSAGE_CHARS]}") from None
    finally:
        python_logger.removeHandler(handler)
        G_LOGGER.colors, G_LOGGER.letter, G_LOGGER.use_python_logging_system, python_logger.propagate = saved
