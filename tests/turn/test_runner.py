"""TurnRunner and CancelToken: one turn on a worker thread, stopped by a token never cleared."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from boxmaker.client import Completion
from boxmaker.config import Config
from boxmaker.errors import BoxmakerError, RequestCancelled, TurnCancelled
from boxmaker.events import ClientEvent, Content
from boxmaker.records import Baseline, Record, TurnEnd
from boxmaker.session import Session
from boxmaker.testing import ScriptedClient, answer
from boxmaker.tools import Registry
from boxmaker.turn import CancelToken, Runtime, TurnOutcome, TurnRunner, run_turn


def _make(tmp_path: Path, client: object) -> tuple[Session, Runtime]:
    session = Session.create(tmp_path, Baseline(system="sys"))
    runtime = Runtime(config=Config(), client=client, registry=Registry())  # type: ignore[arg-type]
    return session, runtime


def _kinds(session: Session) -> list[str]:
    return [type(r).__name__ for r in session.records]


class HoldingClient:
    """Streams one word, then holds the request open until ``cancel`` is set."""

    def __init__(self) -> None:
        self.streaming = threading.Event()

    def chat_with_retry(
        self,
        body: dict[str, object],
        on_event: object,
        *,
        reasoning_budget: int | None = None,
        cancel: threading.Event | None = None,
    ) -> Completion:
        assert cancel is not None and callable(on_event)
        on_event(Content("partial"))
        self.streaming.set()
        if not cancel.wait(10):
            raise AssertionError("never cancelled")
        raise RequestCancelled("the stream was closed")


def test_a_token_is_cancelled_for_good() -> None:
    token = CancelToken()
    assert not token.cancelled and not token.is_set()
    token.cancel()
    token.cancel()  # idempotent
    assert token.cancelled and token.wait(0)
    with pytest.raises(BoxmakerError, match="cancelled for good"):
        token.clear()
    assert token.cancelled


def test_a_token_cancelled_from_another_thread_wakes_a_waiter() -> None:
    token = CancelToken()
    threading.Thread(target=token.cancel).start()
    assert token.wait(5)


def test_runner_runs_one_turn_and_keeps_its_outcome(tmp_path: Path) -> None:
    session, runtime = _make(tmp_path, ScriptedClient([answer("hello")]))
    seen: list[Record | object] = []
    runner = TurnRunner(session, runtime, "hi", seen.append)
    assert not runner.started and not runner.done
    outcome = runner.start().result(5)
    assert isinstance(outcome, TurnOutcome) and outcome.content == "hello"
    assert runner.done and runner.error is None and runner.outcome is outcome
    assert _kinds(session) == ["User", "Assistant", "Usage", "TurnEnd"]
    assert [type(e).__name__ for e in seen] == ["User", "Content", "Assistant", "Usage", "TurnEnd"]


def test_a_stop_before_the_start_is_not_lost(tmp_path: Path) -> None:
    client = ScriptedClient([answer("too late")])
    session, runtime = _make(tmp_path, client)
    runner = TurnRunner(session, runtime, "hi")
    runner.stop()
    with pytest.raises(TurnCancelled):
        runner.start().result(5)
    assert isinstance(runner.error, TurnCancelled) and runner.outcome is None
    assert _kinds(session) == ["User", "TurnEnd"]
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and end.outcome == "cancelled"
    assert not runtime.cancel.is_set()  # the runtime's own switch is not touched


def test_stop_while_streaming_ends_the_turn_and_the_next_turn_runs(tmp_path: Path) -> None:
    client = HoldingClient()
    session, runtime = _make(tmp_path, client)
    runner = TurnRunner(session, runtime, "a long story").start()
    assert client.streaming.wait(5)
    assert not runner.wait(0)
    runner.stop()
    assert runner.wait(5) and isinstance(runner.error, TurnCancelled)
    runtime.client = ScriptedClient([answer("again")])
    assert TurnRunner(session, runtime, "next").start().result(5).content == "again"
    assert _kinds(session) == ["User", "TurnEnd", "User", "Assistant", "Usage", "TurnEnd"]


def test_a_callers_event_is_accepted_and_not_cleared(tmp_path: Path) -> None:
    session, runtime = _make(tmp_path, ScriptedClient([answer("x")]))
    event = threading.Event()
    event.set()
    runner = TurnRunner(session, runtime, "hi", cancel=event).start()
    assert runner.wait(5) and isinstance(runner.error, TurnCancelled)
    assert runner.cancel is event and event.is_set()


def test_on_done_runs_before_wait_returns_and_errors_are_kept(tmp_path: Path) -> None:
    def failing(body: object, on_event: ClientEvent, **kw: object) -> Completion:
        raise RuntimeError("a bug in a fake")

    client = ScriptedClient([])
    client.chat_with_retry = failing  # type: ignore[method-assign,assignment]
    session, runtime = _make(tmp_path, client)
    done: list[BaseException | None] = []
    runner = TurnRunner(session, runtime, "hi", on_done=lambda r: done.append(r.error))
    assert runner.start().wait(5)
    assert isinstance(runner.error, RuntimeError) and done == [runner.error]
    with pytest.raises(RuntimeError, match="a bug in a fake"):
        runner.result(0)


def test_result_times_out_while_the_turn_runs(tmp_path: Path) -> None:
    client = HoldingClient()
    session, runtime = _make(tmp_path, client)
    runner = TurnRunner(session, runtime, "hi").start()
    assert client.streaming.wait(5)
    with pytest.raises(TimeoutError, match="still running"):
        runner.result(0)
    runner.stop()
    assert runner.wait(5)


def test_a_hook_that_raises_is_said_once_a_kind_and_the_turn_and_its_log_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``events.guarded``, the rule for the hooks boxmaker calls per event: the first raise
    of each kind of error is logged with its traceback, the later ones at DEBUG, and every
    event still reaches the hook (a broken widget called per token printed one traceback per
    token; a second kind, as a slot saver's failing beside it at the turn's end, is said)."""
    seen: list[str] = []

    def hook(event: object) -> None:
        seen.append(type(event).__name__)
        raise (ValueError if isinstance(event, TurnEnd) else RuntimeError)("it broke")

    session, runtime = _make(tmp_path, ScriptedClient([answer("fine")]))
    with caplog.at_level("DEBUG", logger="boxmaker"):
        outcome = run_turn(session, runtime, "Hi", on_event=hook)
    assert outcome.content == "fine" and _kinds(session)[-1] == "TurnEnd"
    assert seen[-1] == "TurnEnd" and len(seen) >= 3  # User, Assistant, TurnEnd at least
    said = [r for r in caplog.records if "on_event hook raised" in r.getMessage()]
    assert [r.levelname for r in said] == ["ERROR"] + ["DEBUG"] * (len(seen) - 2) + ["ERROR"]
    assert "RuntimeError" in said[0].getMessage() and "ValueError" in said[-1].getMessage()
    assert said[0].exc_info is not None and "said once" in said[0].getMessage()
