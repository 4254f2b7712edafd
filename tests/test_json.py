"""orjson only where it gives what json gives: request bodies, log lines, whole logs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxmaker import _json as fastjson
from boxmaker.client import Client
from boxmaker.config import ClientConfig
from boxmaker.errors import SessionError
from boxmaker.session import dumps_line, read_log

BIG = 2**70 + 3  # orjson reads it as a float and refuses to write it

_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats()  # NaN and infinities too
    | st.text(max_size=6)  # lone surrogates too
)
_value = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=15,
)


def same(a: Any, b: Any) -> bool:
    """Equal JSON values (NaN equal to NaN), dict keys in the same order."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and list(a) == list(b)
            and all(same(a[k], b[k]) for k in a)
            and type(a) is type(b)
        )
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


@settings(max_examples=150, deadline=None)
@given(obj=_value)
def test_dumps_writes_what_json_writes_or_leaves_it_to_json(obj: Any) -> None:
    text = fastjson.dumps(obj)
    if text is None:
        return
    assert same(json.loads(text), obj)
    assert text == json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() or same(
        json.loads(text), json.loads(json.dumps(obj))
    )


def test_dumps_leaves_to_json_what_orjson_would_write_otherwise() -> None:
    assert fastjson.dumps({"a": BIG}) is None
    assert fastjson.dumps({"a": [1.0, math.nan]}) is None  # orjson: null
    assert fastjson.dumps({"a": -math.inf, "b": None}) is None
    assert fastjson.dumps({"a": "x\ud800"}) is None
    assert fastjson.dumps({1: "a"}) is None  # json writes the key as "1"
    assert fastjson.dumps({"a": None, "b": 1.5, "c": "é"}) == '{"a":null,"b":1.5,"c":"é"}'.encode()


@settings(max_examples=150, deadline=None)
@given(obj=_value)
def test_loads_reads_what_json_reads(obj: Any) -> None:
    text = json.dumps(obj).encode()  # NaN as NaN, surrogates escaped: orjson refuses both
    assert same(fastjson.loads(text), json.loads(text))


@pytest.mark.parametrize("text", [b"", b"  \n", b"1], [2", b"{}], [{}", b"]]], [[[1"])
def test_loads_refuses_what_json_refuses_however_it_meets_the_padding(text: bytes) -> None:
    """Text that is empty, or closes and reopens orjson's padding brackets, is no JSON value:
    before, an IndexError (the session-id reader of a folder with an empty log) or a wrong
    value ("1], [2" read as 1)."""
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        fastjson.loads(text)


def test_loads_keeps_integers_beyond_64_bits_and_json_s_depth_limit() -> None:
    assert fastjson.loads(f"[{BIG}, {-BIG}, 1e400, -9223372036854775809]".encode()) == [
        BIG,
        -BIG,
        math.inf,
        -9223372036854775809,
    ]
    deep = b"[" * 900 + b"]" * 900
    assert fastjson.loads(deep) == json.loads(deep)
    with pytest.raises(RecursionError):
        fastjson.loads(b"[" * 5000 + b"]" * 5000)
    with pytest.raises(ValueError):
        fastjson.loads(b'{"a": 1,}')


def test_log_lines_keep_nan_and_big_integers(tmp_path: Path) -> None:
    head = {"type": "baseline", "schema": 2, "session_id": "x", "time": "2026-11-30T00:00:00Z"}
    usage = {"type": "usage", "timings": {"prompt_ms": math.nan, "n": BIG}, "time": "t"}
    assert (
        dumps_line(usage)
        == b'{"type":"usage","timings":{"prompt_ms":NaN,"n":%d},"time":"t"}\n' % BIG
    )
    path = tmp_path / "x.jsonl"
    path.write_bytes(dumps_line(head) + dumps_line(usage))
    (_, record) = fastjson.loads(b"[" + path.read_bytes()[:-1].replace(b"\n", b",") + b"]")
    assert record["timings"]["n"] == BIG  # the whole-log parse keeps both as json does
    assert math.isnan(record["timings"]["prompt_ms"])
    # and the log's rule refuses both (the analysis holds neither), naming the first
    with pytest.raises(
        SessionError, match=r"x\.jsonl:2: usage record: timings\.n = \d+ is out of range"
    ):
        read_log(path)


def test_log_lines_are_compact_utf8_in_key_order() -> None:
    obj = {"z": 1, "a": 'é\n"', "m": [None, True, 1.5]}
    assert dumps_line(obj) == '{"z":1,"a":"é\\n\\"","m":[null,true,1.5]}\n'.encode()


# --- request bodies -------------------------------------------------------------------------------

DONE = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'


def sent_body(body: dict[str, Any]) -> httpx.Request:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        request.read()
        seen.append(request)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=DONE)

    with Client(ClientConfig(url="http://llama.test"), transport=httpx.MockTransport(handler)) as c:
        c.chat(body, lambda event: None)
    return seen[0]


def test_request_body_is_the_same_json_with_its_content_type() -> None:
    body = {"messages": [{"role": "user", "content": "é \u2028 x"}], "seed": BIG, "temp": 0.5}
    request = sent_body(body)
    assert request.headers["content-type"] == "application/json"
    assert request.headers["accept"] == "text/event-stream"
    sent = json.loads(request.content)
    keys = [k for k in sent if k != "id_slot"]  # the slot the client's lease picked, added
    assert keys == [*body, "stream", "return_progress", "cache_prompt", "stream_options"]
    assert sent["seed"] == BIG and sent["messages"] == body["messages"]
    assert int(request.headers["content-length"]) == len(request.content)


def test_request_body_with_nan_is_refused_as_before() -> None:
    with pytest.raises(ValueError, match="JSON compliant"):
        sent_body({"messages": [], "temperature": math.nan})
