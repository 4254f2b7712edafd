"""A fork's warmth, measured: the label follows from the share of the parent's prefix its
first request reused (never warm below 0.9), with why when it is not warm; the loop records
it once, after the fork's first completion."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.cache import (
    COLD_SHARE,
    WARM_SHARE,
    WarmStart,
    describe_warmth,
    fork_prefix,
    fork_warmth,
)
from boxmaker.config import Config
from boxmaker.errors import RecordError
from boxmaker.records import (
    Assistant,
    Baseline,
    CacheLoss,
    Capabilities,
    Forked,
    Record,
    TurnEnd,
    Usage,
    User,
    Warmed,
    record_from_json,
    record_to_json,
)
from boxmaker.session import Session
from boxmaker.testing import ScriptedClient, answer, timings
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, continue_fork, run_turn

FORKED = Forked(
    parent_session="p", parent_path="p.jsonl", parent_schema=4, turn=1, point="after_turn",
    record=5,
)  # fmt: skip


def copies(*extra: Record, prompt: int = 100, reply: int = 21) -> list[Record]:
    """A fork's records: ``Forked``, then a parent's turn whose completion had ``prompt``
    tokens and a reply of ``reply`` (held: ``prompt + reply - 1``)."""
    return [
        FORKED,
        *extra,
        User(content="Hi"),
        Assistant(content="Hello"),
        Usage(timings=timings(prompt - 10, 10, reply)),
        TurnEnd(outcome="answered"),
    ][: FORKED.record + len(extra)]


def first(reused: int | None, processed: int = 10) -> Usage:
    return Usage(timings={} if reused is None else timings(reused, processed))


SLOT = WarmStart(how="slot", slot=0, session="f")
RESTORED = WarmStart(how="restored", slot=1, file="p.turn-1.bin", tokens=120, session="f")
COLD = WarmStart(how="cold", detail="no slot store (the server's --slot-save-path) was given")


def test_the_prefix_is_what_the_parents_slot_held_prompt_and_reply() -> None:
    records = copies()
    assert fork_prefix(records, FORKED) == (120, 100)  # the reply's last token is never held
    assert fork_prefix(records[:2], FORKED) == (None, None)  # no completion before the point


@pytest.mark.parametrize(
    ("start", "reused", "how", "said"),
    [
        (SLOT, 120, "slot", ""),
        (SLOT, 108, "slot", ""),  # 0.9 of 120
        (SLOT, 107, "partial", "slot 0 was expected to hold the parent's prefix; the "
         "parent's reply (20 tokens) was processed again"),
        (RESTORED, 500, "restored", ""),  # the new message reused too: the prefix whole
        (RESTORED, 0, "cold", "p.turn-1.bin was restored into slot 1 (120 tokens), but the "
         "server reused only 0 of the 120: a restore accepted and not used; the slot was "
         "emptied"),
        (COLD, 119, "server", "the server held the parent's prefix by itself (a slot this "
         "process did not know of, or its RAM prompt cache); warm_fork had found nothing: no "
         "slot store"),
        (COLD, 11, "cold", "no slot store (the server's --slot-save-path) was given"),
        (None, 12, "partial", "no warm_fork was asked for it"),
        (None, 120, "server", "the server held the parent's prefix by itself"),
        (SLOT, None, "unknown", "the server sent no cache_n"),
    ],
)  # fmt: skip
def test_the_label_follows_from_the_share_reused(
    start: WarmStart | None, reused: int | None, how: str, said: str
) -> None:
    warmed = fork_warmth(copies(), FORKED, first(reused), start)
    assert warmed.how == how
    assert warmed.detail.startswith(said) if said else warmed.detail == ""
    assert (warmed.prefix, warmed.reused) == (120, reused)
    assert warmed.found == (start.how if start else None)


def test_a_sliding_window_model_that_processed_the_reply_again_is_named_with_the_fix() -> None:
    records = copies(Capabilities(n_swa=512))
    forked = dataclasses.replace(FORKED, record=6)  # the Capabilities record copied too
    warmed = fork_warmth(records, forked, first(100), SLOT)
    assert (warmed.how, warmed.share) == ("partial", 100 / 120)
    assert "a sliding-window model (n_swa 512)" in warmed.detail and "--swa-full" in warmed.detail


def test_a_loss_forensics_explained_says_why() -> None:
    loss = CacheLoss(expected=100, reused=40, cause="history_rewritten", detail="rendered anew")
    warmed = fork_warmth(copies(), FORKED, first(40), SLOT, loss=loss)
    assert warmed.how == "partial" and warmed.detail.endswith("history_rewritten: rendered anew")


def test_a_cold_fork_warm_fork_found_nothing_for_is_not_given_the_losss_guesses() -> None:
    """The newcomer trial (issue 37): a fork on a server that never saw its parent was told
    of sliding windows and context checkpoints on a model without either."""
    guess = "the prompts agree on 120 tokens, the server reused 0 (nothing reused: on a "
    guess += "sliding-window model ...) (or a context checkpoint was restored, ...)"
    loss = CacheLoss(expected=100, reused=0, cause="evicted", detail=guess)
    warmed = fork_warmth(copies(), FORKED, first(0), COLD, loss=loss)
    assert warmed.how == "cold"
    assert warmed.detail == (
        "no slot store (the server's --slot-save-path) was given; the server did not hold the "
        "parent's prefix (one that never served the parent, or whose slot was used or "
        "emptied since)"
    )


def test_no_completion_before_the_fork_point_is_not_measured() -> None:
    warmed = fork_warmth(copies()[:2], FORKED, first(50), SLOT)
    assert (warmed.how, warmed.prefix) == ("unknown", None)
    assert describe_warmth(warmed) == (
        "unknown: reuse not measured: the parent made no completion before the fork point"
    )


def test_the_line_says_the_measured_figure() -> None:
    records = copies()
    assert describe_warmth(fork_warmth(records, FORKED, first(904), RESTORED)) == (
        "restored p.turn-1.bin into slot 1: 120 of 120 prefix tokens reused (1.00)"
    )
    assert describe_warmth(fork_warmth(records, FORKED, first(119), SLOT)) == (
        "slot 0 held the parent's prefix: 119 of 120 prefix tokens reused (0.99)"
    )
    line = describe_warmth(fork_warmth(records, FORKED, first(0), COLD))
    assert line.startswith("cold: 0 of 120 prefix tokens reused (0.00): no slot store")


@given(
    prompt=st.integers(1, 5000),
    reply=st.integers(0, 500),
    reused=st.integers(0, 6000),
    start=st.sampled_from([SLOT, RESTORED, COLD, None]),
)
def test_never_warm_below_the_threshold_and_always_warm_above_it(
    prompt: int, reply: int, reused: int, start: WarmStart | None
) -> None:
    warmed = fork_warmth(copies(prompt=prompt, reply=reply), FORKED, first(reused), start)
    share = warmed.share
    assert share is not None and 0.0 <= share <= 1.0
    if warmed.how in ("slot", "restored", "server"):
        assert share >= WARM_SHARE
        found = start.how if start is not None else "cold"
        assert warmed.how == ("server" if found == "cold" else found)
    else:
        assert share < WARM_SHARE and warmed.detail
        assert warmed.how == ("partial" if share >= COLD_SHARE else "cold")


def test_the_record_is_checked_by_the_logs_rule() -> None:
    warmed = fork_warmth(copies(), FORKED, first(120), SLOT)
    data = record_to_json(warmed)
    assert data["type"] == "warmed" and record_from_json(data) == warmed
    with pytest.raises(RecordError, match="how"):
        record_from_json({**data, "how": "lukewarm"})
    with pytest.raises(RecordError, match="reused"):
        record_from_json({**data, "reused": -1})


def test_the_loop_records_it_once_after_the_forks_first_completion(tmp_path: Path) -> None:
    registry = Registry()
    parent = Session.create(tmp_path, Baseline(system="Be brief."))
    steps = [answer("One.", timings=timings(0, 100, 21)), answer("Two.", timings=timings(120, 9))]
    run_turn(parent, Runtime(config=Config(), client=ScriptedClient(steps), registry=registry), "1")
    fork = parent.fork(at=1)
    steps = [answer("A.", timings=timings(119, 9)), answer("B.", timings=timings(140, 9))]
    runtime = Runtime(config=Config(), client=ScriptedClient(steps), registry=registry)
    runtime.warm = WarmStart(how="slot", slot=0, session=fork.id)
    continue_fork(fork, runtime, "Again")
    continue_fork(fork, runtime, "And again")
    own = fork.records[fork.forked.record :] if fork.forked else []
    kinds = [type(r).__name__ for r in own]
    assert kinds[:5] == ["User", "Assistant", "Usage", "Warmed", "TurnEnd"]
    assert kinds.count("Warmed") == 1
    (warmed,) = [r for r in own if isinstance(r, Warmed)]
    assert (warmed.how, warmed.prefix, warmed.reused, warmed.slot) == ("slot", 120, 119, 0)
    assert parent.messages() == fork.messages()[: len(parent.messages())]  # not a message
    # another fork's warm start is not this one's: measured alone
    other = parent.fork(at=1)
    runtime.client = ScriptedClient([answer("C.", timings=timings(0, 128))])
    continue_fork(other, runtime, "Again")
    (warmed,) = [r for r in other.records if isinstance(r, Warmed)]
    assert (warmed.how, warmed.found) == ("cold", None)
    # a session that is no fork gets none
    assert not [r for r in parent.records if isinstance(r, Warmed)]
