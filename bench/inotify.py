"""Timestamps of renames into (and deletes in) a directory, from Linux inotify (ctypes)."""

from __future__ import annotations

import ctypes
import os
import queue
import struct
import threading
import time

IN_MOVED_TO = 0x00000080
IN_DELETE = 0x00000200
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


class RenameWatcher:
    """Queues (perf_counter time, file name) for each file renamed into or deleted in a dir."""

    def __init__(self, directory: str) -> None:
        self.fd = _libc.inotify_init1(0)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if _libc.inotify_add_watch(self.fd, directory.encode(), IN_MOVED_TO | IN_DELETE) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {directory}")
        self.events: queue.Queue[tuple[float, str]] = queue.Queue()
        self.closed = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except OSError:
                return
            if self.closed:  # the descriptor number may already belong to another file
                return
            now = time.perf_counter()
            i = 0
            while i < len(buf):
                _wd, _mask, _cookie, length = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16:i + 16 + length].rstrip(b"\0").decode(errors="replace")
                self.events.put((now, name))
                i += 16 + length

    def drain(self) -> None:
        while not self.events.empty():
            self.events.get_nowait()

    def close(self) -> None:
        self.closed = True
        os.close(self.fd)
