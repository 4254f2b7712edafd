"""Approval of tool calls: the policy, the waiting port (callback, later decision, timeout,
cancel), the console prompt, and the Approval record in the log."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from boxmaker.config import ApprovalPolicy, Config
from boxmaker.errors import TurnCancelled
from boxmaker.records import (
    Approval,
    Baseline,
    ToolResult,
    TurnEnd,
    parse_time,
    record_from_json,
    record_to_json,
)
from boxmaker.session import Session
from boxmaker.testing import ScriptedClient, answer, call, calls
from boxmaker.tools import InProcessPort, Registry, ToolHints, ToolOk, ToolRequest
from boxmaker.tools.approval import ApprovalPort, ConsolePrompt, PendingCall, needs_approval
from boxmaker.turn import Runtime, run_turn
from boxmaker.view import ConsoleView

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _inner() -> InProcessPort:
    return InProcessPort(
        {
            "forget_city": lambda r: ToolOk(content=f"forgot {r.arguments['city']}", server="s"),
            "weather": lambda r: ToolOk(content="sunny"),
        }
    )


def _turn(
    tmp_path: Path, port: ApprovalPort, *tool_calls: Any
) -> tuple[Session, Runtime, list[Any]]:
    registry = Registry()
    registry.add_port_tool("forget_city", "Forget a city.", SCHEMA)
    registry.add_port_tool("weather", "Weather.", SCHEMA)
    session = Session.create(tmp_path, Baseline(tools=registry.definitions()))
    client = ScriptedClient([calls(*tool_calls), answer("Done.")])
    runtime = Runtime(config=Config(), client=client, registry=registry, port=port)
    return session, runtime, []


def _of(session: Session, kind: type) -> list[Any]:
    return [r for r in session.records if isinstance(r, kind)]


def test_approved_by_a_callback_runs_the_call_and_logs_the_decision(tmp_path: Path) -> None:
    inner = _inner()
    asked: list[PendingCall] = []

    def ask(pending: PendingCall) -> bool:
        asked.append(pending)
        return True

    port = ApprovalPort(inner, ApprovalPolicy(tools=("forget_city",)), ask)
    session, runtime, events = _turn(
        tmp_path, port, call("forget_city", {"city": "Oslo"}), call("weather", {"city": "Oslo"})
    )
    run_turn(session, runtime, "Forget Oslo.", events.append)
    assert [p.tool for p in asked] == ["forget_city"]  # weather is not in the policy
    assert asked[0].why == "the policy names forget_city"
    assert asked[0].pretty_arguments() == '{\n  "city": "Oslo"\n}'
    (approval,) = _of(session, Approval)
    assert (approval.call, approval.name, approval.decision, approval.by, approval.reason) == (
        1,
        "forget_city",
        "approved",
        "callback",
        "",
    )
    assert approval.waited_ms >= 0
    results = _of(session, ToolResult)
    assert [(r.content, r.not_run, r.server) for r in results] == [
        ("forgot Oslo", None, "s"),
        ("sunny", None, None),
    ]
    # the decision is logged (and emitted) just before the call's result
    records = list(session.records)
    assert records.index(approval) + 1 == records.index(results[0])
    assert approval in events
    assert [r.tool for r in inner.requests] == ["forget_city", "weather"]
    assert port.pending == []


def test_denied_by_a_callback_is_not_run(tmp_path: Path) -> None:
    inner = _inner()

    def ask(pending: PendingCall) -> None:
        pending.deny(by="alice", reason="not today")
        assert not pending.approve(by="bob")  # the first decision wins

    port = ApprovalPort(inner, ApprovalPolicy(every_call=True), ask)
    session, runtime, _ = _turn(tmp_path, port, call("forget_city", {"city": "Oslo"}))
    run_turn(session, runtime, "Forget Oslo.")
    (approval,) = _of(session, Approval)
    assert (approval.decision, approval.by, approval.reason) == ("denied", "alice", "not today")
    (result,) = _of(session, ToolResult)
    assert result.content == "The call was denied: denied by not today (alice)"
    assert result.not_run == "denied" and result.server is None
    assert inner.requests == []


def test_a_decision_made_later_from_another_thread(tmp_path: Path) -> None:
    port_box: list[ApprovalPort] = []

    def ask(pending: PendingCall) -> None:  # a panel: show it, decide when clicked
        def click() -> None:
            assert port_box[0].pending == [pending]  # listed while it waits
            pending.approve(by="panel", reason="looks fine")

        threading.Timer(0.1, click).start()

    port = ApprovalPort(_inner(), ApprovalPolicy(every_call=True, timeout_s=30), ask)
    port_box.append(port)
    session, runtime, _ = _turn(tmp_path, port, call("weather", {"city": "Oslo"}))
    run_turn(session, runtime, "Weather?")
    (approval,) = _of(session, Approval)
    assert (approval.decision, approval.by, approval.reason) == ("approved", "panel", "looks fine")
    assert approval.waited_ms > 0
    assert _of(session, ToolResult)[0].content == "sunny"


def test_no_decision_in_time_denies(tmp_path: Path) -> None:
    port = ApprovalPort(_inner(), ApprovalPolicy(every_call=True, timeout_s=0.2), lambda p: None)
    session, runtime, _ = _turn(tmp_path, port, call("weather", {"city": "Oslo"}))
    run_turn(session, runtime, "Weather?")
    (approval,) = _of(session, Approval)
    assert (approval.decision, approval.by, approval.reason) == (
        "denied",
        "timeout",
        "no decision within 0.2 s",
    )
    assert _of(session, ToolResult)[0].not_run == "denied"


def test_stop_while_waiting_denies_and_ends_the_turn(tmp_path: Path) -> None:
    port = ApprovalPort(_inner(), ApprovalPolicy(every_call=True, timeout_s=None), lambda p: None)
    session, runtime, _ = _turn(
        tmp_path, port, call("weather", {"city": "Oslo"}), call("forget_city", {"city": "Oslo"})
    )
    threading.Timer(0.2, runtime.cancel.set).start()
    with pytest.raises(TurnCancelled):
        run_turn(session, runtime, "Weather?")  # would wait forever without the cancel
    (approval,) = _of(session, Approval)
    assert (approval.decision, approval.by) == ("denied", "cancel")
    first, second = _of(session, ToolResult)
    assert (first.not_run, second.not_run) == ("denied", "cancelled")
    assert _of(session, TurnEnd)[-1].outcome == "cancelled"


def test_a_failing_callback_denies(tmp_path: Path) -> None:
    def ask(pending: PendingCall) -> bool:
        raise RuntimeError("widget gone")

    port = ApprovalPort(_inner(), ApprovalPolicy(every_call=True), ask)
    session, runtime, _ = _turn(tmp_path, port, call("weather", {"city": "Oslo"}))
    run_turn(session, runtime, "Weather?")
    (approval,) = _of(session, Approval)
    assert (approval.decision, approval.by) == ("denied", "error")
    assert "RuntimeError('widget gone')" in approval.reason


class _Hinted(InProcessPort):
    def hints(self, tool: str) -> ToolHints | None:
        return {
            "wipe": ToolHints(destructive=True),
            "read": ToolHints(read_only=True),
            "add": ToolHints(destructive=False),
        }.get(tool)


def test_policy_rules() -> None:
    hinted = _Hinted({})
    destructive = ApprovalPolicy(destructive=True)
    assert needs_approval(destructive, "wipe", hinted) == "the server marks wipe destructive"
    assert needs_approval(destructive, "read", hinted) is None  # read-only: never destructive
    assert needs_approval(destructive, "add", hinted) is None
    assert needs_approval(destructive, "unknown", hinted) is None
    assert needs_approval(destructive, "wipe", InProcessPort({})) is None  # a port without hints
    named = ApprovalPolicy(tools=("read",))
    assert needs_approval(named, "read", hinted) == "the policy names read"
    assert needs_approval(named, "wipe", hinted) is None
    every = ApprovalPolicy(every_call=True)
    assert needs_approval(every, "read", hinted) == "the policy asks for approval of every call"
    assert needs_approval(ApprovalPolicy(), "wipe", hinted) is None
    assert ApprovalPort(hinted, every, lambda p: True).hints("wipe") == ToolHints()


def _request(call_number: int = 1) -> ToolRequest:
    return ToolRequest(session_id="s", call=call_number, tool="weather", arguments={"city": "Oslo"})


@pytest.mark.parametrize(
    ("typed", "decision", "reason"),
    [
        ("y\n", "approved", ""),
        ("yes\n", "approved", ""),
        ("n too risky\n", "denied", "too risky"),
        ("n\n", "denied", ""),
        ("no way\n", "denied", "way"),
        ("\n", "denied", ""),
    ],
)
def test_console_prompt_reads_an_answer(typed: str, decision: str, reason: str) -> None:
    out = io.StringIO()
    prompt = ConsolePrompt(io.StringIO(typed), out)
    port = ApprovalPort(_inner(), ApprovalPolicy(every_call=True), prompt)
    answer = port.request(_request())
    assert answer.approval is not None  # type: ignore[union-attr]
    approval = answer.approval  # type: ignore[union-attr]
    assert (approval.decision, approval.by, approval.reason) == (decision, "console", reason)
    assert out.getvalue() == (
        '\n  approve call #1 weather{"city": "Oslo"}? (the policy asks for approval of every '
        "call, denied in 120 s) [y / n reason] "
    )


def test_console_prompt_stops_reading_when_decided_elsewhere() -> None:
    read_end, write_end = os.pipe()
    with os.fdopen(read_end) as inp, os.fdopen(write_end, "w") as typed:
        prompt = ConsolePrompt(inp, io.StringIO())
        said: list[bool | None] = []
        port = ApprovalPort(
            _inner(),
            ApprovalPolicy(every_call=True, timeout_s=0.2),
            lambda p: said.append(prompt(p)),
        )
        answer = port.request(_request())
        assert answer.approval.by == "timeout"  # type: ignore[union-attr]
        for _ in range(200):  # the prompt sees the decision and stops without reading
            if said:
                break
            threading.Event().wait(0.05)
        assert said == [None]
        typed.write("y\n")
        typed.flush()
        assert inp.readline() == "y\n"  # the line is left for whoever reads next


def test_approval_record_round_trips_and_reopens(tmp_path: Path) -> None:
    record = Approval(call=3, name="wipe", decision="denied", by="timeout", reason="slow")
    data = record_to_json(record)
    assert data["type"] == "approval" and data["waited_ms"] == 0.0
    assert record_from_json(data) == record
    with pytest.raises(ValueError, match="waited_ms"):
        record_from_json({**data, "waited_ms": True})
    old = record_to_json(ToolResult(call=1, tool_call_id="x", name="n", content="c"))
    del old["server"]  # a log written before ToolResult.server
    assert record_from_json(old) == ToolResult(
        call=1, tool_call_id="x", name="n", content="c", server=None, time=parse_time(old["time"])
    )
    session = Session.create(tmp_path, Baseline())
    session.extend([record])
    session.close()
    assert list(Session.open(session.path).records) == [record]


def test_console_view_shows_the_decision() -> None:
    out = io.StringIO()
    view = ConsoleView(out)
    view(Approval(call=1, name="wipe", decision="denied", by="console", reason="no\x1b[2J"))
    view(Approval(call=2, name="read", decision="approved", by="timeout"))
    assert out.getvalue() == "\n  [denied by console: no\\x1b[2J]\n  [approved by timeout]"


@pytest.mark.parametrize(("click", "decision"), [("approve", "approved"), ("deny", "denied")])
def test_the_panel_shows_a_pending_call_and_its_buttons_decide(
    tmp_path: Path, click: str, decision: str
) -> None:
    """ChatPanel.ask_approval: the call (tool, why, arguments) shows with Approve and Deny;
    a click decides it (recorded by "panel", with the reason box's words); the row hides."""
    from boxmaker.widgets import ChatPanel

    registry = Registry()
    registry.add_port_tool("forget_city", "Forget a city.", SCHEMA)
    session = Session.create(tmp_path, Baseline(tools=registry.definitions()))
    client = ScriptedClient([calls(call("forget_city", {"city": "Oslo"})), answer("Done.")])
    policy = ApprovalPolicy(tools=("forget_city",), timeout_s=30)
    runtime = Runtime(config=Config(), client=client, registry=registry)
    panel = ChatPanel(runtime, session)
    runtime.port = ApprovalPort(_inner(), policy, panel.ask_approval)
    assert panel.approval_row.layout.display == "none"
    assert panel.send("Forget Oslo")
    deadline = threading.Event()
    for _ in range(200):  # the flusher shows the row within a few intervals
        if panel.approval_row.layout.display != "none":
            break
        deadline.wait(0.05)
    assert panel.approval_row.layout.display is None
    assert "forget_city" in panel.approval_label.value and "Oslo" in panel.approval_label.value
    panel.approval_reason.value = "checked"
    (panel.approve_button if click == "approve" else panel.deny_button).click()
    assert panel.wait(10)
    assert panel.approval_row.layout.display == "none"
    (approval,) = _of(session, Approval)
    assert (approval.decision, approval.by, approval.reason) == (decision, "panel", "checked")
    (result,) = _of(session, ToolResult)
    assert (result.content == "forgot Oslo") == (decision == "approved")
    assert result.not_run == (None if decision == "approved" else "denied")
