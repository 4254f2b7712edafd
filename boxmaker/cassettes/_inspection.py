"""Reading cassettes: a transcript, the prefix check, a recorded stream, the recorded session.

What ``boxmaker cassette show|check`` prints is built here as data (strings, lists, data
classes); the printing is :mod:`boxmaker.cli`'s. A recorded stream is read with the client's
own decoder (:class:`~boxmaker.client.StreamDecoder`), so the transcript shows what the loop
saw.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..client import StreamDecoder
from ..config import Config, SamplingConfig, SlotsConfig, ThinkingConfig
from ..errors import BoxmakerError, CassetteError, InferError
from ..tools import canonical_arguments
from ._matching import describe_difference, first_body_difference, parse_body
from ._serializer import compact, load_interactions

__all__ = [
    "CHAT_PATH",
    "PrefixCheck",
    "RecordedSession",
    "StreamReading",
    "chat_interactions",
    "check_prefix",
    "prefix_problems",
    "read_stream",
    "recorded_session",
    "transcript",
]

CHAT_PATH = "/v1/chat/completions"
CONTROL_PATH = "/v1/chat/completions/control"
"""The path of llama-server's OpenAI-compatible chat endpoint."""

_SHOW_CHARS = 600


def _path_of(uri: str) -> str:
    return httpx.URL(uri).path


def _request_json(interaction: Mapping[str, Any]) -> Any:
    return parse_body(interaction["request"].get("body"))


def chat_interactions(interactions: Sequence[Mapping[str, Any]]) -> list[tuple[int, Any]]:
    """``(number, parsed body)`` of each chat-completion request of ``interactions`` (as
    :func:`~boxmaker.cassettes.load_interactions` gives them; numbers from 1)."""
    out = []
    for number, item in enumerate(interactions, 1):
        body = _request_json(item)
        if _path_of(item["request"]["uri"]) == CHAT_PATH and isinstance(body, dict):
            out.append((number, body))
    return out


@dataclass
class StreamReading:
    """What the client reads from a recorded chat-completion stream, as far as it can.

    Attributes:
        reasoning: joined ``delta.reasoning_content`` (``""`` if none).
        reasoning_tokens: reasoning deltas (llama.cpp sends about one token each); ``0`` for
            a whole ``chat.completion``, whose one message says nothing of its tokens.
        content: joined ``delta.content`` (``""`` if none).
        tool_calls: ``(id, name, arguments)`` per ``delta.tool_calls`` index, arguments joined.
        finish_reason: the ``finish_reason`` of the stream, ``None`` if none came.
        timings: llama.cpp's ``timings`` of the last chunk that carried them.
        problem: why the stream could not be read to its end (an error event, a malformed
            chunk, a cut), ``None`` when it ended with ``finish_reason`` or ``[DONE]``.
    """

    reasoning: str = ""
    reasoning_tokens: int = 0
    content: str = ""
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)
    finish_reason: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    problem: str | None = None


def read_stream(body: bytes) -> StreamReading:
    """Read a recorded chat-completion body with the client's own decoder
    (:class:`~boxmaker.client.StreamDecoder`), keeping what arrived before an error or a cut
    (an unterminated last event is not parsed). A body that is one JSON object is a whole
    ``chat.completion`` (a request sent with ``stream: false``, as a tapped agent may send it,
    or a server that answered ``application/json``): read as the client reads one."""
    decoder = StreamDecoder()
    out = StreamReading()
    whole = body.lstrip()[:1] == b"{"
    try:
        if whole:
            decoder.feed_completion(body.decode("utf-8", "replace"))
        else:
            decoder.feed(body)
        if not decoder.chunks.finished:
            cut = body.rfind(b"\n\n")
            tail = len(body) - cut - 2 if cut >= 0 else len(body)
            out.problem = f"the stream ended without finish_reason or [DONE] ({tail} bytes unread)"
    except InferError as exc:
        out.problem = str(exc)
    got = decoder.chunks.partial()
    out.reasoning, out.content = got.reasoning or "", got.content or ""
    out.reasoning_tokens = got.reasoning_tokens if not whole else 0
    out.tool_calls = [(c.id, c.name, c.arguments) for c in got.tool_calls]
    out.finish_reason, out.timings = got.finish_reason, dict(got.timings)
    return out


def _clip(text: str) -> str:
    text = text.replace("\n", "\n      ")
    if len(text) <= _SHOW_CHARS:
        return text
    return f"{text[:_SHOW_CHARS]}... ({len(text) - _SHOW_CHARS} more characters)"


def _message_line(message: Mapping[str, Any]) -> list[str]:
    role = message.get("role", "?")
    lines = []
    head = f"  + {role}"
    if role == "tool":
        head += f" [{message.get('tool_call_id', '')}]"
    if message.get("reasoning_content"):
        lines.append(f"{head} reasoning: {_clip(str(message['reasoning_content']))}")
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        lines.append(f"{head} tool call {fn.get('name')} {fn.get('arguments')} [{call.get('id')}]")
    content = message.get("content")
    if content or not lines:
        lines.append(f"{head}: {_clip(str(content or ''))}")
    return lines


def _completion_id(raw: bytes) -> str | None:
    """The ``id`` of the first chunk of a recorded chat stream (llama.cpp's completion id)."""
    match = _STREAM_ID.search(raw[:4096])
    return match.group(1).decode("utf-8", "replace") if match else None


_STREAM_ID = re.compile(rb'"id"\s*:\s*"([^"]+)"')


def _in_order(interactions: Sequence[Mapping[str, Any]]) -> list[tuple[int, Mapping[str, Any]]]:
    """The interactions numbered as recorded, each reasoning-control request moved to right
    after the chat completion it acted on (its body's ``id`` is the stream's id). The control
    request ends while its stream still runs, so the recorder writes it first."""
    numbered = list(enumerate(interactions, 1))
    chats: dict[str | None, list[int]] = {}  # completion id -> its chats' numbers, ascending
    for number, item in numbered:
        if _path_of(item["request"]["uri"]) == CHAT_PATH:
            cid = _completion_id(item["response"]["body"]["string"] or b"")
            chats.setdefault(cid, []).append(number)
    after: dict[int, list[tuple[int, Mapping[str, Any]]]] = {}
    kept: list[tuple[int, Mapping[str, Any]]] = []
    for number, item in numbered:
        target = None
        if _path_of(item["request"]["uri"]) == CONTROL_PATH:
            body = _request_json(item)
            wanted = chats.get(str(body.get("id"))) if isinstance(body, dict) else None
            # the first chat recorded after it with that id (none: it stays where it is);
            # found by bisection, not by a scan of every chat for every interaction (a
            # 200,000-interaction cassette's show never ended)
            at = bisect.bisect_right(wanted, number) if wanted else 0
            target = wanted[at] if wanted and at < len(wanted) else None
        if target is not None:
            after.setdefault(target, []).append((number, item))
        else:
            kept.append((number, item))
    out: list[tuple[int, Mapping[str, Any]]] = []
    for number, item in kept:
        out.append((number, item))
        out.extend(after.get(number, []))
    return out


def transcript(path: str | os.PathLike[str]) -> str:
    """A readable transcript of a cassette (what ``boxmaker cassette show`` prints).

    For each interaction: its number (the order recorded), method, path and status; for a chat
    request the messages it adds to the previous chat request (all of them when it does not
    extend it), then the streamed answer as the client reads it (reasoning, content, tool
    calls, finish reason) and llama.cpp's timings; for other requests (reasoning control) the
    bodies. A reasoning-control request (``reasoning_end``) is listed right after the
    completion it ended, though recorded before it (it returns while the stream still runs).

    Raises:
        CassetteError: the file is not a readable cassette, or an interaction's request is
            not shaped as a chat request (messages that are not a list of objects...: the
            message names the interaction).
    """
    interactions = load_interactions(path)
    out = [f"{path}: {len(interactions)} interaction(s)"]
    previous: list[Any] = []
    for number, item in _in_order(interactions):
        with unreadable_as_cassette_error(path, f"interaction {number} cannot be shown"):
            previous = _show(number, item, previous, out)
    return "\n".join(out)


def _show(number: int, item: Mapping[str, Any], previous: list[Any], out: list[str]) -> list[Any]:
    """Append interaction ``number``'s lines to ``out``; the messages of the last chat request
    shown (``previous`` unless this one is a chat request)."""
    request, response = item["request"], item["response"]
    status = (response.get("status") or {}).get("code")
    where = _path_of(request["uri"])
    body = _request_json(item)
    out.append("")
    out.append(f"[{number}] {request['method']} {where} -> {status}")
    raw = response["body"]["string"] or b""
    if where != CHAT_PATH or not isinstance(body, dict):
        out.append(f"  request: {_clip(compact(body))}")
        out.append(f"  answer: {_clip(raw.decode('utf-8', 'replace'))}")
        return previous
    messages = list(body.get("messages") or [])
    extends = messages[: len(previous)] == previous and bool(previous)
    new = messages[len(previous) :] if extends else messages
    settings = ", ".join(
        f"{k} {compact(body[k])}"
        for k in ("id_slot", "temperature", "max_tokens", "seed")
        if k in body
    )
    tools = [t.get("function", {}).get("name") for t in body.get("tools") or []]
    out.append(f"  {settings}; tools: {', '.join(map(str, tools)) or 'none'}")
    if previous and not extends:
        out.append("  (does not extend the previous chat request: all its messages)")
    elif extends and not new:
        out.append("  (the same messages as the previous chat request: a retry)")
    for message in new:
        out.extend(_message_line(message))
    if status != 200:
        out.append(f"  error answer: {_clip(raw.decode('utf-8', 'replace'))}")
        return messages
    reading = read_stream(raw)
    if reading.reasoning:
        out.append(
            f"  = reasoning ({reading.reasoning_tokens} tokens): {_clip(reading.reasoning)}"
            if reading.reasoning_tokens
            else f"  = reasoning: {_clip(reading.reasoning)}"
        )
    if reading.content:
        out.append(f"  = content: {_clip(reading.content)}")
    for call_id, name, arguments in reading.tool_calls:
        out.append(f"  = tool call {name} {arguments} [{call_id}]")
    if reading.finish_reason:
        out.append(f"  = finish: {reading.finish_reason}")
    if reading.timings:
        t = reading.timings
        names = ("cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms")
        out.append("  = timings: " + ", ".join(f"{k} {t[k]:g}" for k in names if k in t))
    if reading.problem:
        out.append(f"  ! {reading.problem}")
    if response.get("error"):
        out.append(f"  ! transport error after the recorded bytes: {response['error']}")
    return messages


@dataclass(frozen=True)
class PrefixCheck:
    """The outcome of :func:`check_prefix` for one cassette.

    Attributes:
        path: the cassette.
        chat_requests: how many chat requests it holds.
        problems: one line per request that does not extend the previous one (empty: all do).
    """

    path: str
    chat_requests: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        """Every chat request extends the previous one."""
        return not self.problems


def check_prefix(path: str | os.PathLike[str]) -> PrefixCheck:
    """Check that every chat request of a cassette extends the previous one
    (what ``boxmaker cassette check`` reports; the lines are :func:`prefix_problems`').

    Raises:
        CassetteError: the file is not a readable cassette.
    """
    chats = chat_interactions(load_interactions(path))
    with unreadable_as_cassette_error(path, "a chat request cannot be compared"):
        return PrefixCheck(str(path), len(chats), _breaks(chats))


def prefix_problems(path: str | os.PathLike[str]) -> list[str]:
    """Where the chat requests of a cassette do not each extend the previous one.

    A request extends the previous chat request when the earlier messages are a prefix of its
    own, byte for byte once serialised (so llama.cpp's prompt cache can reuse them), and its
    ``tools`` are the same. Returns one line per break (empty: every request extends the
    previous one), e.g. ``interaction 5 does not extend interaction 3: messages[2].content
    (recorded 'a', sent 'b')``.

    Raises:
        CassetteError: the file is not a readable cassette.
    """
    return check_prefix(path).problems


def _breaks(chats: Sequence[tuple[int, Any]]) -> list[str]:
    problems = []
    for (before_n, before), (number, body) in itertools.pairwise(chats):
        what = f"interaction {number} does not extend interaction {before_n}"
        old, new = list(before.get("messages") or []), list(body.get("messages") or [])
        if len(new) < len(old):
            problems.append(f"{what}: it has {len(new)} messages, the earlier one {len(old)}")
            continue
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            found = first_body_difference(a, b, f"messages[{i}]")
            if found:
                problems.append(f"{what}: {describe_difference(found)}")
                break
            if compact(a) != compact(b):
                problems.append(f"{what}: messages[{i}] has its keys in another order")
                break
        else:
            found = first_body_difference(before.get("tools"), body.get("tools"), "tools")
            if found:
                problems.append(f"{what}: the tools changed at {describe_difference(found)}")
    return problems


@dataclass(frozen=True, kw_only=True)
class RecordedSession:
    """A session as its cassette holds it, enough to run the loop on it again.

    Attributes:
        system: the system prompt (the first request's leading ``system`` message, else ``""``).
        tools: the first request's ``tools`` (OpenAI definitions), sent as recorded.
        users: the user message of each turn: the last message of each chat request that ends
            with a ``user`` message (a retry of the same request counts once).
        results: recorded tool results by ``(tool name, canonical JSON arguments)``, in order
            (from the ``tool`` messages of later requests, via their ``tool_call_id``).
        config: the knobs the requests show: ``id_slot``, ``temperature``, ``max_tokens``,
            ``seed``, ``chat_template_kwargs.enable_thinking``; the loop limits are defaults.
        chat_requests: how many chat requests the cassette holds.
    """

    system: str
    tools: tuple[dict[str, Any], ...]
    users: tuple[str, ...]
    results: dict[tuple[str, str], list[str]]
    config: Config
    chat_requests: int


@contextlib.contextmanager
def unreadable_as_cassette_error(path: str | os.PathLike[str], what: str) -> Iterator[None]:
    """Around code that reads a recording's requests: a recorded value of the wrong shape (a
    string where messages belong, a tool with an invalid name or schema, a sampling value out
    of range) becomes one :class:`CassetteError` naming the file and ``what`` was read, not a
    bare ``TypeError`` or another part's error (issue 23: 33 of 1,500 mutated cassettes)."""
    try:
        yield
    except CassetteError:
        raise
    except (BoxmakerError, TypeError, ValueError, AttributeError, KeyError) as exc:
        raise CassetteError(f"{path}: {what}: {type(exc).__name__}: {exc}") from exc


def recorded_session(path: str | os.PathLike[str]) -> RecordedSession:
    """Read a :class:`RecordedSession` from a cassette.

    Raises:
        CassetteError: not a readable cassette, no chat request in it, or a recorded request
            whose body is not shaped as a chat-completions request (OpenAI API).
    """
    chats = chat_interactions(load_interactions(path))
    with unreadable_as_cassette_error(path, "a recorded request cannot be replayed"):
        return _recorded_session(path, chats)


def _recorded_session(
    path: str | os.PathLike[str], chats: list[tuple[int, Any]]
) -> RecordedSession:
    if not chats:
        raise CassetteError(f"{path}: no {CHAT_PATH} request to replay")
    first = chats[0][1]
    messages = list(first.get("messages") or [])
    system = ""
    if messages and messages[0].get("role") == "system":
        system = str(messages[0].get("content") or "")
    users: list[str] = []
    results: dict[tuple[str, str], list[str]] = {}
    calls: dict[str, tuple[str, str]] = {}
    answered: set[str] = set()
    previous: list[Any] | None = None
    for _, body in chats:
        msgs = list(body.get("messages") or [])
        if msgs and msgs[-1].get("role") == "user" and msgs != previous:
            users.append(str(msgs[-1].get("content") or ""))
        previous = msgs
        for message in msgs:
            for call in message.get("tool_calls") or []:
                fn = call.get("function") or {}
                args = canonical_arguments(str(fn.get("arguments") or ""))
                calls[str(call.get("id"))] = (str(fn.get("name")), args)
            call_id = str(message.get("tool_call_id"))
            if message.get("role") == "tool" and call_id in calls and call_id not in answered:
                answered.add(call_id)
                results.setdefault(calls[call_id], []).append(str(message.get("content") or ""))
    thinking = (first.get("chat_template_kwargs") or {}).get("enable_thinking", True)
    defaults = SamplingConfig()
    config = Config(
        slots=SlotsConfig(main=int(first.get("id_slot", 0))),
        sampling=SamplingConfig(
            temperature=float(first.get("temperature", defaults.temperature)),
            max_tokens=first.get("max_tokens"),
            seed=first.get("seed"),
        ),
        thinking=ThinkingConfig(enabled=bool(thinking)),
    )
    return RecordedSession(
        system=system,
        tools=tuple(first.get("tools") or ()),
        users=tuple(users),
        results=results,
        config=config,
        chat_requests=len(chats),
    )
