"""The tap finds the conversation a request continues by lookup, not by a scan over every
conversation it ever saw (issue 38: the scan was 13 % of the tap's time after 768 runs, and
grew). The lookup must pick what the scan picked: a hypothesis property against the scan as
it was, over random traffic (continued, rewritten, failed and new conversations)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from boxmaker.tap._grouping import Conversation, Conversations, Key, _same, _shared


def _scan(
    conversations: list[Conversation], keys: list[Key]
) -> tuple[tuple[int, int], Conversation] | None:
    """The scan the tap did before the lookup (boxmaker/tap/_log.py, until 2026-12-05; the
    grouping is boxmaker/tap/_grouping.py since)."""
    best: tuple[tuple[int, int], Conversation] | None = None
    for conv in conversations:
        n = len(conv.keys)
        if keys[:n] == conv.keys and (len(keys) > n or (conv.failed and len(keys) == n)):
            replied = conv.reply_key is not None and len(keys) > n
            score = (2 if replied and _same(keys[n], conv.reply_key) else 1, n)
        else:
            shared = _shared(keys, conv.keys)
            first_reply = next((i for i, k in enumerate(conv.keys) if k[0] == "assistant"), None)
            if first_reply is None or shared <= first_reply:
                continue
            score = (0, shared)
        if best is None or score > best[0]:
            best = (score, conv)
    return best


def _key(role: str, text: str) -> Key:
    return (role, text, (), "")


_KEYS = st.builds(_key, st.sampled_from(["user", "assistant", "tool"]), st.sampled_from("ab"))
_STEP = st.tuples(
    st.integers(0, 6),  # which conversation to continue (past the end: a new one)
    st.integers(0, 4),  # messages of it kept (a rewrite when fewer than it has)
    st.lists(_KEYS, max_size=3),  # messages added
    st.booleans(),  # the answer failed
    st.one_of(st.none(), _KEYS),  # the reply's key
)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(_STEP, min_size=1, max_size=25))
def test_the_lookup_picks_what_the_scan_picked(
    steps: list[tuple[int, int, list[Key], bool, Key | None]],
) -> None:
    conversations = Conversations()
    for which, kept, added, failed, reply in steps:
        convs = list(conversations)
        base = convs[which].keys[:kept] if which < len(convs) else []
        keys = [*base, *added] or [_key("user", "a")]
        expected = _scan(convs, keys)
        conv, _start = conversations.find(keys, [])
        after = list(conversations)
        if expected is None:
            assert len(after) == len(convs) + 1 and conv is after[-1]
        else:
            assert conv is expected[1] and len(after) == len(convs)
        conversations.file(conv, keys)
        conv.failed = failed
        conv.reply_key = None if failed else reply
