"""Before a turn: what the server can do, read once per session and kept in its log.

At a session's first request the loop asks the client for the server's
:class:`~boxmaker.records.Capabilities` (llama.cpp's ``GET /props``) and appends them; later
turns read them back from the log (the session keeps its first such record as it reads and
appends: no turn scans the log for it). Tools offered to a chat template that cannot take them are
refused (:class:`~boxmaker.errors.ToolsNotSupported`) unless ``client.unsupported_tools =
"warn"``: llama.cpp then drops the tools from the prompt without a word, and an answer would be
logged as ``answered`` although the tools never reached the model.

A client that cannot say (a test's fake, a server without ``/props``) gives no record, and
nothing is assumed. Inside a cassette the client's side request is refused (a cassette holds
the chat traffic only), so nothing is asked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from ..config import Config
from ..errors import ToolsNotSupported
from ..records import Capabilities
from ..session import Session

__all__ = [
    "CancelsSideRequests",
    "ReadsCapabilities",
    "read_capabilities",
    "refuse_unsupported_tools",
    "side_requests_cancelled",
]

log = logging.getLogger("boxmaker.turn")


@runtime_checkable
class ReadsCapabilities(Protocol):
    """A client that can say what its server can do (:class:`boxmaker.client.Client`)."""

    def capabilities(self) -> Capabilities | None:
        """The server's capabilities, ``None`` when it does not say."""
        ...


@runtime_checkable
class CancelsSideRequests(Protocol):
    """A client whose side requests a cancel can cut (:meth:`boxmaker.client.Client.cancelling`)."""

    def cancelling(self, cancel: threading.Event) -> AbstractContextManager[None]:
        """Within the block, this thread's side requests end soon after ``cancel`` is set."""
        ...


def side_requests_cancelled(
    client: object, cancel: threading.Event
) -> AbstractContextManager[None]:
    """A block in which the turn's side requests on ``client`` (the first ``GET /props``,
    cache forensics' requests) end within about 0.1 s of ``cancel`` (the turn's), so Stop is
    prompt there too; nothing for a client that cannot (a test's fake)."""
    if isinstance(client, CancelsSideRequests):
        return client.cancelling(cancel)
    return contextlib.nullcontext()


def read_capabilities(session: Session, client: object) -> list[Capabilities]:
    """The ``Capabilities`` record to append before the session's first request: ``[]`` when
    the log has one already, the client cannot say (no ``capabilities()``, or ``None``: a cassette
    refuses the request). Its ``warning`` is set when the session's tools cannot be taken."""
    if session.capabilities() is not None or not isinstance(client, ReadsCapabilities):
        return []
    caps = client.capabilities()
    if caps is None:
        return []
    n_tools = len(session.baseline.tools)
    if n_tools and caps.supports_tools is False:
        model = f" ({caps.model})" if caps.model else ""
        warning = (
            f"the server's chat template{model} cannot take tools (GET /props: "
            f"chat_template_caps.supports_tools false): llama.cpp drops the {n_tools} tool(s) "
            "from the prompt, so the model answers without them"
        )
        caps = dataclasses.replace(caps, warning=warning)
    return [caps]


def refuse_unsupported_tools(session: Session, config: Config) -> None:
    """Refuse the turn when the session's recorded capabilities say its tools cannot be taken
    and ``config.client.unsupported_tools`` is ``"error"`` (with ``"warn"``: logged only).

    Raises:
        ToolsNotSupported: the message says which template, how many tools, and the way out.
    """
    caps = session.capabilities()
    if caps is None or caps.warning is None or not session.baseline.tools:
        return
    if config.client.unsupported_tools == "error":
        raise ToolsNotSupported(
            f"{caps.warning}. Use a model whose chat template takes tools, or set "
            'client.unsupported_tools = "warn" to run anyway (recorded)'
        )
    log.warning("%s", caps.warning)
