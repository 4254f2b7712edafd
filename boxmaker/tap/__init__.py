"""``boxmaker tap``: a pass-through proxy in front of llama-server that writes boxmaker session
logs for agents boxmaker does not run (coding agents, agent frameworks, MCP hosts).

Point the agent at :attr:`Tap.url` instead of the server: every request and answer passes
unchanged (streams event by event, disconnects passed on, every route forwarded), and each
conversation through ``/v1/chat/completions``, ``/v1/messages`` or ``/v1/responses`` (the
Responses API of Codex CLI and the OpenAI Agents SDK: :func:`responses_body`,
:class:`ResponsesDecoder`) becomes one session log (:class:`TapLog`): its messages, tool calls
and results as the agent sent them, each completion's ``Usage`` with llama.cpp's ``timings``,
and each ``CacheLoss`` with the cause and token position boxmaker's cache forensics find
(:mod:`boxmaker.cache`), all written off the request path; what it cannot read it forwards, and
says so once per route (:attr:`TapLog.notes`). The logs read as boxmaker's own:
:class:`boxmaker.session.Session`, the frames, ``boxmaker report``, ``boxmaker cache explain``;
:func:`what_if_log` (``boxmaker replay LOG.jsonl``) says which loop limit would have stopped
the agent. With a cassette (``Tap(..., cassette=PATH)``, ``boxmaker tap --cassette PATH``)
every exchange is also recorded, scrubbed, into a cassette that
:func:`boxmaker.cassettes.use_cassette` replays (:class:`TapCassette`).

The tap is a network service holding every agent's credentials on their way upstream: it
listens on 127.0.0.1 unless told otherwise and forwards only what its :class:`Guard` lets in
(origin-form requests for the upstream's own paths, ``Host`` naming the tap, no browser's
request unless its origin is allowed, bodies, heads and idle connections bounded, a cap on
connections; the knobs are :class:`boxmaker.config.TapConfig`, ``[tap]`` in a config file).
"""

from .._public import publish
from ._cassette import Recorded, TapCassette
from ._guard import Guard, Refusal
from ._log import FORENSICS_S, HOLD_AT_MOST_S, HOLD_S, LOG_WITHIN_S, OPEN_LOGS, Exchange, TapLog
from ._proxy import CAUGHT_SIGNALS, GRACE_S, HOP_BY_HOP, Tap, make_app
from ._responses import RESPONSES_PATHS, ResponsesDecoder, responses_body
from ._whatif import LogWhatIf, what_if_log
from ._wire import (
    ANTHROPIC_PATHS,
    CHAT_PATHS,
    UNREAD_PATHS,
    WireApi,
    WireReply,
    anthropic_body,
    api_of,
    chat_body,
    message_key,
    read_reply,
)

__all__ = [
    "ANTHROPIC_PATHS",
    "CAUGHT_SIGNALS",
    "CHAT_PATHS",
    "FORENSICS_S",
    "GRACE_S",
    "HOLD_AT_MOST_S",
    "HOLD_S",
    "HOP_BY_HOP",
    "LOG_WITHIN_S",
    "OPEN_LOGS",
    "RESPONSES_PATHS",
    "UNREAD_PATHS",
    "Exchange",
    "Guard",
    "LogWhatIf",
    "Recorded",
    "Refusal",
    "ResponsesDecoder",
    "Tap",
    "TapCassette",
    "TapLog",
    "WireApi",
    "WireReply",
    "anthropic_body",
    "api_of",
    "chat_body",
    "make_app",
    "message_key",
    "read_reply",
    "responses_body",
    "what_if_log",
]

publish(globals(), __all__)
