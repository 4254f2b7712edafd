"""The scripted client of the tests: :mod:`boxmaker.testing`'s, re-exported (import it from
there; this module stays for branches that still import ``fakes``)."""

from boxmaker.testing import ScriptedClient, Step, answer, call, calls, context_full, timings

__all__ = ["ScriptedClient", "Step", "answer", "call", "calls", "context_full", "timings"]
