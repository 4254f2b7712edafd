"""The tap's logger: exchanges in, session logs out, on a writer thread of its own.

The proxy hands each finished exchange (the request's bytes, the answer's bytes as the agent
got them, what went wrong) to :meth:`TapLog.submit`, which only puts it on a queue: parsing,
grouping, cache forensics (extra requests to the upstream) and the fsynced appends all run on
the writer thread, never on the agent's request path, preferably in a quiet moment (no
request in flight through the tap, :mod:`~boxmaker.tap._traffic`), so the GIL they hold does
not slow the agent's next request.

Durable by design (issue 36): an exchange the agent has received is in the log, fsynced,
within :data:`LOG_WITHIN_S` of its answer's end. The writer waits for a quiet moment
:data:`~boxmaker.tap._traffic.AT_MOST_S` at most after that end, then writes the exchange as
one record group (one all-or-nothing append: a kill leaves it whole or absent); and when it
falls behind by more than :data:`HOLD_S` (its oldest exchange not yet written), the proxy holds
each new chat request before forwarding it (:meth:`TapLog.catch_up`, :data:`HOLD_AT_MOST_S`
at most) until the writer has caught up: agents wait a little rather than the log falling
behind without end. Measured (``python scripts/tap_kill_test.py``: 8 agents, the tap killed
with SIGKILL 30 times at random moments): no exchange answered more than the bound before a
kill was missing; see the README for the figures. SIGTERM, SIGINT and SIGHUP stop the
command's tap after the answers in flight and write everything queued first
(:meth:`~boxmaker.tap.Tap.serve_forever`).

Every request is read as the chat body llama.cpp renders for it (:func:`~boxmaker.tap.chat_body`:
chat completions as they are, Anthropic messages and Responses converted), so the three
formats group, log and explain alike; a request the tap cannot read is forwarded unlogged and
said once per route (:attr:`TapLog.notes`).

Grouping: one session per conversation, by :class:`~boxmaker.tap._grouping.Conversations`.

Records (boxmaker's own, :mod:`boxmaker.records`): the first request's system message is the
session's ``Baseline`` (with its tools); after it each new ``user`` message is a ``User``
(a turn begins; user messages one after the other, with nothing between them, are one
``User``, their texts joined by a blank line: Codex sends its environment context before the
prompt), each ``tool`` message a ``ToolResult`` as the agent sent it, each answer an
``Assistant`` with its ``Usage`` (llama.cpp's ``timings``) and, when the prompt cache fell
short, a ``CacheLoss`` by the loop's own rule (:func:`boxmaker.cache.cache_loss`: the new
``cache_n`` below the previous ``cache_n + prompt_n``) with forensics' cause and position
(a reply the agent sent back otherwise, its reasoning dropped, is re-processed without a loss
by that rule: ``reprocessed_tokens`` of the next loss, or the requests' timings, show it). An
answer without tool
calls ends the turn (``TurnEnd`` ``answered``; ``length`` when cut by ``max_tokens``); an
upstream error ends it as ``infer_error`` (its HTTP status kept), a disconnect as
``cancelled``. A new user message while a turn is open ends it: ``cancelled`` when calls of it
had no results yet, ``abandoned`` when their results came and no answer was asked for (a turn
without an answer, not ``answered``). Calls left unanswered when a turn ends are answered
``not_run`` so that every log stays well formed.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import queue
import resource
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from .._secrets import credentials_in, hide_in_json, hide_text, searchable
from ..cache import SentRequest, TemplateServer, cache_loss, explain_loss, held_tokens
from ..errors import BoxmakerError, SessionError
from ..records import (
    Assistant,
    Baseline,
    NotRunReason,
    Record,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnEndOutcome,
    Usage,
    User,
    utc_now,
)
from ..session import Session, message_of
from ._grouping import Conversation, Conversations
from ._traffic import Traffic
from ._wire import (
    WireReply,
    api_of,
    chat_body,
    message_key,
    read_reply,
    text_of,
    tool_names,
)

__all__ = [
    "FORENSICS_S",
    "HOLD_AT_MOST_S",
    "HOLD_S",
    "LOG_WITHIN_S",
    "OPEN_LOGS",
    "Exchange",
    "TapLog",
]

LOGGER = logging.getLogger("boxmaker.tap")

OPEN_LOGS = 256
"""How many conversations' logs the tap holds open at once (each an open file and its lock),
at most a quarter of the process's open-file limit (``RLIMIT_NOFILE``; the rest is for the
agents' and the upstream's connections); the one written least recently is closed first, and
opened again (:meth:`Session.open`, a read of its log) when its conversation goes on. Before,
every log stayed open for the tap's life: under a limit of 128 open files the tap stopped
answering after about 100 conversations (1,024, a common default, after about 1,000)."""


def _open_logs_cap() -> int:
    """:data:`OPEN_LOGS`, or a quarter of this process's open-file limit when less (8 at
    least)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return OPEN_LOGS
    return max(8, min(OPEN_LOGS, soft // 4))


LOG_WITHIN_S = 1.0
"""The tap's promise, in seconds: an exchange the agent has received is in its session log
(written and fsynced) this long after its answer ended, at most, under steady load (8 agents
at once; with cache forensics on, a loss's requests to the upstream stop at
:data:`FORENSICS_S`, and none are sent while the writer is behind).
After a SIGKILL every exchange answered longer ago than this is in the log."""

HOLD_S = 0.25
"""Seconds the log's writer may be behind (its oldest exchange not yet written) before the
proxy holds new chat requests until it catches up (:meth:`TapLog.catch_up`)."""

FORENSICS_S = 0.4
"""Seconds one cache loss's forensics (its requests to the upstream) may take on the writer
thread: the log comes first. No request is sent past it, and each one's timeouts are cut to
what is left (httpx times each step of a request, so an upstream that drips its answer a
byte at a time can still hold one request longer); when the writer is more than
:data:`HOLD_S` behind, none is sent. The ``CacheLoss`` is then written unexplained, its
``detail`` saying why (before, each side request waited 30 s, and an upstream slow to answer
them left the log seconds behind: a kill then lost exchanges answered 3.6 s earlier)."""

HOLD_AT_MOST_S = 2.0
"""Seconds a request is held at most for the writer to catch up (a writer stuck on a slow
disk or a slow upstream's forensics delays agents no longer than this per request)."""


@dataclass(frozen=True, kw_only=True)
class Exchange:
    """One request through the tap and its answer, as the agent sent and got them.

    ``path``: the URL path (``/v1/chat/completions``); ``body``: the request's bytes;
    ``status``: the upstream's HTTP status (``None``: not reached); ``streamed``: the answer
    was ``text/event-stream``; ``answer``: its bytes as forwarded (cut short by a disconnect);
    ``error``: what went wrong (the upstream unreachable, the agent gone), ``None`` when
    nothing did; ``disconnected``: the agent went away before the answer ended;
    ``api_key``: the agent's bearer token (for forensics' requests to the same server);
    ``headers``: the request's headers as forwarded (raw ``(name, value)`` pairs) and
    ``query``: its query string, read on the writer thread for the credentials to hide
    (``_secrets``' rule: every header, query and JSON form; :meth:`credentials`);
    ``started`` / ``ended``: when the request came and the answer ended (UTC, the records'
    times); ``encoding``: the answer's ``Content-Encoding`` (``gzip``, ``br``...; ``""``:
    none), decoded on the writer thread before it is read.
    """

    path: str
    body: bytes
    status: int | None
    streamed: bool
    answer: bytes
    error: str | None = None
    disconnected: bool = False
    api_key: str | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()
    query: bytes = b""
    started: datetime = field(default_factory=utc_now)
    ended: datetime = field(default_factory=utc_now)
    encoding: str = ""

    def plain_answer(self) -> tuple[bytes, str | None]:
        """:attr:`answer` decoded by its :attr:`encoding` with httpx's decoders (gzip and
        deflate; br and zstd where their packages are installed: the cassette's too), and
        what kept it from decoding (``None``: nothing did; the bytes are then as they came,
        and the words say why, as the log's ``infer_error`` detail). A proxy that compresses
        llama-server's answers (nginx, LiteLLM) for an agent that takes gzip: the answer was
        read as compressed bytes and logged ``infer_error``, its usage lost. Never raises."""
        if not self.encoding or self.encoding.strip().lower() == "identity" or not self.answer:
            return self.answer, None
        head = [("content-encoding", self.encoding)]
        try:
            decoded = httpx.Response(200, headers=head, stream=httpx.ByteStream(self.answer))
            plain = decoded.read()
        except (httpx.DecodingError, UnicodeError, ValueError) as exc:
            return self.answer, f"the answer's encoding {self.encoding!r} did not decode: {exc}"
        if plain == self.answer:  # httpx passes an encoding it has no decoder for (br
            # without the brotli package) through as it came
            return self.answer, f"no decoder here for the answer's encoding {self.encoding!r}"
        return plain, None

    def credentials(self) -> list[str]:
        """The credentials this request shows (``Authorization`` Bearer or Basic, api-key
        headers, credential-like query parameters and body fields), by the one rule of
        ``boxmaker._secrets`` (``credentials_in``), with :attr:`api_key`."""
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.headers]
        uri = "?" + self.query.decode("latin-1") if self.query else ""
        return [*credentials_in(headers, uri, self.body), *([self.api_key] if self.api_key else [])]


def _at(record: Record, time: datetime) -> Record:
    return dataclasses.replace(record, time=time)


class TapLog:
    """Write boxmaker session logs of the exchanges the tap forwards (a writer thread).

    Args:
        directory: where the logs go (``<session_id>.jsonl``; created when missing).
        upstream: the llama-server's base URL, asked for cache forensics
            (``/apply-template``, ``/tokenize``, ``/props``) after a loss.
        forensics: explain each cache loss (``False``: the ``CacheLoss`` without a cause).
        traffic: the tap's requests in flight: each exchange is written in a quiet moment
            (:class:`~boxmaker.tap._traffic.Traffic`, waiting 0.1 s at most after its answer
            ended; ``None``: at once).

    Attributes:
        sessions: the log of each conversation, in the order they began.
        problems: what could not be logged, in words (a full disk is said once).
        notes: what the tap forwarded without reading, in words, once per route
            (:meth:`note_route`): a request it cannot read (not JSON, no ``messages``, a
            Responses request with ``previous_response_id``...), a route it does not read
            (:data:`~boxmaker.tap.UNREAD_PATHS`: prompts, not conversations).
        skipped: requests forwarded but not logged (not JSON, no ``messages``, what
            :func:`~boxmaker.tap.responses_body` cannot read).
        written: exchanges handled by the writer so far (logged, skipped or failed).
        failed: exchanges of those not in a log (the disk full, a log that cannot be made or
            opened, an error while reading them: :attr:`problems` says why).
        slowest_s: the longest time from an answer's end to its exchange being written, in
            seconds, so far (the measured side of :data:`LOG_WITHIN_S`).
    """

    def __init__(
        self,
        directory: str | Path,
        upstream: str,
        *,
        forensics: bool = True,
        traffic: Traffic | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.upstream = upstream.rstrip("/")
        self.forensics = forensics
        self.sessions: list[Path] = []
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.skipped = 0
        self.written = 0
        self.failed = 0
        self.slowest_s = 0.0
        self._conversations = Conversations()
        self._queue: queue.SimpleQueue[tuple[float, Exchange] | None] = queue.SimpleQueue()
        self._queued: collections.deque[float] = collections.deque()  # monotonic, in order
        self._idle = threading.Condition()
        self._pending = 0
        self._disk_said = False
        self._noted: set[str] = set()
        self._noted_lock = threading.Lock()
        self._traffic = traffic
        # forensics' side requests, one client per API key (the writer thread's alone): a
        # client made and closed per loss cost a new connection and config each time
        self._templates: collections.OrderedDict[str | None, TemplateServer] = (
            collections.OrderedDict()
        )
        # the conversations whose logs are open, least recently written first (OPEN_LOGS)
        self._open_logs: collections.OrderedDict[int, Conversation] = collections.OrderedDict()
        self._open_cap = _open_logs_cap()
        self._thread = threading.Thread(target=self._run, name="boxmaker-tap-log", daemon=True)
        self._thread.start()

    # -- the request path's side: one put -------------------------------------------------

    def begin(self) -> None:
        """Count one exchange on its way (the proxy calls it when a chat request comes, so
        that :meth:`wait` also waits for answers still streaming); :meth:`submit` or
        :meth:`drop` ends it."""
        with self._idle:
            self._pending += 1

    def submit(self, exchange: Exchange) -> None:
        """Queue one exchange begun with :meth:`begin` for the writer thread (never blocks,
        never raises); call it when the agent has the whole answer (the clock of
        :data:`LOG_WITHIN_S` starts now)."""
        now = time.monotonic()
        self._queued.append(now)
        self._queue.put((now, exchange))

    def behind_s(self) -> float:
        """Seconds the oldest exchange submitted and not yet written has waited (0: none)."""
        try:
            return max(0.0, time.monotonic() - self._queued[0])
        except IndexError:
            return 0.0

    async def catch_up(self) -> None:
        """Wait (on the proxy's event loop) while the writer is more than :data:`HOLD_S`
        behind, until it is within half of it, :data:`HOLD_AT_MOST_S` at most; return at once
        when it is not behind (the proxy calls it before forwarding each chat request)."""
        if self.behind_s() <= HOLD_S:
            return
        deadline = time.monotonic() + HOLD_AT_MOST_S
        while self.behind_s() > HOLD_S / 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    def drop(self) -> None:
        """End an exchange begun with :meth:`begin` that will not be submitted."""
        self._done()

    def _done(self) -> None:
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def wait(self, timeout_s: float = 30.0) -> bool:
        """Wait until every exchange begun so far is answered and written; ``False`` on
        timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    def close(self) -> None:
        """Write what is queued, end the turns left open (``TurnEnd`` ``cancelled``, their
        calls ``not_run``) and close every log. Idempotent."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        for conv in self._conversations:
            if conv.open:
                why = "the tap stopped with the agent's turn open"
                self._append(conv, self._end(conv, "cancelled", why, "cancelled"))
            self._shut(conv)
        while self._templates:
            self._templates.popitem()[1].close()

    # -- the writer thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            queued, exchange = item
            try:
                if self._traffic is not None:
                    self._traffic.wait_quiet(since=queued)
                self._write(exchange)
            except Exception as exc:  # the writer never dies: the agent's traffic goes on
                self.failed += 1
                self._problem(f"{exchange.path}: not logged: {type(exc).__name__}: {exc}")
            finally:
                self.slowest_s = max(self.slowest_s, time.monotonic() - queued)
                self.written += 1
                self._queued.popleft()
                self._done()

    def _problem(self, text: str) -> None:
        self.problems.append(text)
        LOGGER.warning("%s", text)

    def note_route(self, path: str, text: str) -> None:
        """Say once per route (``path``) what the tap forwarded without reading: ``text``
        goes to :attr:`notes` and the ``boxmaker.tap`` logger (a warning: ``boxmaker tap``
        prints it), the first time only. Called on the writer thread (a request it cannot
        read) and by the proxy (a route it does not read); never raises."""
        with self._noted_lock:
            if path in self._noted:
                return
            self._noted.add(path)
        note = f"{path}: {text}"
        self.notes.append(note)
        LOGGER.warning("%s", note)

    def _write(self, exchange: Exchange) -> None:
        api = api_of(exchange.path)
        if api is None:
            return
        try:
            parsed = json.loads(exchange.body)
        except (ValueError, RecursionError):
            parsed = None
        try:
            body = chat_body(api, parsed)
        except ValueError as exc:  # not a JSON object, or what the tap cannot read in it
            self.skipped += 1
            said = hide_text(str(exc), searchable(exchange.credentials()))  # it is printed
            self.note_route(exchange.path, f"forwarded, not logged: {said}")
            return
        msgs = [m for m in body["messages"] if isinstance(m, dict)]
        plain, undecoded = exchange.plain_answer()
        reply = read_reply(
            plain,
            status=exchange.status,
            api=api,
            streamed=exchange.streamed,
            error=exchange.error or undecoded,
        )
        keys = [message_key(m) for m in msgs]
        conv, start = self._conversations.find(keys, msgs)
        inputs = self._inputs(conv, msgs[start:])
        if not conv.open:  # no new user message: the agent sent a failed request again
            inputs += self._asked_again(conv, msgs)
        records = [_at(r, exchange.started) for r in inputs]
        answer = self._answer(conv, exchange, body, msgs, reply)
        records += [_at(r, exchange.ended) for r in answer]
        secrets = searchable(exchange.credentials())
        if not conv.created:
            conv.created = True  # once: a log that could not be made is not tried again
            self._create(conv, msgs, body, secrets)
        conv.secrets.update(secrets)
        session = self._session(conv)
        if session is not None:
            session.hide(*secrets)  # each request's own: an agent may change its key
        if not self._append(conv, records):
            self.failed += 1
        self._conversations.file(conv, keys)
        conv.request, conv.api, conv.failed = exchange.body, api, reply.assistant is None
        if reply.assistant is not None:
            conv.reply, conv.usage = reply.assistant, reply.usage or conv.usage
            message = message_of(reply.assistant)
            conv.reply_key = message_key(message) if message else None
        else:
            conv.reply_key = None

    def _create(
        self,
        conv: Conversation,
        msgs: Sequence[Mapping[str, Any]],
        body: Mapping[str, Any],
        secrets: Sequence[str],
    ) -> bool:
        """Make the conversation's log; its baseline (system prompt, tools) is scrubbed here
        by the rule the records are (the log's first line is written as it is given)."""
        system = ""
        if msgs and msgs[0].get("role") in ("system", "developer"):
            system = hide_text(text_of(msgs[0].get("content")), secrets)
        tools = tuple(
            hide_in_json(t, secrets) for t in body.get("tools") or () if isinstance(t, dict)
        )
        try:
            conv.session = Session.create(self.directory, Baseline(system=system, tools=tools))
        except SessionError as exc:
            self._disk(exc)
            return False
        conv.path = conv.session.path
        self.sessions.append(conv.path)
        self._held(conv)
        return True

    def _session(self, conv: Conversation) -> Session | None:
        """The conversation's log open for writing (opened again, its credentials hidden
        again, when :data:`OPEN_LOGS` closed it), or ``None``: it has none, or it cannot be
        opened (said once, as a full disk)."""
        if conv.session is None and conv.path is not None:
            try:
                conv.session = Session.open(conv.path)
            except SessionError as exc:
                self._disk(exc)
                return None
            conv.session.hide(*conv.secrets)
        if conv.session is not None:
            self._held(conv)
        return conv.session

    def _held(self, conv: Conversation) -> None:
        """``conv``'s log was just used: the most recent of the open ones; the least recent
        past :data:`OPEN_LOGS` are closed."""
        self._open_logs.pop(id(conv), None)
        self._open_logs[id(conv)] = conv
        while len(self._open_logs) > self._open_cap:
            self._shut(self._open_logs.popitem(last=False)[1])

    def _shut(self, conv: Conversation) -> None:
        """Close ``conv``'s log (it stays known by its path)."""
        self._open_logs.pop(id(conv), None)
        if conv.session is not None:
            try:
                conv.session.close()
            except SessionError as exc:
                self._disk(exc)
            conv.session = None

    def _disk(self, exc: BoxmakerError) -> None:
        if not self._disk_said:
            self._disk_said = True
            self._problem(f"cannot write the logs (forwarding goes on, not logged): {exc}")

    def _append(self, conv: Conversation, records: Sequence[Record]) -> bool:
        """Append ``records`` to ``conv``'s log; ``False`` when they are not in it (no log,
        or the append failed: said once, as a full disk)."""
        if not records:
            return True
        session = self._session(conv)
        if session is None:
            return False
        try:
            session.extend(records)
        except SessionError as exc:
            self._disk(exc)
            return False
        return True

    # -- records ------------------------------------------------------------------------------

    def _inputs(self, conv: Conversation, msgs: Sequence[Mapping[str, Any]]) -> list[Record]:
        """Records of the agent's new messages (user messages, tool results, assistant
        messages it wrote itself)."""
        out: list[Record] = []
        names = tool_names(msgs)
        for m in msgs:
            role = m.get("role")
            if role == "tool":
                cid = str(m.get("tool_call_id", ""))
                if cid in conv.answered:
                    continue
                call = conv.pending.pop(cid, None)
                name = call.name if call else names.get(cid, "")
                out.append(
                    ToolResult(
                        call=conv.next_call,
                        tool_call_id=cid,
                        name=name,
                        content=text_of(m.get("content")),
                    )
                )
                conv.next_call += 1
                conv.answered.add(cid)
            elif role == "user":
                text = text_of(m.get("content"))
                if conv.open and conv.last == "user" and out and isinstance(out[-1], User):
                    # user messages one after the other are the turn's one input (Codex sends
                    # its environment context as a user message before the prompt)
                    out[-1] = User(content=f"{out[-1].content}\n\n{text}")
                    continue
                if conv.open:
                    out += self._left(conv)
                out.append(User(content=text))
                conv.open = True
            elif role == "assistant":
                calls = _calls(m)
                reasoning = m.get("reasoning_content")
                out.append(
                    Assistant(
                        content=text_of(m.get("content")) or None,
                        reasoning=reasoning if isinstance(reasoning, str) and reasoning else None,
                        tool_calls=calls,
                    )
                )
                conv.pending.update((c.id, c) for c in calls)
            conv.last = role if role in ("user", "assistant", "tool") else conv.last
        return out

    def _asked_again(self, conv: Conversation, msgs: Sequence[Mapping[str, Any]]) -> list[Record]:
        """A request with no new user message while no turn is open (the agent sent a request
        that failed again, its turn ended ``infer_error``; or asked on after an answer cut by
        ``length``, its reply sent back): a new turn, its ``User`` the request's last user
        message, which the agent sent again with it (``""`` when it has none): a log's turn
        begins with one. Before, the answer went into the ended turn, which then ended twice
        and every view showed its last outcome alone."""
        last = next((m for m in reversed(msgs) if m.get("role") == "user"), None)
        conv.open, conv.last = True, "user"
        return [User(content=text_of(last.get("content")) if last is not None else "")]

    def _left(self, conv: Conversation) -> list[Record]:
        """The end of a turn the agent left for a new user message: ``cancelled`` when calls
        of it had no results yet, ``answered`` when its last message was an answer the agent
        wrote itself, else ``abandoned`` (its calls' results came, the answer was never
        asked for)."""
        if conv.pending:
            why = "the agent sent a user message before the results of its calls"
            return self._end(conv, "cancelled", why, "cancelled")
        if conv.last == "assistant":
            return self._end(conv, "answered", "the agent wrote the answer itself", "cancelled")
        why = (
            "the agent sent a new user message after the results of its calls, "
            "without asking for an answer"
        )
        return self._end(conv, "abandoned", why, "cancelled")

    def _end(
        self,
        conv: Conversation,
        outcome: TurnEndOutcome,
        detail: str,
        reason: NotRunReason,
        status: int | None = None,
    ) -> list[Record]:
        """``not_run`` results for the calls left unanswered, then the turn's ``TurnEnd``."""
        out: list[Record] = []
        for cid, call in conv.pending.items():
            text = f"(not run: {detail})"
            out.append(
                ToolResult(
                    call=conv.next_call,
                    tool_call_id=cid,
                    name=call.name,
                    content=text,
                    not_run=reason,
                )
            )
            conv.next_call += 1
            conv.answered.add(cid)
        conv.pending.clear()
        conv.open = False
        out.append(TurnEnd(outcome=outcome, detail=detail, status=status))
        return out

    def _answer(
        self,
        conv: Conversation,
        exchange: Exchange,
        body: dict[str, Any],
        msgs: Sequence[Mapping[str, Any]],
        reply: WireReply,
    ) -> list[Record]:
        if reply.assistant is None:
            why = reply.error or "no answer"
            return self._end(conv, "infer_error", why, "infer_error", reply.status)
        out: list[Record] = [reply.assistant]
        conv.last = "reply"
        usage = reply.usage
        if usage is not None:
            out.append(usage)
            out += self._losses(conv, exchange, body, msgs, usage)
        calls = reply.assistant.tool_calls
        conv.pending.update((c.id, c) for c in calls)
        finish = usage.finish_reason if usage else None
        if exchange.disconnected:
            why = "the agent disconnected before the answer ended"
            return out + self._end(conv, "cancelled", why, "cancelled")
        if reply.error is not None:
            return out + self._end(conv, "infer_error", reply.error, "infer_error", reply.status)
        if finish == "length":
            why = "cut by max_tokens (finish_reason length)"
            return out + self._end(conv, "length", why, "length")
        if calls:
            return out
        if finish not in (None, "stop", "tool_calls"):
            why = f"finish_reason {finish}"
            return out + self._end(conv, "server_stopped", why, "server_stopped")
        return out + self._end(conv, "answered", "", "cancelled")

    def _losses(
        self,
        conv: Conversation,
        exchange: Exchange,
        body: dict[str, Any],
        msgs: Sequence[Mapping[str, Any]],
        usage: Usage,
    ) -> list[Record]:
        """The ``CacheLoss`` of this answer by the loop's own rule
        (:func:`boxmaker.cache.cache_loss`), with forensics' cause and position, or nothing."""
        loss = cache_loss(conv.usage, usage)
        if loss is None or conv.usage is None:
            return []
        if not self.forensics or conv.reply is None:
            return [loss]
        if self.behind_s() > HOLD_S:
            why = f"not explained: the log's writer was more than {HOLD_S} s behind"
            return [dataclasses.replace(loss, detail=why)]
        server = self._template_server(exchange.api_key)
        server.deadline = time.monotonic() + FORENSICS_S
        try:
            found = explain_loss(
                server,
                old=SentRequest.of(chat_body(conv.api, json.loads(conv.request))),
                reply=conv.reply,
                new=SentRequest.of(body),
                expected=loss.expected,
                reused=loss.reused,
                held_tokens=held_tokens(conv.usage.timings),
            )
        except Exception as exc:  # forensics never stops the logging
            return [dataclasses.replace(loss, detail=f"forensics failed: {exc}")]
        detail = found.detail + _echo_note(conv, msgs)
        return [
            dataclasses.replace(
                loss,
                position=found.position,
                cause=found.cause,
                old_window=found.old_window,
                new_window=found.new_window,
                detail=detail,
            )
        ]

    def _template_server(self, api_key: str | None) -> TemplateServer:
        """The upstream's template endpoints asked with ``api_key``, kept for the next loss
        (:data:`_TEMPLATE_CLIENTS` keys at most, the least recently used closed first)."""
        server = self._templates.pop(api_key, None)
        if server is None:
            server = TemplateServer(self.upstream, api_key=api_key)
        self._templates[api_key] = server
        while len(self._templates) > _TEMPLATE_CLIENTS:
            self._templates.popitem(last=False)[1].close()
        return server


_TEMPLATE_CLIENTS = 8  # forensics' kept clients of the upstream, one per API key


def _echo_note(conv: Conversation, msgs: Sequence[Mapping[str, Any]]) -> str:
    """Which message of the new request differs from the reply as the server gave it (the
    message a harness rewrites most: its reasoning dropped), in words, or ``""``."""
    n, reply = len(conv.keys), conv.reply
    if reply is None or n >= len(msgs) or msgs[n].get("role") != "assistant":
        return ""
    sent = msgs[n].get("reasoning_content")
    if reply.reasoning and not sent:
        return f"; messages[{n}] (assistant): the agent sent the reply back without its reasoning"
    if reply.reasoning and sent != reply.reasoning:
        return f"; messages[{n}] (assistant): the agent sent the reply back with other reasoning"
    if text_of(msgs[n].get("content")) != (reply.content or ""):
        return f"; messages[{n}] (assistant): the agent sent the reply back with other content"
    return ""


def _calls(message: Mapping[str, Any]) -> tuple[ToolCall, ...]:
    out = []
    for c in message.get("tool_calls") or ():
        if not isinstance(c, dict):
            continue
        fn = c.get("function") or {}
        arguments = fn.get("arguments", "")
        out.append(
            ToolCall(
                id=str(c.get("id", "")),
                name=str(fn.get("name", "")),
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            )
        )
    return tuple(out)
