"""What ``boxmaker chat`` does before its first turn: check the server, reopen a session.

Light on purpose: :mod:`boxmaker.cli._main` reads :data:`CHAT_COMMANDS` for ``--help``, so
httpx is imported only when :func:`check_server` runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InferError, SessionError
from ..session import Session

if TYPE_CHECKING:
    import httpx

    from ..config import ClientConfig

__all__ = ["CHAT_COMMANDS", "check_server", "resume_session"]

CHAT_COMMANDS = (
    "commands: /new starts a new session, /quit (or /exit, Ctrl-D) ends the chat; "
    "boxmaker chat --resume LOG goes on with a session later"
)

HEALTH_TIMEOUT_S = 5.0
"""Longest wait in seconds for the answer of ``GET /health`` (connect and read each)."""


def check_server(config: ClientConfig, *, transport: httpx.BaseTransport | None = None) -> None:
    """Ask the llama-server once whether it is up (``GET /health``, no retry), before a prompt.

    llama-server answers ``{"status": "ok"}`` with HTTP 200 once its model is loaded, and HTTP
    503 (``error.type`` ``"unavailable_error"``, message ``"Loading model"``) while it loads
    (llama.cpp ``tools/server/README.md``, ``/health``). The ``Authorization`` header is sent
    when ``config.api_key`` is set (``/health`` needs none, a proxy in front may).

    Args:
        config: where the server is (``config.url``); waits at most ``connect_timeout_s`` to
            connect, capped at :data:`HEALTH_TIMEOUT_S` seconds, and as long to read.
        transport: an httpx transport instead of the network (``httpx.MockTransport`` in tests).

    Raises:
        InferError: no server answered (``status`` ``None``: refused, unknown host, timed
            out), or it answered something other than HTTP 200 (``status`` and ``body``
            kept); the message is one line that names the URL and what was received.
    """
    import httpx  # here: the command line's --help does not need it

    url = f"{config.url.rstrip('/')}/health"
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    timeout = min(config.connect_timeout_s, HEALTH_TIMEOUT_S)
    try:
        with httpx.Client(timeout=timeout, transport=transport, headers=headers) as http:
            response = http.get(url)
    except httpx.TimeoutException:
        raise InferError(
            f"no answer from {url} within {timeout:g} s: is a llama-server there?"
        ) from None
    except httpx.HTTPError as exc:
        raise InferError(
            f"cannot reach a llama-server at {config.url} ({type(exc).__name__}: {exc}); "
            "start one (boxmaker serve, llama-server) or give the right --url"
        ) from None
    if response.status_code == 200:
        return
    body = response.text
    seen = " ".join(body.split())[:120]
    if response.status_code == 503:
        why = "it is still loading its model, try again in a moment"
    elif response.status_code == 401:
        why = "it wants an API key (api_key in the [client] table of --config)"
    else:
        why = "is it a llama-server?"
    raise InferError(
        f"GET {url} answered HTTP {response.status_code} ({seen}): {why}",
        status=response.status_code,
        body=body,
    )


def resume_session(path: str) -> Session:
    """Reopen the session log at ``path`` for writing, to go on with it (``chat --resume``).

    The session keeps the log's own baseline (system prompt and tools); a turn the log left
    open (a chat that was killed) is closed by the next turn, as :func:`boxmaker.run_turn`
    does for any reopened log.

    Raises:
        SessionError: ``path`` is not a file, or :meth:`boxmaker.Session.open` refuses it
            (another writer holds it, it is not a session log).
    """
    if not Path(path).is_file():
        raise SessionError(f"{path}: no such session log (give the .jsonl path chat printed)")
    return Session.open(path)
