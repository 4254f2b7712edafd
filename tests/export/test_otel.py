"""boxmaker export otel: GenAI spans of every log (every schema, hostile text), read back by a
real OTLP/HTTP receiver in-process (protobuf decoded with opentelemetry-proto) and from the
OTLP JSON file; the attribute names are the pinned semantic conventions' own."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from extras import reason

from boxmaker import frames
from boxmaker.cli import main
from boxmaker.export import SEMCONV, export_otel

pytest.importorskip("opentelemetry.sdk", reason=reason("opentelemetry.sdk"))
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
from opentelemetry.semconv.attributes import server_attributes

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
HOSTILE = '<script>alert("x")</script>\x1b[2J]]></ok>'


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    folder = tmp_path / "logs"
    folder.mkdir()
    for p in [*DATA.glob("schema-*.jsonl"), ROOT / "cassettes" / "demo-turns.session.jsonl"]:
        shutil.copy(p, folder / p.name)
    t = "2026-11-30T07:00:0{}.000000Z".format
    lines: list[dict[str, Any]] = [
        {
            "type": "baseline",
            "schema": 3,
            "session_id": "hostile",
            "time": t(0),
            "system": "",
            "tools": [],
        },
        {"type": "user", "time": t(1), "content": HOSTILE},
        {
            "type": "assistant",
            "time": t(2),
            "content": None,
            "tool_calls": [{"id": HOSTILE, "name": "f", "arguments": HOSTILE}],
        },
        {
            "type": "usage",
            "time": t(3),
            "timings": {
                "cache_n": 1,
                "prompt_n": 2,
                "predicted_n": 3,
                "prompt_ms": 1.0,
                "predicted_ms": 2.0,
            },
        },
        {
            "type": "approval",
            "time": t(4),
            "call": 1,
            "name": "f",
            "decision": "approved",
            "by": HOSTILE,
            "reason": HOSTILE,
            "waited_ms": 5.0,
        },
        {
            "type": "tool_result",
            "time": t(5),
            "call": 1,
            "tool_call_id": HOSTILE,
            "name": "f",
            "content": HOSTILE,
            "not_run": "loop",
        },
        {"type": "limit_hit", "time": t(6), "kind": "loop", "detail": HOSTILE},
        {"type": "cache_loss", "time": t(7), "expected": 10, "reused": 2, "cause": "evicted"},
        {"type": "turn_end", "time": t(8), "outcome": "loop", "detail": HOSTILE},
    ]
    (folder / "hostile.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder


class Receiver:
    """An OTLP/HTTP traces endpoint: each POST body decoded as ExportTraceServiceRequest."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                message = ExportTraceServiceRequest()
                message.ParseFromString(body)
                received.requests.append(message)
                received.paths.append(f"{self.path} {self.headers['Content-Type']}")
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def spans(self) -> list[Any]:
        return [
            span
            for request in self.requests
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    thread = threading.Thread(target=r.server.serve_forever, daemon=True)
    thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()
    thread.join()


def _attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = (
            [x.string_value for x in v.array_value.values]
            if kind == "array_value"
            else getattr(v, kind)
        )
    return out


def test_spans_over_otlp_http_match_the_frames(logs: Path, receiver: Receiver) -> None:
    n = export_otel(logs, endpoint=receiver.url, server="http://127.0.0.1:8080")
    spans = receiver.spans()
    assert n == len(spans) > 0
    assert set(receiver.paths) == {"/v1/traces application/x-protobuf"}
    loaded = frames.load(logs)
    by_id = {s.span_id: s for s in spans}
    turns = [s for s in spans if s.name == "invoke_agent boxmaker"]
    chats = [s for s in spans if s.name.startswith("chat ")]
    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    # a fork's copies of its parent's records (schema-4.jsonl) give no span: the parent's have
    assert loaded.turns.from_parent.any()
    assert len(turns) == (~loaded.turns.from_parent).sum()
    req = loaded.requests
    in_turns = req[req.turn.notna() & ~req.from_parent]
    assert len(chats) == len(in_turns)
    tc = loaded.tool_calls
    assert len(tools) == (tc.turn.notna() & ~tc.from_parent).sum()
    assert all(s.parent_span_id == b"" for s in turns)
    for s in chats + tools:  # children of their turn, within it
        parent = by_id[s.parent_span_id]
        assert parent.name == "invoke_agent boxmaker" and parent.trace_id == s.trace_id
        assert parent.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano
        assert s.end_time_unix_nano <= parent.end_time_unix_nano
    got = [_attrs(s) for s in chats]
    assert sum(a.get("gen_ai.usage.input_tokens", 0) for a in got) == in_turns.prompt_tokens.sum()
    assert sum(a.get("gen_ai.usage.output_tokens", 0) for a in got) == (
        in_turns.generated_tokens.sum()
    )
    assert {a["server.address"] for a in got} == {"127.0.0.1"}
    assert {a["server.port"] for a in got} == {8080}
    assert all(a["gen_ai.operation.name"] == "chat" for a in got)
    # content is off by default: no message text anywhere
    every = {k for s in spans for k in _attrs(s)}
    assert not every & {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    }
    assert HOSTILE not in str([_attrs(s) for s in spans if s.name.startswith("chat ")])


def test_attribute_names_are_the_pinned_semantic_conventions(logs: Path, tmp_path: Path) -> None:
    out = tmp_path / "spans.json"
    export_otel(logs, file=out, content=True)
    names = set()
    schema_urls = set()
    for line in out.read_text().splitlines():
        body = json.loads(line)
        for resource in body["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                schema_urls.add(scope.get("schemaUrl"))
                for span in scope["spans"]:
                    assert len(span["traceId"]) == 32 and len(span["spanId"]) == 16  # hex
                    names |= {kv["key"] for kv in span["attributes"]}
    assert schema_urls == {f"https://opentelemetry.io/schemas/{SEMCONV}"}
    known = {v for k, v in vars(gen_ai_attributes).items() if k.startswith("GEN_AI_")} | {
        server_attributes.SERVER_ADDRESS,
        server_attributes.SERVER_PORT,
    }
    ours = {n for n in names if not n.startswith("boxmaker.")}
    assert ours <= known, ours - known
    assert {
        "gen_ai.operation.name",
        "gen_ai.request.model",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.response.finish_reasons",
        "gen_ai.conversation.id",
        "gen_ai.tool.name",
        "gen_ai.tool.call.id",
        "gen_ai.input.messages",
        "gen_ai.tool.call.result",
    } <= names


def test_hostile_text_and_boxmaker_facts_are_data(logs: Path, tmp_path: Path) -> None:
    out = tmp_path / "spans.json"
    assert (
        main(["export", "otel", str(logs / "hostile.jsonl"), "--file", str(out), "--content"]) == 0
    )
    body = json.loads(out.read_text())
    spans = body["resourceSpans"][0]["scopeSpans"][0]["spans"]
    by_name = {s["name"]: s for s in spans}

    def attrs(span: dict[str, Any]) -> dict[str, Any]:
        return {kv["key"]: next(iter(kv["value"].values())) for kv in span["attributes"]}

    tool = by_name["execute_tool f"]
    assert attrs(tool)["gen_ai.tool.call.result"] == HOSTILE  # the exact string, as data
    assert attrs(tool)["gen_ai.tool.call.id"] == HOSTILE
    assert attrs(tool)["boxmaker.not_run"] == "loop"
    events = {e["name"]: e for e in tool["events"]}
    assert set(events) == {"boxmaker.approval", "boxmaker.nudge"}
    turn = by_name["invoke_agent boxmaker"]
    assert attrs(turn)["boxmaker.outcome"] == "loop"
    assert attrs(turn)["boxmaker.end_detail"] == HOSTILE
    assert [e["name"] for e in turn["events"]] == ["boxmaker.limit_hit", "boxmaker.cache_loss"]
    chat = attrs(by_name["chat llama.cpp"])
    assert chat["boxmaker.cache_n"] == "1" and chat["gen_ai.usage.input_tokens"] == "3"
    sent = json.loads(chat["gen_ai.input.messages"])
    assert sent == [{"role": "user", "parts": [{"type": "text", "content": HOSTILE}]}]
    start = datetime(2026, 11, 30, 7, 0, 1, tzinfo=UTC)  # the log's own times
    assert int(turn["startTimeUnixNano"]) == int(start.timestamp()) * 10**9
    assert int(turn["endTimeUnixNano"]) == int(start.timestamp() + 7) * 10**9


def test_a_refused_log_warns_and_the_rest_is_exported(logs: Path, tmp_path: Path) -> None:
    (logs / "bad.jsonl").write_text('{"type": "baseline", "schema": 99}\n')
    with pytest.warns(frames.LogReadWarning, match=r"bad\.jsonl.*left out"):
        n = export_otel(logs, file=tmp_path / "s.json")
    assert n > 0
    with pytest.raises(ValueError, match="exactly one"):
        export_otel(logs)


def _one_turn(folder: Path, times: list[str], timings: dict[str, Any]) -> Path:
    """A log of one answered turn: baseline, user, assistant, usage, turn_end at ``times``."""
    folder.mkdir()
    lines: list[dict[str, Any]] = [
        {"type": "baseline", "schema": 4, "session_id": "one", "system": "", "tools": []},
        {"type": "user", "content": "hi"},
        {"type": "assistant", "content": "yo", "tool_calls": []},
        {"type": "usage", "timings": timings},
        {"type": "turn_end", "outcome": "answered"},
    ]
    for line, time in zip(lines, times, strict=True):
        line["time"] = time
    (folder / "one.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder


def _file_spans(folder: Path, out: Path) -> dict[str, tuple[int, int]]:
    """The spans export_otel writes for ``folder``, by name: (start, end) in ns."""
    export_otel(folder, file=out)
    spans = {}
    for line in out.read_text().splitlines():
        for resource in json.loads(line)["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for s in scope["spans"]:
                    name = s["name"].split()[0]
                    spans[name] = (int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]))
    return spans


def test_a_completion_without_its_prompt_time_is_not_its_generation_time(tmp_path: Path) -> None:
    """``timings`` with ``predicted_ms`` and no ``prompt_ms``: the completion's time is
    unknown (the frames say ``<NA>``); the chat span runs from the event before it, as
    without timings, not ``predicted_ms`` alone (it did: 100 ms, shown as measured)."""
    t = "2026-11-30T07:00:0{}.000000Z".format
    timings = {"cache_n": 0, "prompt_n": 5, "predicted_n": 3, "predicted_ms": 100.0}
    folder = _one_turn(tmp_path / "logs", [t(0), t(1), t(3), t(3), t(4)], timings)
    assert frames.load(folder).requests.prompt_ms.isna().all()
    chat = _file_spans(folder, tmp_path / "spans.jsonl")["chat"]
    assert chat[1] - chat[0] == 2_000_000_000  # from the user message (t1) to the answer (t3)
    timings["prompt_ms"] = 10.0
    (tmp_path / "logs").rename(tmp_path / "old")
    folder = _one_turn(tmp_path / "logs", [t(0), t(1), t(3), t(3), t(4)], timings)
    chat = _file_spans(folder, tmp_path / "spans2.jsonl")["chat"]
    assert chat[1] - chat[0] == 110_000_000  # both given: the server's 10 + 100 ms


def test_times_before_1970_are_exact_and_otlp_refuses_them_in_words(tmp_path: Path) -> None:
    """A time's float seconds cut toward zero put ``1969-12-31T23:59:59.5Z`` 1 s late (a turn
    of 1.8 s came out 0.8 s); OTLP's times are unsigned: the export says so, not a
    protobuf ``ValueError``."""
    from boxmaker.errors import ExportError
    from boxmaker.export._logs import nanos

    assert nanos("1969-12-31T23:59:59.500000Z") == -500_000_000
    assert nanos("1970-01-01T00:00:00.000001+00:00") == 1_000
    assert nanos("2026-11-30T07:00:00.250000+01:00") == 1_796_018_400_250_000_000
    times = [f"1969-12-31T23:59:5{i}.500000Z" for i in (6, 7, 8, 8, 9)]
    folder = _one_turn(tmp_path / "logs", times, {"prompt_ms": 1.0, "predicted_ms": 2.0})
    assert frames.load(folder).turns.wall_ms.tolist() == [2000.0]
    with pytest.raises(ExportError, match="before 1970"):
        export_otel(folder, file=tmp_path / "spans.jsonl")


def test_a_tool_span_starts_at_its_call_when_no_usage_follows_the_reply(tmp_path: Path) -> None:
    """A reply with a call and no ``usage`` after it (a server that sent none): the tool's
    span runs from the reply to its result, not from the record before the reply (the
    model's time is not the tool's)."""
    t = "2026-11-30T07:00:{:02d}.000000Z".format
    call = {"id": "c1", "name": "ls", "arguments": "{}"}
    lines: list[dict[str, Any]] = [
        {"type": "baseline", "schema": 4, "session_id": "nousage", "system": "", "tools": []},
        {"type": "user", "content": "list"},
        {"type": "assistant", "content": None, "tool_calls": [call]},
        {"type": "tool_result", "call": 1, "tool_call_id": "c1", "name": "ls", "content": "a"},
        {"type": "turn_end", "outcome": "tool_iterations"},
    ]
    for line, second in zip(lines, (0, 0, 10, 11, 12), strict=True):
        line["time"] = t(second)
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "nousage.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    tool = _file_spans(folder, tmp_path / "spans.jsonl")["execute_tool"]
    assert tool[1] - tool[0] == 1_000_000_000  # from the reply (10 s) to the result (11 s)
