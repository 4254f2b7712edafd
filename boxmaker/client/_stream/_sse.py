"""Server-Sent Events: bytes as they arrive -> ``(field, data)`` events.

The format is the WHATWG HTML "server-sent events" one, which llama.cpp and OpenAI stream;
:class:`SSEDecoder` is the first layer of :class:`boxmaker.client.StreamDecoder`.
"""

from __future__ import annotations

__all__ = ["SSEDecoder"]

_CR, _LF = 13, 10  # b"\r", b"\n"


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
    """

    __slots__ = ("_buf", "_pending")

    def __init__(self) -> None:
        self._buf = b""
        self._pending: list[tuple[str, str]] = []

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        """Decode one chunk of bytes; return the events it completed (maybe none)."""
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
                return []
            self._buf = buf[end:] + hold
            buf = buf[:end]
        text = buf.decode("utf-8", "replace")
        if not self._pending and text.startswith("data: ") and text.endswith("\n\n"):
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
        buf, self._buf = self._buf, b""
        text = buf.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n") if text else []
        lines.append("")
        return self._lines(lines)

    def _lines(self, lines: list[str]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        pending = self._pending
        for line in lines:
            if not line:
                if pending:
                    if len(pending) == 1:
                        if pending[0][1]:
                            out.append(pending[0])
                    else:
                        out.extend(_merge_fields(pending))
                    pending = []
            elif line.startswith("data: "):
                pending.append(("data", line[6:]))
            elif line[0] != ":":
                name, _, value = line.partition(":")
                pending.append((name, value[1:] if value[:1] == " " else value))
        self._pending = pending
        return out


def _merge_fields(pending: list[tuple[str, str]]) -> list[tuple[str, str]]:
    merged: dict[str, list[str]] = {}
    for name, value in pending:
        merged.setdefault(name, []).append(value)
    return [(name, text) for name, values in merged.items() if (text := "\n".join(values))]
