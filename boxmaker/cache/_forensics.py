"""Cache-loss forensics at the edge: ask llama-server where and why a prompt cache was lost.

After a completion whose cache reuse fell short (:func:`boxmaker.cache.cache_outcome`), the
loop calls :meth:`CacheForensics.losses`; ``boxmaker cache explain`` and :func:`explain_log`
do the same for a log made earlier. Both re-render the two requests with the server's own
template and tokenizer (llama.cpp's ``POST /apply-template`` and ``POST /tokenize`` with
``with_pieces``) and hand the tokens to the pure :func:`boxmaker.cache.classify_loss`.

What the slot held = the previous prompt + what was generated. The generated part is rebuilt
as the template renders the previous assistant message after the previous prompt, asked with
``chat_template_kwargs.preserve_thinking = true`` so that its reasoning is kept. A template
that ignores the flag and drops the reasoning of that last message leaves the reasoning out of
the rebuilt part: the divergence inside the previous prompt (where every loss the loop counts
lies, since it counts the previous prompt only) is still exact; a position past the previous
prompt may then be early. When the rendered reply does not extend the previous prompt, the
generated part is left out and ``detail`` says so.

Bounds: at most :data:`MAX_REQUESTS` extra requests per loss (three ``/apply-template``, a
fourth when the server refuses to continue a reply with tool calls, three ``/tokenize``, one
``GET /props`` for ``n_ctx`` and ``n_swa`` when the loss looks like an eviction), each
with a :data:`TIMEOUT_S` timeout, all after the completion has ended (never on the streaming
path). A failure of any of them never fails the turn: the loss is recorded without a cause and
``detail`` says why. ``config.cache.forensics = False`` turns it off. The requests go through
the loop's own client (:class:`boxmaker.client.ServerJson`: its transport and key); a client
that does not offer them (a test's fake) has no server to ask. Inside a cassette (recording or
replay) the cassette's transport refuses them (``boxmaker.client.SIDE_REFUSED``) and the loss
is recorded as before forensics existed: a cassette holds the chat traffic only (the
tokenizer's answers would swell it) and its replay stays strict; explain such a log afterwards
with :func:`explain_log` (``boxmaker cache explain``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from ..client import ChatClient, Client, ServerJson, capabilities_of, refused
from ..config import ClientConfig, Config
from ..errors import BoxmakerError, InferError
from ..records import (
    Assistant,
    Baseline,
    CacheLoss,
    Capabilities,
    Record,
    Usage,
    Warmed,
    usage_tokens,
)
from ..session import Session, message_of, messages
from ._outcome import (
    LossCause,
    TokenizedText,
    cache_loss,
    classify_loss,
    held_tokens,
    history_change,
)

__all__ = [
    "MAX_REQUESTS",
    "TIMEOUT_S",
    "CacheForensics",
    "ExplainedLoss",
    "Runs",
    "SentRequest",
    "TemplateServer",
    "explain_log",
    "explain_loss",
]

MAX_REQUESTS = 8
"""Extra requests forensics sends for one loss, at most."""

TIMEOUT_S = 30.0
"""Timeout of each forensic request (connect and read), in seconds."""


class TemplateServer:
    """llama-server's template and tokenizer endpoints (JSON in, JSON out).

    Args:
        url: the server's base URL (``http://host:port``).
        api_key: sent as ``Authorization: Bearer`` when given.
        transport: an httpx transport instead of the network (tests, cassettes).
        timeout_s: timeout of each request, in seconds.

    Attributes:
        deadline: ``None``, or a :func:`time.monotonic` time after which no request is sent
            (each request's timeouts are cut to what is left of it; httpx times each step of
            a request, so a server that drips its answer can hold one longer): one loss's
            forensics bounded as a whole (the tap's log comes first,
            :data:`boxmaker.tap.FORENSICS_S`).

    Every method raises :class:`~boxmaker.errors.InferError` on a connection failure or an
    HTTP status other than 200 (status and body kept), and
    :class:`~boxmaker.errors.BoxmakerError` on an answer of the wrong shape.
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        own = Client(ClientConfig(url=url, api_key=api_key), transport=transport)
        self._side: ServerJson = own
        self._own: Client | None = own
        self.url, self.timeout_s = own.url, timeout_s
        self.deadline: float | None = None

    @classmethod
    def of(cls, client: ChatClient, timeout_s: float = TIMEOUT_S) -> TemplateServer | None:
        """The server behind ``client``, asked through the client itself (its side requests,
        :class:`boxmaker.client.ServerJson`: its URL, key and transport); ``None`` for a
        client that offers none (a test's fake has no server to ask)."""
        if not isinstance(client, ServerJson):
            return None
        server = cls.__new__(cls)
        server._side, server._own = client, None
        server.url, server.timeout_s = str(getattr(client, "url", "")), timeout_s
        server.deadline = None
        return server

    def close(self) -> None:
        """Close the connection pool of a server made from a URL (a client's stays open)."""
        if self._own is not None:
            self._own.close()

    def _json(self, method: str, path: str, body: Any = None) -> Any:
        timeout_s = self.timeout_s
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise BoxmakerError(f"{path}: not asked, the time for forensics ran out")
            timeout_s = min(timeout_s, left)
        return self._side.server_json(method, path, body, timeout_s=timeout_s)

    def render(self, request: SentRequest, *extra: Mapping[str, Any], keep: bool = False) -> str:
        """The prompt text the template makes of ``request``'s messages (plus ``extra``
        messages) and tools (``POST /apply-template``); ``keep`` adds
        ``chat_template_kwargs.preserve_thinking = true``. A last ``assistant`` message is
        rendered as the start of the reply (llama.cpp's prefill)."""
        kwargs = {**request.template_kwargs, **({"preserve_thinking": True} if keep else {})}
        body: dict[str, Any] = {"messages": [*request.messages, *extra]}
        if request.tools:
            body["tools"] = list(request.tools)
        if kwargs:
            body["chat_template_kwargs"] = kwargs
        answer = self._json("POST", "/apply-template", body)
        if not isinstance(answer, dict) or not isinstance(answer.get("prompt"), str):
            raise BoxmakerError("/apply-template: no 'prompt' string in the answer")
        return str(answer["prompt"])

    def tokenize(self, text: str, *, add_special: bool) -> TokenizedText:
        """``text`` in the model's tokens (``POST /tokenize`` with ``with_pieces``;
        ``add_special``: add BOS as the server does for a prompt). A piece that is not valid
        UTF-8 (llama.cpp then sends its bytes) is decoded with replacement characters."""
        body = {"content": text, "add_special": add_special, "with_pieces": True}
        answer = self._json("POST", "/tokenize", body)
        items = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(items, list):
            raise BoxmakerError("/tokenize: no 'tokens' list in the answer")
        ids, pieces = [], []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("id"), int):
                raise BoxmakerError("/tokenize: a token without pieces (an old server?)")
            piece = item.get("piece", "")
            if isinstance(piece, list):
                piece = bytes(int(b) & 0xFF for b in piece).decode("utf-8", "replace")
            ids.append(int(item["id"]))
            pieces.append(str(piece))
        return TokenizedText(ids=tuple(ids), pieces=tuple(pieces))

    def n_ctx(self) -> int | None:
        """The context size of a slot (``GET /props``, ``default_generation_settings.n_ctx``),
        ``None`` when the server does not say."""
        caps = self.props()
        return caps.n_ctx if caps else None

    def props(self) -> Capabilities | None:
        """What ``GET /props`` says (:func:`boxmaker.client.capabilities_of`: the slot's
        ``n_ctx``, the sliding window ``n_swa`` where a build exposes it), ``None`` when it
        states nothing boxmaker reads."""
        return capabilities_of(self._json("GET", "/props"))

    def render_reply(self, request: SentRequest, reply: Mapping[str, Any]) -> tuple[str, str]:
        """The prompt of ``request`` followed by ``reply`` as the slot held it, kept reasoning
        included: ``(text, note)``. llama.cpp answers HTTP 400 "Cannot continue an assistant
        message that contains tool calls." to a last assistant message with tool calls (its
        prefill), so such a reply is rendered with an empty user message after it and the
        text cut where that message's content begins; ``note`` then says so (a position past
        the reply may be late by that message's header), else ``""``."""
        try:
            return self.render(request, reply, keep=True), ""
        except InferError as exc:
            if exc.status != 400 or not reply.get("tool_calls"):
                raise
        marker = "\u2063boxmaker-reply-end\u2063"
        text = self.render(request, reply, {"role": "user", "content": marker}, keep=True)
        at = text.find(marker)
        if at < 0:
            raise BoxmakerError("/apply-template: the rendered reply lost its end marker")
        note = (
            "; the reply with tool calls rendered before an empty user message (the server "
            "does not continue one): a position past it may be late by that message's header"
        )
        return text[:at], note


@dataclass(frozen=True, kw_only=True)
class SentRequest:
    """What of a chat request the template renders: ``messages``, ``tools`` and
    ``template_kwargs`` (``chat_template_kwargs``)."""

    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> SentRequest:
        """The parts of a chat request body (``messages``, ``tools``, ``chat_template_kwargs``)."""
        return cls(
            messages=tuple(body.get("messages", ())),
            tools=tuple(body.get("tools", ())),
            template_kwargs=dict(body.get("chat_template_kwargs", {})),
        )


def explain_loss(
    server: TemplateServer,
    *,
    old: SentRequest,
    reply: Assistant,
    new: SentRequest,
    expected: int,
    reused: int,
    held_tokens: int | None = None,
    recorded: Capabilities | None = None,
    restored: bool = False,
) -> LossCause:
    """Where and why the cache was lost between two requests (at most :data:`MAX_REQUESTS`).

    Args:
        server: the server that served them (or one with the same model and template).
        old: the earlier request; ``reply`` its completion.
        new: the request whose reuse fell short.
        expected: previous ``cache_n + prompt_n`` (tokens); ``reused``: new ``cache_n``.
        held_tokens: the slot's tokens after the earlier completion (``cache_n + prompt_n +
            predicted_n``), to tell a context shift.
        recorded: the session's ``Capabilities`` record (its ``model``, to tell a model
            swapped since: ``model_swapped``).
        restored: the new request is a fork's first after its parent's slot was restored
            (``restore_cold`` when it was not used).

    Raises:
        BoxmakerError: a request failed or was answered in an unexpected shape.
    """
    return _explained(
        server,
        old=old,
        reply=reply,
        new=new,
        expected=expected,
        reused=reused,
        held_tokens=held_tokens,
        recorded=recorded,
        restored=restored,
    )[0]


def _explained(
    server: TemplateServer,
    *,
    old: SentRequest,
    reply: Assistant,
    new: SentRequest,
    expected: int,
    reused: int,
    held_tokens: int | None,
    recorded: Capabilities | None,
    restored: bool,
) -> tuple[LossCause, int]:
    """:func:`explain_loss`'s work, with the new prompt's length as rebuilt (tokens)."""
    reply_message = message_of(reply) or {"role": "assistant", "content": ""}
    old_text = server.render(old)
    held_text, note = server.render_reply(old, reply_message)
    new_text = server.render(new)
    old_prompt = server.tokenize(old_text, add_special=True)
    rebuilt = held_text.startswith(old_text)
    generated_text = held_text[len(old_text) :] if rebuilt else ""
    generated = server.tokenize(generated_text, add_special=False)
    new_prompt = server.tokenize(new_text, add_special=True)
    edited = history_change(old.messages, old.tools, new.messages, new.tools)
    odd = recorded is not None and len(old_prompt) != expected  # another model now?
    caps = server.props() if odd or reused < min(expected, len(new_prompt)) else None
    found = classify_loss(
        expected=expected,
        reused=reused,
        old_prompt=old_prompt,
        generated=generated,
        new_prompt=new_prompt,
        edited=edited,
        held_tokens=held_tokens,
        n_ctx=caps.n_ctx if caps else None,
        n_swa=caps.n_swa if caps else None,
        n_slots=caps.slots if caps else None,
        swapped=_swapped(recorded, caps),
        restored=restored,
    )
    if not rebuilt:
        note += "; the rendered reply does not extend the old prompt: generated part left out"
    if not note:
        return found, len(new_prompt)
    return LossCause(
        position=found.position,
        cause=found.cause,
        old_window=found.old_window,
        new_window=found.new_window,
        detail=found.detail + note,
    ), len(new_prompt)


def _swapped(recorded: Capabilities | None, now: Capabilities | None) -> str | None:
    """The model change between a session's ``Capabilities`` record and ``GET /props`` now,
    in words; ``None`` when either does not name a model, or both name the same."""
    if recorded is None or now is None or not recorded.model or not now.model:
        return None
    if recorded.model == now.model:
        return None
    return f"the session ran on {recorded.model}, the server now serves {now.model}"


def _recorded(records: Sequence[Record]) -> Capabilities | None:
    """The session's latest ``Capabilities`` record in ``records`` (``None``: none)."""
    return next((r for r in reversed(records) if isinstance(r, Capabilities)), None)


def _after_restore(session: Session, runs: object) -> bool:
    """The completion about to be recorded is a fork's first, after
    :func:`boxmaker.cache.warm_fork` restored its parent's slot (``runs.warm``: the
    loop's :class:`~boxmaker.turn.Runtime`)."""
    warm, forked = getattr(runs, "warm", None), session.forked
    if forked is None or getattr(warm, "how", None) != "restored":
        return False
    if getattr(warm, "session", "") not in ("", session.id):
        return False
    own = session.records[forked.record :]
    return not any(isinstance(r, Usage) for r in own)


def _loss(loss: CacheLoss, found: LossCause | None, detail: str | None) -> CacheLoss:
    """The rule's ``loss`` with what forensics found (or why it could not look)."""
    if found is None:
        return dataclasses.replace(loss, detail=detail)
    return dataclasses.replace(
        loss,
        position=found.position,
        cause=found.cause,
        old_window=found.old_window,
        new_window=found.new_window,
        detail=found.detail,
    )


def _previous_request(
    baseline: Baseline, records: Sequence[Record], kwargs: Mapping[str, Any]
) -> tuple[SentRequest, Assistant] | None:
    """The request of the last ``Assistant`` in ``records`` and that reply, rebuilt from the
    log (baseline tools, ``kwargs`` as the template kwargs); ``None`` without one."""
    for i in range(len(records) - 1, -1, -1):
        reply = records[i]
        if isinstance(reply, Assistant):
            sent = messages(baseline, records[:i])
            return SentRequest(
                messages=tuple(sent), tools=baseline.tools, template_kwargs=kwargs
            ), reply
    return None


class Runs(Protocol):
    """What forensics needs of the loop's runtime (:class:`boxmaker.turn.Runtime`)."""

    config: Config
    client: ChatClient


class CacheForensics:
    """The loop's side of forensics: remembers each session's last request (in memory, per
    session id, the last :data:`REMEMBERED` sessions) and explains a loss after a completion.

    A request not remembered (a log reopened by another process), or remembered with other
    messages than the log's (the session was also run by another runtime), is rebuilt from the
    log with the session's baseline; a change the client made to the baseline between the two
    requests (e.g. its tools) is then not seen.
    """

    REMEMBERED = 64

    def __init__(self) -> None:
        self._sent: dict[str, SentRequest] = {}
        self._lock = threading.Lock()

    def losses(
        self,
        session: Session,
        runtime: Runs,
        body: Mapping[str, Any],
        earlier: Usage | None,
        usage: Usage,
    ) -> list[CacheLoss]:
        """The ``CacheLoss`` record for the completion of ``body`` by the one rule
        (:func:`boxmaker.cache.cache_loss`: ``[]`` when the cache held or either usage lacks
        timings), explained by forensics; called after every completion, before its records
        are appended; ``runtime`` gives the config and the client. Never raises (a failure
        goes into the record's ``detail``)."""
        config, client = runtime.config, runtime.client
        new = SentRequest.of(body)
        with self._lock:
            old = self._sent.pop(session.id, None)
            self._sent[session.id] = new
            while len(self._sent) > self.REMEMBERED:
                del self._sent[next(iter(self._sent))]
        loss = cache_loss(earlier, usage)  # the rule (pure); the rest explains a loss
        if earlier is None or loss is None:
            return []
        expected, reused = loss.expected, loss.reused
        if not config.cache.forensics:
            return [loss]
        server = TemplateServer.of(client)
        if server is None:
            return [_loss(loss, None, "no server to ask: not a boxmaker Client")]
        try:
            rebuilt = _previous_request(session.baseline, session.records, config.template_kwargs())
            if rebuilt is None:
                return [_loss(loss, None, "no earlier assistant message in the log")]
            if old is None or list(old.messages) != list(rebuilt[0].messages):
                old = rebuilt[0]  # not remembered, or remembered by another runtime: stale
            found = explain_loss(
                server,
                old=old,
                reply=rebuilt[1],
                new=new,
                expected=expected,
                reused=reused,
                held_tokens=held_tokens(earlier.timings),
                recorded=_recorded(session.records),
                restored=_after_restore(session, runtime),
            )
        except InferError as exc:
            if refused(exc):  # inside a cassette: no side request is sent
                return [loss]
            return [_loss(loss, None, f"forensics failed: {exc}")]
        except Exception as exc:  # forensics never fails the turn
            return [_loss(loss, None, f"forensics failed: {exc}")]
        finally:
            server.close()
        return [_loss(loss, found, None)]


@dataclass(frozen=True, kw_only=True)
class ExplainedLoss:
    """One ``CacheLoss`` of a log, explained: ``request`` is the number (1, 2, ...) of the
    completion whose reuse fell short; ``expected``, ``reused``, ``lost_tokens`` and
    ``reprocessed`` in tokens (the loss's two quantities under the frames' names); ``found``
    what forensics says (``None`` with ``error`` when it could not look). ``rebuilt_tokens``
    is the prompt of the request explained as rebuilt from the log with the settings given,
    ``prompt_tokens`` what the server counted of it (``cache_n + prompt_n``; tokens, ``None``
    when not known): when they differ, the server saw another prompt than the one rebuilt
    (the session ran with another ``history.reasoning`` or thinking setting, or another model
    answers now), and the position and cause may be wrong (:attr:`settings_differ`)."""

    request: int
    expected: int
    reused: int
    found: LossCause | None
    error: str | None = None
    reprocessed: int | None = None
    rebuilt_tokens: int | None = None
    prompt_tokens: int | None = None

    @property
    def settings_differ(self) -> bool:
        """The prompt rebuilt from the log is not the length the server counted: explained
        with other settings than the session's."""
        rebuilt, counted = self.rebuilt_tokens, self.prompt_tokens
        return rebuilt is not None and counted is not None and rebuilt != counted

    @property
    def lost_tokens(self) -> int:
        """The previous prompt's tokens not reused: ``expected - reused`` (at least 0), the
        frames' ``lost_tokens``."""
        return max(0, self.expected - self.reused)

    def to_json(self) -> dict[str, Any]:
        """``{"request", "expected", "reused", "lost_tokens", "reprocessed_tokens", "position",
        "cause", "old_window", "new_window", "detail", "error", "rebuilt_tokens",
        "prompt_tokens"}`` (the forensic fields ``None`` when not found;
        ``reprocessed_tokens`` ``None`` when the log does not say)."""
        found = self.found
        return {
            "request": self.request,
            "expected": self.expected,
            "reused": self.reused,
            "lost_tokens": self.lost_tokens,
            "reprocessed_tokens": self.reprocessed,
            "position": found.position if found else None,
            "cause": found.cause if found else None,
            "old_window": found.old_window if found else None,
            "new_window": found.new_window if found else None,
            "detail": found.detail if found else None,
            "error": self.error,
            "rebuilt_tokens": self.rebuilt_tokens,
            "prompt_tokens": self.prompt_tokens,
        }


def explain_log(
    path: str | Path,
    url: str,
    *,
    config: Config | None = None,
    api_key: str | None = None,
    transport: httpx.BaseTransport | None = None,
) -> list[ExplainedLoss]:
    """Explain every ``CacheLoss`` of a session log through a server with the same model.

    Args:
        path: the session log (JSON Lines).
        url: the server's base URL; ``api_key`` its key, if it needs one; ``transport`` an
            httpx transport instead of the network (tests).
        config: gives the template kwargs the session ran with (``thinking.enabled``,
            ``history.reasoning``); default :class:`~boxmaker.config.Config()`.

    Each request is rebuilt from the log (the baseline's system prompt and tools, the
    messages before its assistant record). At most :data:`MAX_REQUESTS` requests per loss; a
    loss that cannot be explained carries ``error``.

    Raises:
        SessionError: the log cannot be read.
    """
    kwargs = (config or Config()).template_kwargs()
    server = TemplateServer(url, api_key=api_key, transport=transport)
    out: list[ExplainedLoss] = []
    with Session.open(path, read_only=True) as session:
        records = session.records
    usages: list[int] = []
    unreachable: str | None = None  # the server did not answer: the other losses are not asked
    try:
        for i, record in enumerate(records):
            if isinstance(record, Usage):
                usages.append(i)
            if not isinstance(record, CacheLoss):
                continue
            try:
                if unreachable is not None:
                    raise _Unreachable(
                        f"not asked: the server did not answer for an earlier loss ({unreachable})"
                    )
                out.append(_explain_at(server, session.baseline, records, usages, i, kwargs))
            except _Unreachable as exc:
                unreachable = unreachable or str(exc)
                n, expected, reused = len(usages), record.expected, record.reused
                again = record.reprocessed
                out.append(ExplainedLoss(request=n, expected=expected, reused=reused, found=None,
                                         error=str(exc), reprocessed=again))  # fmt: skip
    finally:
        server.close()
    return out


class _Unreachable(Exception):
    """The server did not answer (connection refused, timeout): explaining stops asking it."""


def _explain_at(
    server: TemplateServer,
    baseline: Baseline,
    records: Sequence[Record],
    usages: Sequence[int],
    at: int,
    kwargs: Mapping[str, Any],
) -> ExplainedLoss:
    """Explain the ``CacheLoss`` at ``records[at]`` (``usages``: indexes of the Usage
    records up to it)."""
    loss = records[at]
    assert isinstance(loss, CacheLoss)
    number, expected, reused = len(usages), loss.expected, loss.reused

    def failed(why: str) -> ExplainedLoss:
        return ExplainedLoss(
            request=number,
            expected=expected,
            reused=reused,
            found=None,
            error=why,
            reprocessed=loss.reprocessed,
        )

    if len(usages) < 2:
        return failed("no earlier completion in the log")
    new_at, old_at = usages[-1] - 1, usages[-2] - 1  # the Assistant before each Usage
    new = _previous_request(baseline, records[: new_at + 1], kwargs)
    old = _previous_request(baseline, records[: old_at + 1], kwargs)
    if new is None or old is None:
        return failed("no assistant record before the usage")
    earlier = records[usages[-2]]
    held = held_tokens(earlier.timings) if isinstance(earlier, Usage) else None
    after = records[at + 1] if at + 1 < len(records) else None  # a fork's first: its Warmed
    try:
        # with the prompt as rebuilt: another length than the server counted, other
        # settings than the session's (a history kept or dropped shows in this request,
        # after a user message, not in the earlier one)
        found, rebuilt = _explained(
            server,
            old=old[0],
            reply=old[1],
            new=new[0],
            expected=loss.expected,
            reused=loss.reused,
            held_tokens=held,
            recorded=_recorded(records[:at]),
            restored=isinstance(after, Warmed) and after.found == "restored",
        )
    except BoxmakerError as exc:
        if isinstance(exc.__cause__, httpx.TransportError):
            raise _Unreachable(str(exc)) from exc
        return failed(str(exc))
    return ExplainedLoss(
        request=number,
        expected=expected,
        reused=reused,
        found=found,
        reprocessed=loss.reprocessed,
        rebuilt_tokens=rebuilt,
        prompt_tokens=_prompt_count(records[usages[-1]]),
    )


def _prompt_count(usage: Record) -> int | None:
    """The prompt tokens the server counted for a completion (the one rule,
    :func:`boxmaker.records.usage_tokens`)."""
    if not isinstance(usage, Usage):
        return None
    prompt = usage_tokens(usage).prompt
    return None if prompt is None else int(prompt)
