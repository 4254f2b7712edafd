"""Server-Sent Events: bytes as they arrive -> ``(field, data)`` events.

The format is the WHATWG HTML "server-sent events" one, which llama.cpp and OpenAI stream;
:class:`SSEDecoder` is the first layer of :class:`boxmaker.client.StreamDecoder`.
"""

from __future__ import annotations

from ...errors import InferError

__all__ = ["MAX_EVENT_BYTES", "SSEDecoder"]

_CR, _LF = 13, 10  # b"\r", b"\n"

MAX_EVENT_BYTES = 16 * 1024 * 1024
"""Default cap on one SSE event, in bytes (16 MiB): llama.cpp's chunks carry one token each
and stay far below a kilobyte; its last chunk (timings, usage) a few kilobytes."""


class SSEDecoder:
    """Incremental Server-Sent Events decoder: bytes as they arrive -> ``(field, data)``.

    Format: WHATWG HTML "server-sent events" (the one llama.cpp and OpenAI stream). Lines end
    with ``\\n``, ``\\r\\n`` or a lone ``\\r``; an empty line ends an event; ``field: value``
    lines (one optional space after the colon is dropped); lines starting with ``:`` are
    comments (llama.cpp's ``: ping``) and ignored.

    :meth:`feed` returns, for each event completed by the chunk, one ``(field, data)`` per
    field name the event carried, in order of first appearance: ``("data", "{...}")``, or
    ``("error", "{...}")`` for older llama.cpp builds. Several lines of the same field are
    joined with ``\\n``. Events and fields with empty data are dropped.

    A chunk boundary may fall anywhere: mid-line, mid-UTF-8 character, between ``\\r`` and
    ``\\n``; the incomplete tail waits for the next chunk. Invalid UTF-8 becomes U+FFFD.

    Linear time in the bytes fed, whatever the line lengths: the reads of an unfinished line
    are kept in a list and joined once, when its end arrives (joining them on each read made
    a 100 MB line take minutes). :attr:`joined` counts the bytes copied by those joins (at
    most the bytes fed).

    Args:
        max_event_bytes: the most bytes one event may take (its lines together; an unfinished
            line counts as it grows, so a line that never ends is stopped too); ``None``: no
            cap. Default :data:`MAX_EVENT_BYTES`.

    Raises:
        InferError: (from :meth:`feed`, :meth:`flush`) an event grew past
            ``max_event_bytes``; the message gives the size reached and the cap.
    """

    __slots__ = ("_buf", "_held", "_max", "_pending", "_pending_bytes", "_tail", "joined")

    def __init__(self, *, max_event_bytes: int | None = MAX_EVENT_BYTES) -> None:
        self._buf = b""
        self._tail: list[bytes] = []  # reads of an unfinished line after ``_buf``, not joined
        self._held = 0  # bytes in _buf and _tail
        self._max = max_event_bytes
        self._pending: list[tuple[str, str]] = []
        self._pending_bytes = 0  # characters of the pending event's lines
        self.joined = 0

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        """Decode one chunk of bytes; return the events it completed (maybe none)."""
        if self._buf and _LF not in chunk and _CR not in chunk:
            self._tail.append(chunk)  # the same line goes on: keep the read, join it later
            self._held += len(chunk)
            self._check(self._held + self._pending_bytes)
            return []
        if self._tail:
            buf = b"".join([self._buf, *self._tail, chunk])
            self._tail = []
            self.joined += len(buf)
        else:
            buf = self._buf + chunk if self._buf else chunk
        hold = b""
        if _CR in buf:  # (an int: bytes' `in` tries it as a byte first, a bytes needle is slower)
            if buf[-1] == _CR:  # may be the first half of a \r\n split between chunks
                hold = b"\r"
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if buf and buf[-1] == _LF:
            self._buf = hold
        else:
            end = buf.rfind(b"\n") + 1
            if not end:
                self._buf = buf + hold
                self._held = len(self._buf)
                self._check(self._held + self._pending_bytes)
                return []
            self._buf = buf[end:] + hold
            buf = buf[:end]
        self._held = len(self._buf)
        self._check(self._held)
        text = buf.decode("utf-8", "replace")
        small = self._max is None or len(buf) <= self._max  # no event in it can pass the cap
        if small and not self._pending and text.startswith("data: ") and text.endswith("\n\n"):
            # The usual shape (llama.cpp, OpenAI): nothing but one-line "data: " events, each
            # followed by its blank line. Then the text is "data: " + the events' data joined
            # by "\n\ndata: " + "\n\n", and holds no newline besides those separators.
            end = len(text) - 2
            if text.find("\n", 6) == end:  # one event (a server's flush)
                data = text[6:end]
                return [("data", data)] if data else []
            datas = text[6:end].split("\n\ndata: ")
            if "\n" not in "".join(datas):
                return [("data", data) for data in datas if data]
        lines = text.split("\n")
        lines.pop()
        return self._lines(lines)

    def flush(self) -> list[tuple[str, str]]:
        """End of stream: decode what is left, ending an unterminated last event."""
        buf, self._buf = b"".join([self._buf, *self._tail]), b""
        self._tail, self._held = [], 0
        text = buf.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n") if text else []
        lines.append("")
        return self._lines(lines)

    def _lines(self, lines: list[str]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        pending = self._pending
        size = self._pending_bytes
        for line in lines:
            if not line:
                if pending:
                    self._check(size)
                    if len(pending) == 1:
                        if pending[0][1]:
                            out.append(pending[0])
                    else:
                        out.extend(_merge_fields(pending))
                    pending = []
                    size = 0
            elif line.startswith("data: "):
                pending.append(("data", line[6:]))
                size += len(line)
            elif line[0] != ":":
                name, _, value = line.partition(":")
                pending.append((name, value[1:] if value[:1] == " " else value))
                size += len(line)
        self._pending = pending
        self._pending_bytes = size
        self._check(size)
        return out

    def _check(self, size: int) -> None:
        if self._max is not None and size > self._max:
            raise InferError(
                f"an SSE event from the server grew to more than {size:,} bytes, past the cap "
                f"of {self._max:,} (ClientConfig.max_event_bytes)"
            )


def _merge_fields(pending: list[tuple[str, str]]) -> list[tuple[str, str]]:
    merged: dict[str, list[str]] = {}
    for name, value in pending:
        merged.setdefault(name, []).append(value)
    return [(name, text) for name, values in merged.items() if (text := "\n".join(values))]
