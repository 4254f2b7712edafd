"""Fakes for testing code built on boxmaker, without a model (public).

The project's own tests use them, and so can a researcher's: a scripted stand-in for the
client, a fake llama-server for :class:`httpx.MockTransport`, and a check that a session log is
well formed. Like httpx's ``MockTransport`` and pydantic-ai's ``TestModel``, they ship in the
package so that code using boxmaker can be tested the way boxmaker is.

- :class:`ScriptedClient` plays a list of :class:`Step` (built with :func:`answer`,
  :func:`calls`, :func:`call`, :func:`timings`, :func:`context_full`) where a
  :class:`~boxmaker.client.Client` goes: ``Runtime(config, client=ScriptedClient([...]), ...)``.
  It records each request body and reasoning budget, and honours ``cancel``.
- :class:`LlamaScript` plays a list of :class:`Reply` behind
  ``httpx.MockTransport(script.handler)``: llama-server's SSE stream (its README's
  ``/v1/chat/completions``: the role event, ``reasoning_content`` and ``content`` one chunk
  per character, ``tool_calls``, ``finish_reason``, ``timings``, ``data: [DONE]``),
  HTTP errors such as the context-full 400 (:func:`context_full_reply`), and stalls; so a real
  :class:`~boxmaker.client.Client` runs end to end without a socket.
- :class:`RateServer`: a stand-in for llama-server on a GPU, on a real socket in a process of
  its own: N slots, a prefill time, a fixed token rate per slot, llama.cpp's chunk format, tool
  calls and the final ``timings``; for measuring a client against a server's rate
  (``benchmarks/gpu_rate.py``).
- :func:`assert_log_well_formed`: every tool call answered exactly once, the last turn ended.

Example::

    from boxmaker.testing import ScriptedClient, answer, assert_log_well_formed, call, calls

    client = ScriptedClient([calls(call("get_weather", {"city": "Oslo"})), answer("Sunny.")])
    runtime = Runtime(config=Config(), client=client, registry=demo_registry())
    assert run_turn(session, runtime, "Weather in Oslo?").content == "Sunny."
    assert_log_well_formed(session)
"""

from __future__ import annotations

from .._public import publish
from ._llama_script import (
    CONTEXT_FULL,
    NOT_FOUND,
    NOT_SERVED,
    SSE_HEAD,
    LlamaScript,
    Reply,
    Stall,
    chunk,
    context_full_reply,
    sse,
)
from ._log import assert_log_well_formed
from ._rate import RateServer
from ._scripted import ScriptedClient, Step, answer, call, calls, context_full, timings

__all__ = [
    "CONTEXT_FULL",
    "NOT_FOUND",
    "NOT_SERVED",
    "SSE_HEAD",
    "LlamaScript",
    "RateServer",
    "Reply",
    "ScriptedClient",
    "Stall",
    "Step",
    "answer",
    "assert_log_well_formed",
    "call",
    "calls",
    "chunk",
    "context_full",
    "context_full_reply",
    "sse",
    "timings",
]

publish(globals(), __all__)
