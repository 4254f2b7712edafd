"""The httpx client for llama-server: one streamed chat completion, retries, events,
cancel, the thinking cap of a completion, slot leases (never two requests in flight on one
llama.cpp slot), a request sent once more when a reused connection was closed under it, and
side requests to the same server (``ServerJson``).

Under it, ``_stream`` is sans-I/O (bytes in, events out, as h11 does it): SSE lines ->
chunks -> client events and a ``Completion``, shared by the client and the cassette
reader. Request and stream formats: llama.cpp's server README (``tools/server``) and
OpenAI's chat completions API.
"""

from .._public import publish
from ._caps import capabilities_of
from ._client import ChatClient, Client
from ._errors import is_context_full
from ._reuse import send_once_more
from ._side import SIDE_REFUSED, SIDE_REFUSED_STATUS, SIDE_REQUEST, ServerJson, refused
from ._slots import LEASES, SlotLeases
from ._stream._completion import Completion
from ._stream._decoder import StreamDecoder
from ._thinking_cap import IGNORED_BUDGET_MARGIN

__all__ = [
    "IGNORED_BUDGET_MARGIN",
    "LEASES",
    "SIDE_REFUSED",
    "SIDE_REFUSED_STATUS",
    "SIDE_REQUEST",
    "ChatClient",
    "Client",
    "Completion",
    "ServerJson",
    "SlotLeases",
    "StreamDecoder",
    "capabilities_of",
    "is_context_full",
    "refused",
    "send_once_more",
]

publish(globals(), __all__)
