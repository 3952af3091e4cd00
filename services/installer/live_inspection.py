"""Inspecting an artifact while it downloads: a download sink that feeds the archive's bytes
to :func:`archive.inspect_stream` running in a worker thread, which keeps the decompressed
tar for unpacking.

The inspection then costs no time of its own (it overlaps the download), a hostile archive
is refused as soon as its first bad entry arrives (the download stops there), and still
nothing is unpacked until the whole archive has been read and passed.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

from services.installer.archive import Inspection, Limits, inspect_stream

QUEUE_CHUNKS = 16
"""Chunks (up to 1 MB each) buffered between the download and the inspection."""

class _Signal:
    """Queued instead of a chunk: the download ended, or failed."""


_END = _Signal()
"""Queued after the last chunk of a completed download."""

_ABORT = _Signal()
"""Queued when a download attempt failed: the inspection stops quietly."""

_WAIT_S = 0.1
"""How often a blocked writer looks whether the inspection already refused the archive."""


class _Aborted(Exception):
    """The download attempt failed; the inspection of its bytes is moot."""


class _QueueReader:
    """A read-only file over the chunks arriving in a queue."""

    def __init__(self, chunks: queue.Queue[bytes | _Signal]) -> None:
        self._chunks, self._buffer, self._ended = chunks, bytearray(), False

    def _next(self) -> bytes | None:
        """The next chunk; None once the download ended; :class:`_Aborted` if it failed."""
        chunk = self._chunks.get()
        if isinstance(chunk, _Signal):
            if chunk is _ABORT:
                raise _Aborted()
            self._ended = True
            return None
        return chunk

    def read(self, size: int = -1, /) -> bytes:
        if not self._buffer and not self._ended and size > 0:
            chunk = self._next()  # the common case: hand a whole chunk over uncopied
            if chunk is None:
                return b""
            if len(chunk) <= size:
                return chunk
            self._buffer += chunk
        while not self._ended and (size < 0 or len(self._buffer) < size):
            chunk = self._next()
            if chunk is not None:
                self._buffer += chunk
        take = len(self._buffer) if size < 0 else min(size, len(self._buffer))
        data = bytes(self._buffer[:take])
        del self._buffer[:take]
        return data


class LiveInspection:
    """One download attempt's inspection; a :class:`download.Sink`."""

    def __init__(self, module_id: str, version: str, limits: Limits, keep_tar: Path) -> None:
        self._chunks: queue.Queue[bytes | _Signal] = queue.Queue(maxsize=QUEUE_CHUNKS)
        self._result: Inspection | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(module_id, version, limits, keep_tar),
                                        name=f"inspect-{module_id}", daemon=True)
        self._thread.start()

    def _run(self, module_id: str, version: str, limits: Limits, keep_tar: Path) -> None:
        try:
            with open(keep_tar, "wb") as keep:
                self._result = inspect_stream(_QueueReader(self._chunks), module_id, version, limits, keep)
        except _Aborted:
            pass
        except BaseException as exc:  # noqa: BLE001 — any failure, a bug too, is the download's to raise
            self._error = exc
        finally:
            self._done.set()

    def _put(self, item: bytes | _Signal) -> None:
        """Queue ``item``; if the inspection already ended with a refusal, raise it instead."""
        while True:
            if self._done.is_set():
                if self._error is not None:
                    raise self._error
                return
            try:
                self._chunks.put(item, timeout=_WAIT_S)
                return
            except queue.Full:
                continue

    def write(self, chunk: bytes) -> None:
        self._put(chunk)

    def close(self) -> None:
        self._put(_END)

    def abort(self) -> None:
        try:
            self._put(_ABORT)
        except BaseException:  # noqa: BLE001 — the inspection's own failure: moot once the download failed
            pass
        self._thread.join()

    def result(self) -> Inspection:
        """What the inspection found once the whole archive arrived, or its refusal."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result
