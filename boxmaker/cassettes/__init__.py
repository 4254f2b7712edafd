"""Record and replay inference traffic with vcrpy: live recording, readable files, no secrets.

The parts, one role each:

- :mod:`~boxmaker.cassettes`: the readable YAML form of a cassette (request bodies
  parsed, llama.cpp's SSE streams as literal blocks, JSON answers as mappings) and
  :func:`load_interactions`;
- :mod:`~boxmaker.cassettes`: what never reaches a cassette (every header but
  ``Accept`` and ``Content-Type``; the request's credentials, the ``Authorization`` token
  among them, wherever they appear; credential-like query parameters and JSON fields);
- :mod:`~boxmaker.cassettes`: requests match on method, path and body compared as
  parsed JSON; :func:`first_body_difference` names where two bodies differ;
- :mod:`~boxmaker.cassettes`: :func:`use_cassette` and :func:`make_vcr`, a streaming
  record/replay patch of the httpx transports, sync and async (the widgets, Stop and the
  thinking cap see the stream as it arrives while it is recorded);
- :mod:`~boxmaker.cassettes`: :class:`CassetteWriter`, a cassette written from exchanges
  seen elsewhere (``boxmaker tap --cassette``), scrubbed the same way;
- :mod:`~boxmaker.cassettes`: the teed and replayed response streams, for httpx and
  the openai SDK's ``httpx2``;
- :mod:`~boxmaker.cassettes`: a :func:`transcript`, the prefix check
  (:func:`prefix_problems`), a recorded stream read with the client's decoder
  (:func:`read_stream`), the :func:`recorded_session`;
- :mod:`~boxmaker.cassettes.whatif`: :func:`what_if`, the loop run again on a recording with
  other limits (the layer above :mod:`boxmaker.turn`).

Nothing here prints: ``boxmaker cassette show|check`` and ``boxmaker replay`` print what these
functions return (:mod:`boxmaker.cli`). In record mode ``none`` (the default, used in CI) no
real request is made: a request with no match fails at once with a
:class:`~boxmaker.errors.CassetteError` naming the cassette, the request's number and the
first differing place in the body, e.g. ``messages[5].content``.

Example::

    with use_cassette("cassettes/demo.yaml", record_mode="none"):
        run_turn(session, runtime, "What is the weather in Lisbon?")

The pytest side (fixture, marker, ``--record-mode``) is :mod:`boxmaker.cassettes.pytest_plugin`.
"""

from __future__ import annotations

from ._inspection import (
    CHAT_PATH,
    PrefixCheck,
    RecordedSession,
    StreamReading,
    check_prefix,
    prefix_problems,
    read_stream,
    recorded_session,
    transcript,
)
from ._matching import MISSING, first_body_difference
from ._scrub import (
    API_KEY_PLACEHOLDER,
    SECRET_FIELDS,
    SECRET_HEADERS,
    SECRET_PLACEHOLDER,
    SECRET_QUERY_PARAMETERS,
)
from ._serializer import load_interactions, serializer
from ._transport import (
    RECORD_MODES,
    RecordMode,
    UnrecordedRequest,
    make_vcr,
    unplayed,
    unplayed_message,
    use_cassette,
)
from ._writer import CassetteWriter
from .whatif import WhatIf, what_if

__all__ = [
    "API_KEY_PLACEHOLDER",
    "CHAT_PATH",
    "MISSING",
    "RECORD_MODES",
    "SECRET_FIELDS",
    "SECRET_HEADERS",
    "SECRET_PLACEHOLDER",
    "SECRET_QUERY_PARAMETERS",
    "CassetteWriter",
    "PrefixCheck",
    "RecordMode",
    "RecordedSession",
    "StreamReading",
    "UnrecordedRequest",
    "WhatIf",
    "check_prefix",
    "first_body_difference",
    "load_interactions",
    "make_vcr",
    "prefix_problems",
    "read_stream",
    "recorded_session",
    "serializer",
    "transcript",
    "unplayed",
    "unplayed_message",
    "use_cassette",
    "what_if",
]

from .._public import publish

publish(globals(), __all__)
