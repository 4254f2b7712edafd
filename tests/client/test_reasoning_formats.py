"""EmbeddedServer's reasoning_format and api_key options, checked before any model loads."""

from __future__ import annotations

import pytest

from boxmaker.errors import ServerError
from boxmaker.server import REASONING_FORMATS, EmbeddedServer


def test_unknown_reasoning_format_is_refused_before_loading() -> None:
    with pytest.raises(ServerError, match="reasoning_format = 'deepseek2' is none of"):
        EmbeddedServer(reasoning_format="deepseek2")
    server = EmbeddedServer(reasoning_format="none", api_key="k")
    assert (server.reasoning_format, server.api_key, server.running) == ("none", "k", False)
    assert sorted(REASONING_FORMATS) == ["auto", "deepseek", "deepseek-legacy", "none"]
