from __future__ import annotations

import json
from collections.abc import Callable
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.errors import BoxmakerError, ToolError
from boxmaker.tools import (
    InProcessPort,
    Registry,
    ToolAnswer,
    ToolDenied,
    ToolFailed,
    ToolOk,
    ToolPendingApproval,
    ToolRequest,
    cap_result,
    dispatch,
    schema_from_function,
)


def get_weather(city: str, unit: Literal["C", "F"] = "C") -> dict[str, object]:
    """Current weather for a city.

    Args:
        city: the city's name, as the user wrote it.
        unit: temperature unit.
    """
    return {"city": city, "temperature": 21, "unit": unit}


def boom(x: int) -> str:
    """Always fails."""
    raise RuntimeError(f"broken with {x}")


@pytest.fixture
def registry() -> Registry:
    reg = Registry()
    reg.add(get_weather)
    reg.add(boom)
    reg.add_port_tool(
        "search",
        "Search the web.",
        {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    )
    return reg


def test_schema_from_type_hints_and_docstring() -> None:
    desc, schema = schema_from_function(get_weather)
    assert desc == "Current weather for a city."
    assert schema == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "the city's name, as the user wrote it."},
            "unit": {"enum": ["C", "F"], "description": "temperature unit."},
        },
        "required": ["city"],
    }


def test_definitions_are_openai_tools(registry: Registry) -> None:
    defs = registry.definitions()
    assert [d["function"]["name"] for d in defs] == ["get_weather", "boom", "search"]
    assert defs[0]["type"] == "function"
    assert defs[2]["function"]["parameters"]["required"] == ["q"]


def test_local_result(registry: Registry) -> None:
    out = dispatch(registry, "get_weather", '{"city": "Oslo"}')
    assert json.loads(out.content) == {"city": "Oslo", "temperature": 21, "unit": "C"}
    assert (out.data_class, out.untrusted) == ("public", False)


def test_unknown_tool(registry: Registry) -> None:
    out = dispatch(registry, "get_wether", "{}")
    assert out.content == (
        "Unknown tool 'get_wether'. The tools offered are: get_weather, boom, search."
    )


def test_bad_json(registry: Registry) -> None:
    out = dispatch(registry, "get_weather", '{"city": "Oslo"')
    assert out.content.startswith("The arguments for get_weather are not valid JSON (")
    assert out.content.endswith("the call was not run.")


def test_arguments_not_an_object(registry: Registry) -> None:
    out = dispatch(registry, "get_weather", '["Oslo"]')
    assert "must be a JSON object, not list" in out.content


def test_schema_mismatch(registry: Registry) -> None:
    out = dispatch(registry, "get_weather", '{"city": "Oslo", "unit": "K"}')
    assert out.content.startswith("The arguments for get_weather do not fit its schema at unit:")
    missing = dispatch(registry, "get_weather", "{}")
    assert "(top level): 'city' is a required property" in missing.content


def test_exception_inside_a_tool(registry: Registry) -> None:
    out = dispatch(registry, "boom", '{"x": 3}')
    assert out.content == "The tool failed: RuntimeError: broken with 3"


def _port(answer: ToolAnswer) -> InProcessPort:
    return InProcessPort({"search": lambda req: answer})


def test_port_result_keeps_labels_and_request(registry: Registry) -> None:
    port = _port(ToolOk(content="page", data_class="web", untrusted=True))
    out = dispatch(registry, "search", '{"q": "x"}', port=port, session_id="s1", call=7)
    assert (out.content, out.data_class, out.untrusted) == ("page", "web", True)
    assert port.requests == [
        ToolRequest(session_id="s1", call=7, tool="search", arguments={"q": "x"})
    ]


def test_port_failed(registry: Registry) -> None:
    out = dispatch(registry, "search", '{"q": "x"}', port=_port(ToolFailed(message="timeout")))
    assert out.content == "The tool failed: timeout"


def test_port_denied(registry: Registry) -> None:
    out = dispatch(registry, "search", '{"q": "x"}', port=_port(ToolDenied(reason="policy")))
    assert out.content == "The call was denied: policy"


def test_port_pending_approval(registry: Registry) -> None:
    out = dispatch(
        registry, "search", '{"q": "x"}', port=_port(ToolPendingApproval(reason="admin"))
    )
    assert out.content == (
        "The call needs approval (admin), and this loop cannot wait for approval: it was not run."
    )


def test_port_exception_and_missing_port(registry: Registry) -> None:
    def raises(req: ToolRequest) -> ToolOk:
        raise ConnectionError("port down")

    port = InProcessPort({"search": raises})
    assert dispatch(registry, "search", '{"q": "x"}', port=port).content == (
        "The tool failed: ConnectionError: port down"
    )
    assert "no tool port is connected" in dispatch(registry, "search", '{"q": "x"}').content


def test_registry_refuses_duplicates_and_bad_schemas(registry: Registry) -> None:
    with pytest.raises(ValueError, match="registered already"):
        registry.add(get_weather)
    with pytest.raises(ValueError, match="invalid parameters schema"):
        registry.add_port_tool("x", "", {"type": "nonsense"})
    with pytest.raises(ValueError, match="invalid tool name"):
        registry.add_port_tool("has space", "", {"type": "object"})


def test_cap_result_short_text_untouched() -> None:
    assert cap_result("abc", 3) == ("abc", False)
    assert cap_result("abc" * 1000, None) == ("abc" * 1000, False)


def test_cap_result_long_text() -> None:
    text, truncated = cap_result("x" * 5000, 100)
    assert truncated and len(text) == 100
    assert text.endswith("\n[truncated: the first 45 of 5000 characters are shown]")
    assert text.startswith("x" * 45 + "\n")


@given(st.text(max_size=300), st.integers(min_value=0, max_value=400))
def test_cap_result_never_exceeds_the_cap(text: str, cap: int) -> None:
    out, truncated = cap_result(text, cap)
    assert len(out) <= cap
    assert truncated == (len(text) > cap)
    if not truncated:
        assert out == text
    else:
        kept = out.split("\n[truncated")[0] if "[truncated" in out else out
        assert text.startswith(kept)
        if cap > 12:  # a note whenever one fits
            assert out.endswith(("\n[truncated]", " characters are shown]"))


def test_cap_result_too_small_for_the_full_note_keeps_a_short_one() -> None:
    assert cap_result("abcdefghijklmnopqrstuvwxyz" * 2, 20) == ("abcdefgh\n[truncated]", True)
    assert cap_result("abcdefghijklmnopqrstuvwxyz", 12) == ("abcdefghijkl", True)
    assert cap_result("abc", 0) == ("", True)


def test_unserialisable_result_is_a_failure_text() -> None:
    reg = Registry()
    reg.add(lambda: {1, 2}, name="odd", description="odd", parameters={"type": "object"})
    out = dispatch(reg, "odd", "{}")
    assert out.content == "The tool failed: TypeError: Object of type set is not JSON serializable"


def test_lone_surrogates_in_results_are_replaced() -> None:
    reg = Registry()
    reg.add(lambda s: s, name="echo", description="echo", parameters={"type": "object"})
    out = dispatch(reg, "echo", '{"s": "a\\ud800b"}')
    assert out.content == "a\ufffdb"
    out.content.encode("utf-8")


def test_parameters_that_cannot_be_named_are_refused() -> None:
    def star(*cities: str) -> str:
        """Varargs."""
        return ""

    def kw(**opts: int) -> str:
        """Kwargs."""
        return ""

    def positional(city: str, /) -> str:
        """Positional only."""
        return city

    for fn in (star, kw, positional):
        with pytest.raises(ValueError, match="named arguments only"):
            Registry().add(fn)


def test_deeply_nested_arguments_do_not_crash(registry: Registry) -> None:
    out = dispatch(registry, "get_weather", "[" * 100_000)
    assert "not valid JSON" in out.content


def test_a_tool_without_a_description_is_refused() -> None:
    """Issue 21: a function without a docstring registered with an empty description."""
    registry = Registry()

    def bare(city: str) -> str:
        return city

    with pytest.raises(ToolError, match=r"tool 'bare' has no description: give the function"):
        registry.add(bare)
    with pytest.raises(ToolError, match="tool 'blank' has no description"):
        registry.add(bare, name="blank", description="  ")
    assert len(registry) == 0
    registry.add(bare, description="Echo a city.")
    assert registry.definitions()[0]["function"]["description"] == "Echo a city."


def test_registry_errors_are_in_the_boxmaker_tree() -> None:
    """Issue 21: ``Registry.add`` raised a plain ValueError outside BoxmakerError."""
    registry = Registry()

    def f(x: int) -> int:
        """F."""
        return x

    def star(*args: int) -> int:
        return 1

    registry.add(f)
    calls: list[Callable[[], object]] = [
        lambda: registry.add(f),
        lambda: registry.add(f, name="not a name"),
        lambda: registry.add(f, name="g", parameters={"type": 3}),
        lambda: registry.add(star, name="h", description="d"),
    ]
    for call in calls:
        with pytest.raises(ToolError) as info:
            call()
        assert isinstance(info.value, BoxmakerError) and isinstance(info.value, ValueError)
