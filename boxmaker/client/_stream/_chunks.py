"""Parsed chat-completion chunks -> client events and one :class:`Completion`.

The chunks follow the OpenAI chat-completions streaming format (``choices[0].delta`` with
``content``, ``tool_calls``) plus llama.cpp's additions (``delta.reasoning_content``,
``prompt_progress``, ``timings``; see llama.cpp's ``tools/server/README.md``) and the shapes
other OpenAI-compatible servers send (``delta.reasoning``, arguments as a JSON object, tool
calls without ``index``, ``</think>`` in content). :class:`ChunkDecoder` is the second layer of
:class:`boxmaker.client.StreamDecoder`; no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from ...errors import InferError, StreamCut
from ...events import (
    CapNotEnforced,
    ClientEvent,
    Progress,
    ThinkingCapped,
    Waiting,
)
from ...records import ToolCall
from ...tools import canonical_arguments
from .._errors import stream_error
from ._completion import Completion, reported_reasoning
from ._fast import FastChunks, tool_call_delta
from ._shape import (
    LoadingBlock,
    carries_error,
    content_parts,
    joined,
    opens_stream,
    proxy_note,
    reasoning_only,
)
from ._think_tags import Emit

__all__ = ["ChunkDecoder", "Completion"]

_WAITING = Waiting()


class _CallParts:
    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []


class ChunkDecoder(FastChunks):
    """Parsed stream chunks -> client events, accumulating one :class:`Completion`.

    Feed each ``data:`` JSON object (OpenAI ``chat.completion.chunk`` with llama.cpp's
    additions) to :meth:`feed`; call :meth:`mark_done` on ``data: [DONE]``; then
    :meth:`finish` gives the :class:`Completion`.

    Events per chunk, in this order:

    - ``prompt_progress`` -> :class:`~boxmaker.events.Progress`; when ``processed`` reaches
      ``total`` -> :class:`~boxmaker.events.Waiting`;
    - the first chunk without ``prompt_progress`` before any token -> ``Waiting`` (builds
      without progress), so ``Waiting`` comes exactly once, before the first token;
    - ``delta.reasoning_content`` (llama.cpp), or ``delta.reasoning`` when that is absent
      (Ollama, vLLM, routers) -> :class:`~boxmaker.events.Reasoning` (counted in
      :attr:`reasoning_tokens`), ``delta.content`` -> :class:`~boxmaker.events.Content`,
      each ``delta.tool_calls[i]`` -> :class:`~boxmaker.events.ToolCallDelta`.

    Tool calls: a delta belongs to the call last seen at its ``index`` (a delta without
    ``index``: the call with its ``id``, else the last call), unless it is the head of a new
    call there: an ``id`` other than that call's and a ``name``, after that call's arguments
    are a whole JSON value (parallel calls sent at one index; see :func:`_starts_call`).
    Later ids of a call are ignored (it keeps the first), a name that restates the call's is
    no change, any other name fragment continues it (``get_`` + ``weather``).
    ``ToolCallDelta.index`` is the call's number: the server's ``index``, or, for a call
    started at a taken index or without index, one more than the highest number so far;
    :attr:`Completion.tool_calls` are in number order. The event's ``id`` is the call's id
    on the delta that gave it (``None`` later), its ``name`` the call's name so far on a
    delta that changed it (``None`` otherwise). ``arguments`` sent as a JSON object become
    canonical JSON text (:func:`boxmaker.tools.canonical_arguments`' form). Texts are
    joined by :func:`joined` (the two halves of a surrogate pair cut between deltas make
    one character).

    ``delta.content`` may be a list of typed parts (Mistral): :func:`content_parts`. An
    ``"error": null`` member is no error (:func:`carries_error`).

    ``</think>`` in ``content`` with no opening tag (templates that put ``<think>`` in the
    prompt): until a reasoning delta or a ``<think>`` in content comes, a possible partial
    tag at the end of a content delta is held back (``"</th"`` waits for ``"ink>"``). When
    ``</think>`` completes, all content before it becomes ``reasoning`` (its deltas counted
    in :attr:`reasoning_tokens`), the tag is dropped, what follows is ``content``; the
    :class:`Completion` is the same wherever the deltas were cut. Events: earlier deltas were
    already emitted as ``Content`` (nothing tells before the tag), the closing delta's text
    before the tag comes as ``Reasoning``, the rest as ``Content``, the tag never. A held-back
    piece that is no tag comes with the next content, or at ``finish_reason``/``[DONE]``.

    ``<think>`` opening the content (servers started with ``--reasoning-format none`` stream
    the whole ``<think>...</think>`` block as content): while nothing but whitespace came as
    content, a possible partial ``<think>`` is held back; once it completes, the tag and the
    whitespace before it are dropped and each content delta up to ``</think>`` (which may be
    split across deltas too) is ``reasoning``, counted in :attr:`reasoning_tokens` as it
    arrives (so a thinking cap can fire while it streams) and emitted as ``Reasoning``;
    after ``</think>`` comes ``content``. A ``<think>`` after other content is content.

    ``finish_reason: ""`` (SGLang, Ollama) is no finish, as ``null``. A proxy's own chunks
    before the model's (llama-swap's loading notes) are kept apart, and a new ``id`` or a
    role in each chunk (LiteLLM, ms-swift, Foundry Local) starts no new stream, see
    :meth:`_take_id`.

    ``timings`` and ``usage`` are taken from the last chunk that carries them (llama.cpp puts
    them on the finish chunk, or on a trailing ``"choices": []`` chunk when
    ``stream_options.include_usage`` is set).

    A chunk of the usual shape (one text or arguments member in an otherwise unchanged
    chunk) can be given as its JSON text to :meth:`feed_usual` instead, which reads it
    without parsing, with the same events and state (:class:`FastChunks`;
    :meth:`feed` learns the shape from the chunks it parses when given their ``text``).

    Attributes:
        id: the stream's completion id (``"chatcmpl-..."``), ``""`` until one arrives.
        finish_reason: the ``finish_reason`` once a chunk carried one, else ``None``.
        done: ``data: [DONE]`` was received (:meth:`mark_done`).
        chunks: number of chunks fed.
        reasoning_tokens: reasoning deltas received so far (both reasoning fields, and the
            content deltas moved to reasoning by a ``</think>``).
        reasoning_from_tag: the reasoning came as content closed by ``</think>``, and it has
            ended (a thinking cap has nothing left to stop).
        reasoning_in_content: the reasoning came inside ``<think>...</think>`` in content.
        cap_warning: why the thinking cap could not be enforced (:meth:`mark_unenforced`),
            else ``None``.
        cap_moot: the cap had nothing to cap (:meth:`mark_moot`: the model does not reason).
        thinking_capped: :meth:`mark_capped` was called.
        timings: llama.cpp ``timings`` so far (``{}`` if none).
        tool_call_deltas: whether :class:`~boxmaker.events.ToolCallDelta` events are
            made (the constructor's keyword, default ``True``). ``False`` when nobody
            listens to them (the turn loop drops them; a tool-call chunk then costs no
            event); the calls are joined into the :class:`Completion` either way.
        usage: OpenAI ``usage`` so far (``{}`` if none).
        whole: the chunk fed stands for a whole ``chat.completion``
            (:meth:`StreamDecoder.feed_completion` sets it): its reasoning is not counted by
            deltas (see :attr:`Completion.whole`).
    """

    __slots__ = (
        "_at_index",
        "_block",
        "_by_id",
        "_calls",
        "_opened",
        "_proxy",
        "_text",
        "_varied",
        "_waiting",
        "cap_moot",
        "cap_warning",
        "done",
        "finish_reason",
        "id",
        "thinking_capped",
        "timings",
        "tool_call_deltas",
        "usage",
        "whole",
    )

    def __init__(self, *, tool_call_deltas: bool = True) -> None:
        FastChunks.__init__(self)
        self.tool_call_deltas = tool_call_deltas
        self.id = ""
        self.finish_reason: str | None = None
        self.done = False
        self.chunks = 0
        self.reasoning_tokens = 0
        self.thinking_capped = False
        self.timings: dict[str, float] = {}
        self.usage: dict[str, Any] = {}
        self.whole = False
        self.reasoning_from_tag = False
        self.reasoning_in_content = False
        self.cap_warning: str | None = None
        self.cap_moot = False  # the cap had nothing to cap (mark_moot)
        self._in_think = False  # inside a <think> that opened the content
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, _CallParts] = {}  # call number -> its parts
        self._at_index: dict[int, int] = {}  # server index -> number of its latest call
        self._by_id: dict[str, int] = {}  # call id -> number of its latest call
        self._last = 0  # number of the call of the last tool-call delta
        self._waiting = False  # Waiting was emitted (or cannot be any more)
        self._undecided = True  # content may still be reasoning closed by </think>
        self._tail = ""  # held-back end of content that may be the start of a tag
        self._tag_deltas = 0  # content deltas that carried text while undecided
        self._text: str | None = None  # the JSON text of the chunk being fed, if orjson's
        self._proxy: list[str] = []  # a proxy's own text before the model's chunks
        self._block = LoadingBlock()  # llama-swap's loading block at the stream's start
        self._opened = False  # a chunk opened the stream (a role or prompt progress)
        self._varied = False  # the chunks' ids varied before the stream opened

    @property
    def finished(self) -> bool:
        """Whether the stream has ended properly: a ``finish_reason`` or ``[DONE]`` came."""
        return self.finish_reason is not None or self.done

    @property
    def provisional(self) -> bool:
        """Whether the reasoning so far may still turn out a proxy's, under the proxy's own
        ``id`` (:meth:`_take_id`'s third way: reasoning fields in chunks of one ``id`` that
        opened no stream, nothing else yet). The thinking cap sends no ``reasoning_end``
        meanwhile: it would go out for the proxy's id. llama.cpp opens its stream with its
        first chunk (a role and prompt progress), so its reasoning is never provisional."""
        return bool(
            self._reasoning
            and self.id
            and not self.reasoning_in_content
            and not (self._opened or self._varied or self._content or self._calls)
        )

    @property
    def answering(self) -> bool:
        """Whether the answer has started: a tool-call delta, content known not to be
        reasoning, or a ``finish_reason`` (so any reasoning of this completion is over)."""
        return (
            bool(self._calls)
            or self.finish_reason is not None
            or (not self._undecided and bool(self._content))
        )

    def feed(self, obj: dict[str, Any], text: str | None = None) -> list[ClientEvent]:
        """Take one parsed chunk; return the events it carries.

        The steps, in order: the chunk's ``id`` (:meth:`_take_id`, which also tells a
        proxy's own chunks from the model's), an ``error`` object, ``prompt_progress`` or
        ``Waiting``, the delta (reasoning, content, tool calls), ``finish_reason``, then
        ``timings`` and ``usage``.

        Args:
            obj: the chunk's JSON object.
            text: the JSON text ``obj`` was parsed from by orjson, if it was. orjson reads
                integers beyond 64 bits as floats, so every value kept that is not a string
                or a 64-bit integer (``timings``, ``usage``, ``prompt_progress``, an error
                object, arguments sent as a JSON value, odd types where a string belongs) is
                taken from :func:`json.loads` of ``text`` instead: the result is exactly
                the one of ``json.loads``. ``None``: ``obj`` is used as it is.

        Raises:
            InferError: the chunk is an error object (``{"error": {...}}``; ``status`` is
                ``error.code`` when present), or its shape is not a chat-completion chunk
                (a ``delta.content`` that is neither a string nor ``null`` included).
        """
        self.chunks += 1
        self._text = text
        events: list[ClientEvent] = []
        emit = events.append
        try:
            if self._take_id(obj):
                if carries_error(obj):
                    exact = self._exact(obj)
                    raise stream_error(exact, json.dumps(exact, ensure_ascii=False))
                self._progress_or_waiting(obj, emit)
                choices = obj.get("choices")
                if choices:
                    choice = choices[0]
                    delta = choice.get("delta")
                    if delta:
                        self._delta(delta, obj, emit)
                    self._finish_reason(choice, obj, emit)
                self._totals(obj)
        except (AttributeError, TypeError, ValueError, KeyError, RecursionError) as exc:
            raise self._malformed(obj, exc) from exc
        if self._text is not None and self._learn_tries > 0:
            self.learn(self._text)
        return events

    # -- the steps of feed, in order --------------------------------------------------------

    def _take_id(self, obj: dict[str, Any]) -> bool:
        """Tell a proxy's own chunks from the model's; keep the stream's completion id.
        ``False``: the chunk is a proxy's text, kept as :attr:`Completion.proxy_text` and
        nothing else (no event, not reasoning, not counted by the thinking cap, its id not
        taken: ``reasoning_end`` never goes out for it).

        A proxy's text before the model's stream, three ways:

        - a :func:`proxy_note` (llama-swap's chunk shape, no ``id``) before any ``id`` came;
        - llama-swap's loading block, told by its marks (:class:`LoadingBlock`), whatever
          the chunks' ``id`` and shape (llama-swap behind another proxy);
        - reasoning that came, before the stream opened, in chunks of one ``id``, followed by
          a chunk under another ``id`` that opens a stream (:func:`opens_stream`: a role or
          prompt progress) before any content, tool call or finish: that reasoning was a
          proxy's under its own chunk id; it moves to :attr:`Completion.proxy_text`,
          uncounted, and the new ``id`` is the completion's.

        Once a stream opened, or when the ids of its chunks vary before it does, ids and
        roles change nothing: LiteLLM and ms-swift send a new ``id`` with each chunk
        (``"role": null`` or ``"assistant"`` in each), Foundry Local a new ``id`` and a role;
        the completion id stays the first one.
        """
        cid = obj.get("id")
        if not self._block.over:
            text = reasoning_only(obj)
            if text is not None and self._block.take(text):
                self._proxy.append(text)
                return False
            self._block.end()
        if not self.id and cid is None and (note := proxy_note(obj)) is not None:
            self._proxy.append(note)
            return False
        if cid.__class__ is str and cid:
            if not self.id:
                self.id = cid
            elif cid != self.id:
                if self._proxy_before(obj):
                    self._proxy += self._reasoning
                    self._reasoning = []
                    self.reasoning_tokens = 0
                    self._undecided = True  # the proxy's reasoning decided nothing
                    self.id = cid
                else:
                    self._varied = True
        if not self._opened and opens_stream(obj):
            self._opened = True
        return True

    def _proxy_before(self, obj: dict[str, Any]) -> bool:
        """Whether ``obj`` (under a new ``id``) opens the model's stream after nothing but
        reasoning in chunks of one ``id`` that opened no stream (so that reasoning came from
        someone else)."""
        if self._opened or self._varied or not self._reasoning:
            return False
        if self._content or self._calls or self._tail or self.finish_reason is not None:
            return False
        return opens_stream(obj)

    def _progress_or_waiting(self, obj: dict[str, Any], emit: Callable[[ClientEvent], Any]) -> None:
        """``prompt_progress`` -> ``Progress`` (and ``Waiting`` once it is complete); the
        first chunk without it before any token -> ``Waiting``."""
        if "prompt_progress" in obj and obj["prompt_progress"] is not None:
            self._progress(self._exact(obj)["prompt_progress"], emit)
        elif not self._waiting:
            self._waiting = True
            emit(_WAITING)

    def _delta(
        self, delta: dict[str, Any], obj: dict[str, Any], emit: Callable[[ClientEvent], Any]
    ) -> None:
        """The delta's reasoning, content and tool calls, in that order. ``content`` may be a
        string or a list of typed parts (:func:`content_parts`: text parts are content,
        thinking parts reasoning)."""
        calls = delta.get("tool_calls")
        if calls is None or len(delta) > 1:  # not a delta of tool calls alone
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning and reasoning.__class__ is str:
                self._add_reasoning(reasoning, emit)
            content = delta.get("content")
            if content:
                if content.__class__ is list:
                    content, thinking = content_parts(content)
                    if thinking:
                        self._add_reasoning(thinking, emit)
                elif content.__class__ is not str:
                    raise TypeError("delta.content is neither a string nor a list of parts")
                if content:
                    self._add_content(content, emit)
        if calls:
            self._tool_calls(calls, obj, emit)

    def _finish_reason(
        self, choice: dict[str, Any], obj: dict[str, Any], emit: Callable[[ClientEvent], Any]
    ) -> None:
        """Keep ``finish_reason``. ``""`` means not finished, as ``null`` does (SGLang and
        some Ollama builds send ``"finish_reason": ""`` on every chunk before the last)."""
        reason = choice.get("finish_reason")
        if reason:
            if reason.__class__ is not str:
                reason = self._exact(obj)["choices"][0]["finish_reason"]
            self.finish_reason = reason
            if self._tail:
                self._decide(emit)

    def _totals(self, obj: dict[str, Any]) -> None:
        """``timings`` and ``usage``, from the last chunk that carries them (not empty:
        LiteLLM writes ``"usage": {}`` into every chunk; servers that send running totals
        with each chunk end with the whole figures)."""
        if obj.get("timings"):
            self.timings = dict(self._exact(obj)["timings"])
        if obj.get("usage"):
            self.usage = dict(self._exact(obj)["usage"])

    def _malformed(self, obj: dict[str, Any], exc: Exception) -> InferError:
        """The error for a chunk whose shape is not a chat-completion chunk's."""
        try:
            text = json.dumps(self._exact(obj), ensure_ascii=False)[:500]
        except (ValueError, RecursionError):  # nested deeper than json's recursion limit
            text = (self._text or "")[:500]
        return InferError(f"malformed chunk from llama-server ({exc!r}): {text}", body=text)

    def _exact(self, obj: dict[str, Any]) -> Any:
        """The chunk as :func:`json.loads` reads it (see :meth:`feed`'s ``text``)."""
        return obj if self._text is None else json.loads(self._text)

    def _exact_call(self, obj: dict[str, Any], calls: list[Any], call: Any) -> Any:
        """The tool call ``call`` (an element of ``calls``, the tool calls of ``obj``) as
        :func:`json.loads` reads it."""
        at = next((i for i, c in enumerate(calls) if c is call), None)
        if self._text is None or at is None:  # not orjson's, or already the exact one
            return call
        return self._exact(obj)["choices"][0]["delta"]["tool_calls"][at]

    def _progress(self, progress: Any, emit: Emit) -> None:
        total = int(progress.get("total", 0))
        processed = int(progress.get("processed", 0))
        emit(
            Progress(
                total=total,
                cache=int(progress.get("cache", 0)),
                processed=processed,
                time_ms=float(progress.get("time_ms", 0.0)),
            )
        )
        if not self._waiting and processed >= total:
            self._waiting = True
            emit(_WAITING)

    def _tool_calls(self, calls: list[dict[str, Any]], obj: dict[str, Any], emit: Emit) -> None:
        """The delta's tool calls (see the class docstring for how a delta finds its call)."""
        call = calls[0]
        function = call.get("function")
        if (  # the usual fragment: more arguments for the call at a known index
            len(calls) == 1
            and "id" not in call
            and (index := call.get("index")).__class__ is int
            and (number := self._at_index.get(index)) is not None
            and function.__class__ is dict
            and "name" not in function
            and (arguments := function.get("arguments")).__class__ is str
        ):
            self._add_fragment(number, arguments, emit)
            return
        for call in calls:
            call_id = call.get("id") or ""
            index = call.get("index")
            if call_id.__class__ is not str or (index is not None and index.__class__ is not int):
                call = self._exact_call(obj, calls, call)
                call_id = call.get("id") or ""
                index = call.get("index")
            function = call.get("function") or {}
            name = function.get("name") or ""
            if name.__class__ is not str:  # an odd value, kept as json.loads reads it
                name = self._exact_call(obj, calls, call)["function"]["name"]
            number = self._call_number(index, call_id, name)
            self._last = number
            parts = self._calls[number]
            new_id = None
            if call_id and not parts.id:  # the first id names the call (Poolside sends others)
                parts.id = new_id = call_id
                self._by_id[call_id] = number
            new_name = _name(parts, name) if name else None
            arguments = function.get("arguments")
            if arguments is None:
                arguments = ""
            elif arguments.__class__ is not str:  # a JSON value instead of its text
                arguments = self._exact_call(obj, calls, call)["function"]["arguments"]
                arguments = canonical_arguments(json.dumps(arguments, ensure_ascii=False))
            if arguments:
                parts.arguments.append(arguments)
            if self.tool_call_deltas:
                emit(tool_call_delta(number, new_id, new_name, arguments))

    def _call_number(self, index: Any, call_id: str, name: Any) -> int:
        """The number of the call a tool-call delta belongs to: the call at its ``index`` (or,
        without index, the call with its ``id``, else the last call), unless the delta
        starts a new call there (:func:`_starts_call`); then a new number."""
        calls = self._calls
        if index is not None:
            index = int(index)
            number = self._at_index.get(index)
        elif call_id and call_id in self._by_id:
            return self._by_id[call_id]
        else:
            number = self._last if calls else None
        if number is not None and not _starts_call(calls[number], call_id, name):
            return number
        if index is not None:
            number = index if index not in calls else max(calls) + 1
            self._at_index[index] = number
            self.forget_call()  # the index names another call from now on
        else:
            number = max(calls) + 1 if calls else 0
        calls[number] = _CallParts()
        return number

    def mark_done(self) -> list[ClientEvent]:
        """Record that ``data: [DONE]`` arrived (the stream ended properly); return the
        events still due (a held-back partial ``</think>`` that was content after all)."""
        self.done = True
        events: list[ClientEvent] = []
        if self._tail:
            self._decide(events.append)
        return events

    def mark_capped(self) -> ThinkingCapped:
        """Record that reasoning was ended by the cap (the server's ``thinking_budget_tokens``
        or ``reasoning_end``); return the event to emit."""
        self.thinking_capped = True
        return ThinkingCapped(reasoning_tokens=self.reasoning_tokens)

    def mark_unenforced(self, why: str) -> CapNotEnforced:
        """Record that the thinking cap could not be enforced on this completion (``why``);
        return the event to emit."""
        self.cap_warning = why
        return CapNotEnforced(reasoning_tokens=self.reasoning_tokens, detail=why)

    def mark_moot(self, why: str) -> CapNotEnforced:
        """Record that the thinking cap had nothing to cap on this completion (a model that
        does not reason: ``why``); the event to emit says so, and no limit was hit."""
        event = self.mark_unenforced(why)
        self.cap_moot = True
        return event

    def finish(self) -> Completion:
        """The accumulated completion.

        Raises:
            StreamCut: the stream ended with neither a ``finish_reason`` nor ``[DONE]``.
        """
        if not self.finished:
            raise StreamCut(
                f"stream cut: llama-server's stream ended after {self.chunks} chunks without "
                "finish_reason or [DONE]"
            )
        return self.partial()

    def partial(self) -> Completion:
        """What arrived so far as a :class:`Completion`, whether or not the stream finished
        (for a cut or failed stream: the text and calls received before it broke)."""
        calls = tuple(
            ToolCall(
                id=parts.id or _made_up_call_id(self.id, number),
                name=joined([parts.name]) if parts.name.__class__ is str else parts.name,
                arguments=joined(parts.arguments),
            )
            for number, parts in sorted(self._calls.items())
        )
        tail = "" if self._in_think else self._tail
        content = joined([*self._content, tail])
        reasoning = joined([*self._reasoning, self._tail if self._in_think else ""])
        return Completion(
            id=self.id,
            content=content or None,
            reasoning=reasoning or None,
            tool_calls=calls,
            finish_reason=self.finish_reason,
            timings=self.timings,
            usage=self.usage,
            reasoning_tokens=(
                (reported_reasoning(self.usage) or 0) if self.whole else self.reasoning_tokens
            ),
            thinking_capped=self.thinking_capped,
            cap_warning=self.cap_warning,
            proxy_text=joined(self._proxy) or None,
            cap_moot=self.cap_moot,
            whole=self.whole,
        )


def _starts_call(parts: _CallParts, call_id: str, name: Any) -> bool:
    """Whether a tool-call delta with ``call_id`` and ``name`` (``""``: none) starts a new
    call where the call ``parts`` is (its index, or the last call).

    Only a head does: an ``id`` other than the call's and a ``name``, when the call is done:
    its arguments so far are a complete JSON value, or it has none and the head names
    another function. So a parallel call whose head arrives at the previous call's index is
    a call of its own (DeepSeek behind a gateway), and a call is one call whatever ids its
    later deltas carry (Poolside sends a new ``id`` with each delta after the first) or
    whatever name they restate.
    """
    if not call_id or not parts.id or call_id == parts.id or not name:
        return False
    if not parts.arguments:
        return not _restates(parts.name, name)
    try:
        json.loads(joined(parts.arguments))
    except (ValueError, RecursionError):  # not (yet) one whole JSON value
        return False
    return True


def _restates(known: Any, name: Any) -> bool:
    """Whether ``name`` restates the call's name so far (``known``): the same, or the same
    with more after it (a server that sends the name so far in each delta)."""
    return bool(known.__class__ is str and name.__class__ is str and name.startswith(known))


def _name(parts: _CallParts, name: Any) -> Any:
    """Take a name fragment of a call's delta into ``parts``; the call's name so far when the
    fragment changed it, else ``None``. The first name is taken as sent; a later one that
    restates it (:func:`_restates`) may extend it; any other continues it: the OpenAI and
    Mistral SDKs say a function name may come in pieces (``get_`` then ``weather``)."""
    known = parts.name
    if not known:
        parts.name = name
    elif _restates(known, name):
        if name == known:
            return None
        parts.name = name
    elif known.__class__ is str and name.__class__ is str:
        parts.name = known + name
    else:
        return None
    return parts.name


def _made_up_call_id(completion_id: str, index: int) -> str:
    digest = hashlib.sha256(f"{completion_id}/{index}".encode()).hexdigest()
    return f"call_{digest[:24]}"
