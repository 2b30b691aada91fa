"""Every log line reaches the stream in one write, its newline included."""

from __future__ import annotations

import io

from supervisor.config import LogFormat, LogLevel
from supervisor.logs import make_logger


class Writes(io.StringIO):
    """An unbuffered stream (PYTHONUNBUFFERED): records each write call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, s: str) -> int:
        self.calls.append(s)
        return super().write(s)


def test_a_log_line_is_one_write_so_other_output_cannot_split_it() -> None:
    stream = Writes()
    log = make_logger(LogFormat.JSON, LogLevel.INFO, stream, job="j")
    log.warning("worker.failed", pod="w-1")
    log.info("discovery.written", hosts=2)
    assert len(stream.calls) == 2, stream.calls
    assert all(c.endswith("}\n") and c.count("\n") == 1 for c in stream.calls), stream.calls
