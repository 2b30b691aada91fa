"""Structured logging: one structlog logger built from the config, no global configuration.

Every decision is logged once under a stable dotted event name (`discovery.written`,
`horovodrun.exited`, ...) with its context as key-value pairs.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from supervisor.config import LogFormat, LogLevel


def make_logger(fmt: LogFormat, level: LogLevel, stream: TextIO | None = None,
                **context: object) -> structlog.typing.FilteringBoundLogger:
    """Return a logger writing `fmt` lines at `level` and above to `stream` (stderr)."""
    renderer = (structlog.processors.JSONRenderer(sort_keys=False) if fmt is LogFormat.JSON
                else structlog.dev.ConsoleRenderer(colors=False))
    logger = structlog.wrap_logger(
        # One write per line, newline included (PrintLogger's print() writes the newline
        # apart when the stream is unbuffered, PYTHONUNBUFFERED in the images, and horovodrun's
        # output, on the same pipe, then lands in the middle of a line).
        structlog.WriteLogger(stream or sys.stderr),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            getattr(logging, level.value.upper())),
        cache_logger_on_first_use=False,
    )
    return logger.bind(**context)
