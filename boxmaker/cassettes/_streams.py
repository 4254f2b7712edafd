"""The response streams of recording and replay, for httpx and ``httpx2`` (the openai SDK's
httpx fork, from openai 3): a tee that passes a stream on while it keeps a copy (sync and
async), and a recorded body replayed one SSE event per chunk. Used by
:mod:`boxmaker.cassettes`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from types import ModuleType
from typing import Any

import httpx

__all__ = ["LIBRARIES", "Library"]

httpx2: ModuleType | None
try:  # the openai SDK's httpx fork (from openai 3)
    import httpx2
except ImportError:  # pragma: no cover - not installed
    httpx2 = None


class _Copy:
    """What both tees share: the inner stream, the chunks kept, and ``on_end(body, error)``,
    called once, when the stream is exhausted, breaks, or is closed."""

    def __init__(self, inner: Any, on_end: Callable[[bytes, Exception | None], None]) -> None:
        self._inner = inner
        self._parts: list[bytes] = []
        self._on_end: Callable[[bytes, Exception | None], None] | None = on_end

    def _end(self, error: Exception | None) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end(b"".join(self._parts), error)


class _Tee(_Copy, httpx.SyncByteStream):
    """A response stream passed on chunk by chunk while a copy is kept (see :class:`_Copy`)."""

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self._inner:
                self._parts.append(chunk)
                yield chunk
        except Exception as exc:
            self._end(exc)
            raise
        self._end(None)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._end(None)


class _AsyncTee(_Copy, httpx.AsyncByteStream):
    """:class:`_Tee` for an async response stream (``httpx.AsyncClient``)."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                self._parts.append(chunk)
                yield chunk
        except Exception as exc:
            self._end(exc)
            raise
        self._end(None)

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._end(None)


class _Replay(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A recorded body played back one SSE event per chunk (like llama-server sends it),
    then the recorded transport error, if any; for sync and async clients."""

    _lib: ModuleType = httpx

    def __init__(self, body: bytes, error: str | None) -> None:
        self._body = body
        self._error = error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self:
            yield chunk

    def __iter__(self) -> Iterator[bytes]:
        body = self._body
        start = 0
        while start < len(body):
            end = body.find(b"\n\n", start)
            end = len(body) if end < 0 else end + 2
            yield body[start:end]
            start = end
        if self._error:
            name, _, message = self._error.partition(": ")
            lib = self._lib
            kind = getattr(lib, name, None)
            if not (isinstance(kind, type) and issubclass(kind, lib.TransportError)):
                kind, message = lib.RemoteProtocolError, self._error
            raise kind(message)


class Library:
    """An httpx-like library (``httpx``, or ``httpx2``, which the openai SDK uses from
    version 3) with the stream classes made for it.

    Attributes:
        lib: the module (its ``Response``, transports and errors).
        tee: the sync tee, ``tee(stream, on_end)``; ``on_end(body, error)`` runs once.
        async_tee: the same for an async stream.
        replay: ``replay(body, error)``, a recorded body as a sync and async stream.
    """

    def __init__(self, lib: ModuleType) -> None:
        self.lib = lib
        if lib is httpx:
            self.tee: type[Any] = _Tee
            self.async_tee: type[Any] = _AsyncTee
            self.replay: type[Any] = _Replay
        else:
            self.tee = type("_Tee", (_Tee, lib.SyncByteStream), {})
            self.async_tee = type("_AsyncTee", (_AsyncTee, lib.AsyncByteStream), {})
            self.replay = type(
                "_Replay", (_Replay, lib.SyncByteStream, lib.AsyncByteStream), {"_lib": lib}
            )


LIBRARIES = [Library(httpx)] + ([Library(httpx2)] if httpx2 is not None else [])
"""The libraries whose transports :func:`~boxmaker.cassettes.use_cassette` patches
(``httpx2`` only when it is installed)."""
