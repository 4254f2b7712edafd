"""Recording and replaying: a streaming httpx transport patch over vcrpy's cassette.

Recording passes the stream on as it arrives. vcrpy's own httpx stub reads a whole response
before handing it over, which would freeze the widgets, Stop, and the thinking cap (it must
send ``reasoning_end`` while reasoning streams). Here httpx's transports, sync and async
(``HTTPTransport``, ``AsyncHTTPTransport``, ``MockTransport``), are patched instead, so any
httpx client is served (boxmaker's, plain ``httpx.Client``/``AsyncClient``, the openai SDK):
a response to record gets its stream teed into a buffer, and the interaction is appended to
vcrpy's cassette when the response ends (read to the end, closed by the client, or broken:
then what arrived is kept with the error in ``response.error``, and replay raises the same
httpx error after the same bytes). Interactions are therefore stored in the order their
responses ended: a reasoning-control request sent during a stream comes before that
stream's interaction.
A compressed response is stored decoded and without its ``Content-Encoding`` header.

Each interaction plays once, the first unplayed match first (matching:
:mod:`boxmaker.cassettes`). In record mode ``none`` (the default, used in CI) no real
request is made: a request with no match fails at once with :class:`UnrecordedRequest`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal
from unittest import mock

import httpx
import vcr
from vcr.record_mode import RecordMode as VcrRecordMode
from vcr.request import Request as VcrRequest

from ..client import SIDE_REFUSED, SIDE_REFUSED_STATUS, SIDE_REQUEST
from ..errors import CassetteError, UnrecordedRequest
from ._matching import (
    body_for_matching,
    describe_difference,
    first_body_difference,
    json_body_matcher,
)
from ._scrub import (
    credentials,
    hide_in_request,
    hide_in_response,
    restore,
    scrub_request,
    scrub_response,
)
from ._serializer import FilePersister, serializer
from ._streams import LIBRARIES, Library

__all__ = [
    "RECORD_MODES",
    "RecordMode",
    "UnrecordedRequest",
    "make_vcr",
    "recorded_response",
    "streaming_into",
    "unplayed",
    "unplayed_message",
    "use_cassette",
]

RecordMode = Literal["none", "once", "new_episodes", "all"]
"""vcrpy's record modes: ``none`` replays only, ``once`` records a cassette that does not
exist yet, ``new_episodes`` replays what matches and records the rest, ``all`` re-records."""

RECORD_MODES: tuple[RecordMode, ...] = ("none", "once", "new_episodes", "all")
"""The record modes, in the order ``--record-mode`` lists them."""


def make_vcr(record_mode: RecordMode = "none", *, ignore_body_keys: Sequence[str] = ()) -> vcr.VCR:
    """A vcrpy ``VCR`` set up for llama-server traffic.

    Matching on method, path and JSON body; headers, credential-like query parameters and
    JSON fields scrubbed (:func:`~boxmaker.cassettes._scrub.scrub_request`,
    :func:`~boxmaker.cassettes._scrub.scrub_response`); compressed responses stored decoded;
    the readable serializer, and a file persister that refuses a broken cassette with a
    CassetteError naming the file; each interaction played once. vcrpy's own httpx patch is
    skipped: :func:`use_cassette` installs the streaming one, which also hides each request's
    credentials (:class:`_Run`).

    Args:
        record_mode: see :data:`RecordMode`.
        ignore_body_keys: top-level request-body keys left out of matching (the what-if
            replay leaves out ``reasoning_control``, which only says a thinking cap is armed).
    """
    v = vcr.VCR(
        record_mode=record_mode,
        serializer="boxmaker",
        match_on=("method", "path", "json_body"),
        before_record_request=scrub_request,
        before_record_response=scrub_response,
        decode_compressed_response=True,
        skip_patchers=("httpx", "httpx2"),
    )
    v.register_serializer("boxmaker", serializer)
    v.register_persister(FilePersister)
    v.register_matcher("json_body", json_body_matcher(tuple(ignore_body_keys)))
    return v


def _replayed(
    recorded: Mapping[str, Any], request: Any, secret: str | None, library: Library
) -> Any:
    status = recorded.get("status") or {}
    message = status.get("message")
    headers = [
        (name, str(value))
        for name, values in (recorded.get("headers") or {}).items()
        for value in (values if isinstance(values, list) else [values])
    ]
    body = recorded["body"]["string"] or b""
    body = restore(body if isinstance(body, bytes) else str(body).encode(), secret)
    return library.lib.Response(
        int(status.get("code", 200)),
        headers=headers,
        stream=library.replay(body, recorded.get("error")),
        extensions={"reason_phrase": str(message).encode("ascii")} if message else {},
        request=request,
    )


class _Run:
    """One open cassette: the vcrpy cassette, the requests seen, the no-match failures.

    Each request is scrubbed (:mod:`~boxmaker.cassettes`: its credentials, with
    ``secrets``, hidden in its URI and body) before it is matched or recorded, and its
    credentials are hidden in the response recorded for it."""

    def __init__(
        self, cassette: Any, path: Path, ignore: Sequence[str] = (), secrets: Sequence[str] = ()
    ) -> None:
        self.cassette = cassette
        self.path = path
        self.ignore = tuple(ignore)
        self.secrets = tuple(s for s in secrets if s)
        self.requests = 0
        self.failures: list[UnrecordedRequest] = []
        self.lock = threading.Lock()
        self._index: dict[tuple[Any, ...], list[int]] = {}  # match key -> recorded indices
        self._cursor: dict[tuple[Any, ...], int] = {}  # first index of a bucket maybe unplayed
        self._indexed = 0  # recorded interactions in the index (recording adds more)

    def lookup(
        self, request: Any, body: bytes, library: Library
    ) -> tuple[Any, VcrRequest, list[str]]:
        """The replayed response for ``request`` (None: to be sent and recorded), its scrubbed
        vcrpy request and its credentials. Raises :class:`UnrecordedRequest`."""
        vreq = VcrRequest(request.method, str(request.url), body, dict(request.headers))
        sent = list(request.headers.multi_items())  # every line: a header sent twice too
        known = list(credentials(vreq, self.secrets, headers=sent))
        vreq = scrub_request(hide_in_request(vreq, known))
        with self.lock:
            self.requests += 1
            number = self.requests
            cassette = self.cassette
            index = self._playable(vreq)
            if index is not None:
                cassette.play_counts[index] += 1
                played = cassette.data[index][1]
                replayed = _replayed(played, request, next(iter(known), None), library)
                return replayed, vreq, known
            if cassette.write_protected and cassette.filter_request(vreq):
                error = UnrecordedRequest(
                    self.no_match(number, vreq), number=number, method=vreq.method, path=vreq.path
                )
                self.failures.append(error)
                raise error
        return None, vreq, known

    def _playable(self, vreq: VcrRequest) -> int | None:
        """The index of the first unplayed recorded interaction that matches ``vreq`` (method,
        path, body as JSON without the ignored keys: vcrpy's rule as :func:`make_vcr` sets
        it), or ``None``; called holding :attr:`lock`.

        vcrpy's own lookup tries every recorded interaction against every request, parsing
        both bodies each time: replaying a cassette of n interactions took n**2 parses (a
        200,000-interaction one had not finished in 300 s). Here the recorded requests are
        indexed once by their match key (:func:`_match_key`: equal bodies always share one),
        each candidate is confirmed by the matcher's own comparison, and each key's played
        interactions are skipped once for good: linear in the cassette's size."""
        cassette = self.cassette
        if cassette.record_mode == VcrRecordMode.ALL or not (
            cassette.rewound or cassette.allow_playback_repeats
        ):
            return None
        data = cassette.data
        while self._indexed < len(data):
            recorded = data[self._indexed][0]
            key = _match_key(recorded, self.ignore)
            self._index.setdefault(key, []).append(self._indexed)
            self._indexed += 1
        key = _match_key(vreq, self.ignore)
        bucket = self._index.get(key, [])
        sent = body_for_matching(vreq.body, self.ignore)
        start = self._cursor.get(key, 0)
        for at in range(start, len(bucket)):
            index = bucket[at]
            if cassette.play_counts[index] and not cassette.allow_playback_repeats:
                if at == start:
                    start += 1
                    self._cursor[key] = start  # played for good: never looked at again
                continue
            recorded = body_for_matching(data[index][0].body, self.ignore)
            if first_body_difference(recorded, sent) is None:
                return index
        return None

    def tee(self, response: Any, vreq: VcrRequest, known: Sequence[str], library: Library) -> None:
        """Record ``response`` (its stream teed, recorded when it ends)."""
        if hasattr(response, "_content"):  # already read and decoded (MockTransport content=)
            self.record(vreq, response, response.content, None, known, decoded=True)
            return
        stream = response.stream

        def on_end(data: bytes, error: Exception | None) -> None:
            self.record(vreq, response, data, error, known)

        if isinstance(stream, library.lib.SyncByteStream):
            response.stream = library.tee(stream, on_end)
        elif isinstance(stream, library.lib.AsyncByteStream):
            response.stream = library.async_tee(stream, on_end)

    def handle(
        self, original: Callable[[Any, Any], Any], transport: Any, request: Any, library: Library
    ) -> Any:
        """A sync transport's ``handle_request`` inside the cassette."""
        if request.extensions.get(SIDE_REQUEST):
            return _refuse_side_request(request, library)
        replayed, vreq, known = self.lookup(request, request.read(), library)
        if replayed is not None:
            return replayed
        response = original(transport, request)
        self.tee(response, vreq, known, library)
        return response

    async def handle_async(
        self,
        original: Callable[[Any, Any], Awaitable[Any]],
        transport: Any,
        request: Any,
        library: Library,
    ) -> Any:
        """An async transport's ``handle_async_request`` inside the cassette."""
        if request.extensions.get(SIDE_REQUEST):
            return _refuse_side_request(request, library)
        replayed, vreq, known = self.lookup(request, await request.aread(), library)
        if replayed is not None:
            return replayed
        response = await original(transport, request)
        self.tee(response, vreq, known, library)
        return response

    def record(
        self,
        vreq: VcrRequest,
        response: Any,
        body: bytes,
        error: Exception | None,
        known: Sequence[str],
        *,
        decoded: bool = False,
    ) -> None:
        """Append one interaction: the body as it reached the client (decoded with httpx's
        own decoders, ``Content-Encoding`` dropped) and the error that broke it, if any, with
        the request's credentials ``known`` hidden."""
        data = recorded_response(
            response.status_code,
            response.reason_phrase,
            response.headers.multi_items(),
            body,
            f"{type(error).__name__}: {error}" if error is not None else None,
            decoded=decoded,
        )
        hide_in_response(data, known)
        with self.lock:
            self.cassette.append(vreq, data)

    def no_match(self, number: int, vreq: VcrRequest) -> str:
        what = f"{self.path}: request {number} ({vreq.method} {vreq.path}) matches no recorded"
        cassette = self.cassette
        unplayed = [i for i in range(len(cassette.data)) if cassette.play_counts[i] == 0]
        for i in unplayed:
            recorded = cassette.data[i][0]
            if recorded.method == vreq.method and recorded.path == vreq.path:
                found = first_body_difference(
                    body_for_matching(recorded.body, self.ignore),
                    body_for_matching(vreq.body, self.ignore),
                )
                where = describe_difference(found) if found else "a place the matcher rejects"
                return (
                    f"{what} interaction: its body differs from recorded interaction {i + 1} "
                    f"at {where}"
                )
        if unplayed:
            nxt = cassette.data[unplayed[0]][0]
            return (
                f"{what} interaction: no unplayed one has this method and path "
                f"(the next unplayed, {unplayed[0] + 1}, is {nxt.method} {nxt.path})"
            )
        return f"{what} interaction: all {len(cassette.data)} recorded interactions were played"


def _match_key(request: VcrRequest, ignore: Sequence[str]) -> tuple[Any, ...]:
    """The key under which :meth:`_Run._playable` files a request: its method, its path, and
    its body as JSON (:func:`body_for_matching`) made hashable so that two bodies the matcher
    finds equal always share a key (Python's ``==`` on JSON values: key order ignored,
    ``1 == 1.0 == True``)."""
    return (request.method, request.path, _hashable(body_for_matching(request.body, ignore)))


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return ("{", tuple(sorted((str(k), _hashable(v)) for k, v in value.items())))
    if isinstance(value, list):
        return ("[", tuple(_hashable(v) for v in value))
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def recorded_response(
    status: int,
    reason: str | None,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    error: str | None = None,
    *,
    decoded: bool = False,
) -> dict[str, Any]:
    """A response as vcrpy's cassette stores it (``status``, ``headers``, ``body.string``,
    boxmaker's ``error``), before scrubbing: a body sent compressed (``Content-Encoding``) is
    stored as the client read it, decoded with httpx's own decoders (gzip, deflate, br, zstd),
    its ``Content-Encoding`` and ``Content-Length`` dropped; one cut mid-way that does not
    decode is stored as it came.

    Args:
        status: the HTTP status code.
        reason: the reason phrase (``None``: none).
        headers: the response's headers, in order, repeats kept.
        body: the bytes that arrived.
        error: the transport error that broke the body off (``"RemoteProtocolError: ..."``,
            the httpx class name first: replay raises that class), ``None`` when it ended.
        decoded: ``body`` is already decoded.
    """
    if not decoded and any(name.lower() == "content-encoding" for name, _ in headers):
        try:  # the same decoding httpx applied for the client (gzip, deflate, br, zstd)
            plain = httpx.Response(200, headers=list(headers), stream=httpx.ByteStream(body))
            body = plain.read()
            decoded = True
        except httpx.DecodingError:
            pass  # a compressed body cut mid-way is stored as it came
    kept: dict[str, list[str]] = {}
    for name, value in headers:
        if not (decoded and name.lower() in ("content-encoding", "content-length")):
            kept.setdefault(name, []).append(value)
    data: dict[str, Any] = {
        "status": {"code": status, "message": reason},
        "headers": kept,
        "body": {"string": body},
    }
    if error is not None:
        data["error"] = error
    return data


def _refuse_side_request(request: Any, library: Library) -> Any:
    """The answer to a side request (``boxmaker.client.SIDE_REQUEST``: cache forensics asking
    the template and tokenizer) inside a cassette: refused at once, neither sent, recorded
    nor matched. A cassette holds the chat traffic only (the tokenizer's answers would swell
    it), and its replay stays strict; the forensics then records the loss without a cause."""
    error = {
        "code": SIDE_REFUSED_STATUS,
        "type": SIDE_REFUSED,
        "message": f"no side request inside a cassette ({request.method} {request.url.path})",
    }
    return library.lib.Response(SIDE_REFUSED_STATUS, json={"error": error}, request=request)


@contextmanager
def _patched_transports(run: _Run) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for library in LIBRARIES:
            lib = library.lib
            for cls in (lib.HTTPTransport, lib.MockTransport):
                original = cls.handle_request

                def handle(
                    self: Any,
                    request: Any,
                    _original: Callable[[Any, Any], Any] = original,
                    _library: Library = library,
                ) -> Any:
                    return run.handle(_original, self, request, _library)

                stack.enter_context(mock.patch.object(cls, "handle_request", handle))
            for acls in (lib.AsyncHTTPTransport, lib.MockTransport):
                aoriginal = acls.handle_async_request

                async def ahandle(
                    self: Any,
                    request: Any,
                    _original: Callable[[Any, Any], Awaitable[Any]] = aoriginal,
                    _library: Library = library,
                ) -> Any:
                    return await run.handle_async(_original, self, request, _library)

                stack.enter_context(mock.patch.object(acls, "handle_async_request", ahandle))
        yield


@contextmanager
def streaming_into(
    cassette: Any,
    path: str | os.PathLike[str],
    *,
    secrets: Sequence[str] = (),
    ignore_body_keys: Sequence[str] = (),
) -> Iterator[Any]:
    """Inside the block, httpx requests play from or record into an open vcrpy ``cassette``
    with the stream live (the patch :func:`use_cassette` installs; also used on the cassette
    pytest-recording opens, :mod:`boxmaker.cassettes.pytest_plugin`).

    Args:
        cassette: an open vcrpy ``Cassette``; it gains ``failures`` (see :func:`use_cassette`).
        path: its file, named in error messages.
        secrets: more values to hide (see :func:`use_cassette`).
        ignore_body_keys: top-level request-body keys left out of the no-match message.

    Yields:
        the cassette.
    """
    run = _Run(cassette, Path(path), ignore_body_keys, secrets)
    cassette.failures = run.failures
    with _patched_transports(run):
        yield cassette


@contextmanager
def use_cassette(
    path: str | os.PathLike[str],
    record_mode: RecordMode = "none",
    *,
    strict: bool = True,
    secrets: Sequence[str] = (),
    ignore_body_keys: Sequence[str] = (),
) -> Iterator[Any]:
    """Record or replay every httpx request (sync or async client) inside the block with the
    cassette at ``path``.

    Args:
        path: the YAML file (created when recording).
        record_mode: vcrpy's mode: ``none`` replays only (no real request is made; a request
            with no match fails), ``once`` records when the file does not exist, ``new_episodes``
            adds new interactions, ``all`` re-records everything.
        strict: in ``none`` mode, fail when the block leaves interactions unplayed.
        secrets: more values replaced by ``<API_KEY>`` wherever they appear in an
            interaction (the request's own credentials always are: the ``Authorization``
            token, api-key headers, credential-like query and JSON values; see
            :mod:`~boxmaker.cassettes`); on replay they are hidden in each request before
            matching and the first is put back for ``<API_KEY>`` in the replayed response.
        ignore_body_keys: top-level request-body keys left out of matching.

    A response being recorded is appended when it ends, so close (or read to the end) every
    response inside the block: one still open when the block ends is not saved.

    Yields:
        vcrpy's ``Cassette`` (``play_count``, ``all_played``, ``data``...), with one more
        attribute, ``failures``: the :class:`UnrecordedRequest` of each request that matched
        nothing (so a caller that swallowed one can still fail).

    Raises:
        CassetteError: the file exists but is not a readable cassette (not UTF-8, not YAML,
            not shaped like a cassette); ``none`` mode and the file does not exist; a request
            matched no recorded interaction (:class:`UnrecordedRequest`, raised by the
            request itself; the message names the cassette, the request's number and the
            first place where its body differs, e.g. ``messages[3].content``); or
            (``strict``, ``none`` mode) the block ended normally with recorded interactions
            unplayed.
    """
    p = Path(path)
    if record_mode == "none" and not p.exists():
        raise CassetteError(f"{p}: no such cassette (record it with record_mode='once')")
    v = make_vcr(record_mode, ignore_body_keys=ignore_body_keys)
    with (
        v.use_cassette(str(p)) as cassette,
        streaming_into(cassette, p, secrets=secrets, ignore_body_keys=ignore_body_keys),
    ):
        yield cassette
    if strict and record_mode == "none" and unplayed(cassette):
        raise CassetteError(unplayed_message(cassette, p))


_LOOKS = ("/slots", "/props")
"""Paths of llama.cpp whose ``GET`` a client makes to schedule its requests (the slots, their
count), not to ask the model: a recording may hold them (the tap records what agents send)
while a replay, which needs no slot, does not ask them again."""


def unplayed(cassette: Any) -> list[int]:
    """The indexes of the recorded interactions not played, but for the client's looks at
    the server's slots (``GET`` of :data:`_LOOKS`: where a request ran, or how many slots
    there are, is no part of what the model was asked; ``ClientConfig.slot_choice``)."""
    return [
        i
        for i in range(len(cassette.data))
        if cassette.play_counts[i] == 0
        and not (cassette.data[i][0].method == "GET" and cassette.data[i][0].path.endswith(_LOOKS))
    ]


def unplayed_message(cassette: Any, path: str | os.PathLike[str]) -> str:
    """The message for a cassette whose recorded interactions were not all played
    (:func:`unplayed`): how many, and the first one's number, method and path."""
    unplayed_ = unplayed(cassette)
    first = cassette.data[unplayed_[0]][0] if unplayed_ else None
    where = f", the first is {unplayed_[0] + 1} ({first.method} {first.path})" if first else ""
    return f"{path}: {len(unplayed_)} recorded interaction(s) were not played{where}"
