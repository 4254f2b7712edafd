"""The tap's writers wait for a quiet moment (no request in flight), never for ever: a request
in flight holds them, its end (after the quiet time) or the tap stopping lets them go."""

from __future__ import annotations

import threading

from boxmaker.tap._traffic import Traffic


def _waiter(traffic: Traffic, **kw: float) -> threading.Thread:
    thread = threading.Thread(target=traffic.wait_quiet, kwargs=kw, daemon=True)
    thread.start()
    return thread


def test_a_request_in_flight_holds_a_writer_until_its_answer_ended() -> None:
    traffic = Traffic()
    traffic.enter()
    writer = _waiter(traffic, quiet_s=0.01, at_most_s=60)
    writer.join(0.2)
    assert writer.is_alive()  # held while the request flies
    traffic.enter()
    traffic.leave()  # one of two ended: still one in flight
    writer.join(0.2)
    assert writer.is_alive()
    traffic.leave()
    writer.join(10)
    assert not writer.is_alive()


def test_a_writer_goes_on_when_the_tap_stops_or_the_wait_is_over() -> None:
    traffic = Traffic()
    traffic.enter()
    bounded = _waiter(traffic, quiet_s=0.01, at_most_s=0.05)
    bounded.join(10)
    assert not bounded.is_alive()  # busy traffic is written anyway
    held = _waiter(traffic, quiet_s=0.01, at_most_s=60)
    held.join(0.2)
    assert held.is_alive()
    traffic.close()
    held.join(10)
    assert not held.is_alive()
    late = _waiter(traffic, quiet_s=60, at_most_s=60)  # once stopping, no wait at all
    late.join(10)
    assert not late.is_alive()


def test_an_exchange_queued_long_enough_ago_is_written_without_waiting() -> None:
    """Under steady traffic there is never a quiet moment: the wait is counted from the
    exchange's answer's end, so a backlog is written at once (issue 36)."""
    import time

    traffic = Traffic()
    traffic.enter()  # busy, and stays busy
    old = _waiter(traffic, quiet_s=0.01, at_most_s=60)
    old.join(0.2)
    assert old.is_alive()
    long_ago = threading.Thread(
        target=traffic.wait_quiet,
        kwargs={"quiet_s": 0.01, "at_most_s": 0.5, "since": time.monotonic() - 1.0},
        daemon=True,
    )
    long_ago.start()
    long_ago.join(0.2)
    assert not long_ago.is_alive()
    traffic.close()
