"""SSEDecoder: bytes -> (field, data), with chunk boundaries in the worst places."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.client._stream._decoder import SSEDecoder
from boxmaker.errors import InferError


def feed_all(pieces: list[bytes]) -> list[tuple[str, str]]:
    decoder = SSEDecoder()
    out: list[tuple[str, str]] = []
    for piece in pieces:
        out.extend(decoder.feed(piece))
    out.extend(decoder.flush())
    return out


def test_one_event_one_chunk() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a":1}\n\n') == [("data", '{"a":1}')]
    assert decoder.flush() == []


def test_event_is_held_until_its_blank_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a":1}\n') == []
    assert decoder.feed(b"\n") == [("data", '{"a":1}')]


def test_split_mid_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"con') == []
    assert decoder.feed(b'tent":"x"}\n') == []
    assert decoder.feed(b"\ndata: [DO") == [("data", '{"content":"x"}')]
    assert decoder.feed(b"NE]\n\n") == [("data", "[DONE]")]


def test_split_mid_utf8_character() -> None:
    body = 'data: {"content":"é€😀"}\n\n'.encode()
    start = body.index("€".encode())
    for cut in (start - 1, start + 1, start + 2, start + 4, start + 5):
        assert feed_all([body[:cut], body[cut:]]) == [("data", '{"content":"é€😀"}')]


def test_utf8_character_split_over_three_chunks() -> None:
    emoji = "😀".encode()
    pieces = [b"data: a", emoji[:1], emoji[1:3], emoji[3:] + b"b\n\n"]
    assert feed_all(pieces) == [("data", "a😀b")]


def test_crlf_split_between_chunks() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: one\r") == []
    # the \n completing the \r\n must not count as a second (blank) line
    assert decoder.feed(b"\n") == []
    assert decoder.feed(b"\r") == []
    assert decoder.feed(b"\ndata: two\r\n\r\n") == [("data", "one"), ("data", "two")]


def test_two_events_in_one_read() -> None:
    body = b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n'
    assert SSEDecoder().feed(body) == [
        ("data", '{"a":1}'),
        ("data", '{"b":2}'),
        ("data", "[DONE]"),
    ]


def test_lone_cr_line_endings() -> None:
    assert feed_all([b"data: a\r\rdata: b\r", b"\r"]) == [("data", "a"), ("data", "b")]


def test_comments_and_empty_events_ignored() -> None:
    body = b": ping\n\n\n\n: keepalive\ndata: x\n: inside an event\n\ndata:\n\n:\n\n"
    assert feed_all([body]) == [("data", "x")]


def test_several_data_lines_joined_with_newline() -> None:
    assert feed_all([b"data: first\ndata: second\n\n"]) == [("data", "first\nsecond")]


def test_no_space_after_colon_and_only_one_space_dropped() -> None:
    assert feed_all([b"data:x\n\ndata:  y\n\n"]) == [("data", "x"), ("data", " y")]


def test_error_field_of_older_llama_cpp() -> None:
    body = b'error: {"code":500,"message":"boom"}\n\n'
    assert feed_all([body]) == [("error", '{"code":500,"message":"boom"}')]


def test_event_with_two_fields_gives_both_in_order() -> None:
    assert feed_all([b"event: x\ndata: y\n\n"]) == [("event", "x"), ("data", "y")]


def test_flush_ends_an_unterminated_last_event() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: [DONE]") == []
    assert decoder.flush() == [("data", "[DONE]")]
    assert decoder.flush() == []


def test_invalid_utf8_becomes_replacement_character() -> None:
    assert feed_all([b"data: a\xffb\n\n"]) == [("data", "a\ufffdb")]


# --- property: any split gives the same events as one feed -----------------------------------

_value = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\r\n"),
    min_size=1,
    max_size=40,
)
_event = st.tuples(st.sampled_from(["data", "error"]), _value)
_item = st.one_of(_event, st.sampled_from([": ping", ": keepalive", ""]))


@given(
    items=st.lists(_item, max_size=12),
    newline=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_any_split_gives_the_same_events(
    items: list[tuple[str, str] | str], newline: str, cuts: list[int]
) -> None:
    parts: list[str] = []
    expected: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, tuple):
            name, value = item
            parts.append(f"{name}: {value}{newline}{newline}")
            expected.append((name, value))
        else:  # a comment, or a stray blank line
            parts.append(f"{item}{newline}" if item else newline)
    body = "".join(parts).encode()
    points = sorted({c % (len(body) + 1) for c in cuts})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]

    assert feed_all([body]) == expected
    assert feed_all(pieces) == expected
    assert feed_all([bytes([b]) for b in body]) == expected


# -- one huge line: linear work and a cap (issue 23) -----------------------------------------


def test_a_long_line_in_many_reads_is_joined_once() -> None:
    """A 4 MB line in 4,096 reads of 1 KiB: the reads are copied once, when the line ends
    (joining on each read copied about 8 GB: the 500 MB line that did not finish)."""
    decoder = SSEDecoder(max_event_bytes=None)
    piece = b"x" * 1024
    assert decoder.feed(b"data: ") == []
    for _ in range(4096):
        assert decoder.feed(piece) == []
    assert decoder.feed(b"\n\n") == [("data", "x" * 4096 * 1024)]
    assert decoder.joined == len(b"data: ") + 4096 * 1024 + 2


def test_joined_bytes_grow_with_the_line_not_its_square() -> None:
    def work(reads: int) -> int:
        decoder = SSEDecoder(max_event_bytes=None)
        decoder.feed(b"data: ")
        for _ in range(reads):
            decoder.feed(b"y" * 100)
        decoder.feed(b"\n\n")
        return decoder.joined

    assert work(2000) - 8 == 2 * (work(1000) - 8)


def test_an_event_past_the_cap_is_a_clear_error() -> None:
    decoder = SSEDecoder(max_event_bytes=1000)
    decoder.feed(b"data: ")
    decoder.feed(b"z" * 900)
    with pytest.raises(InferError, match=r"more than 1,006 bytes, past the cap of 1,000"):
        decoder.feed(b"z" * 100)


def test_an_event_past_the_cap_in_one_read_and_over_lines() -> None:
    with pytest.raises(InferError, match="past the cap of 100"):
        SSEDecoder(max_event_bytes=100).feed(b"data: " + b"a" * 200 + b"\n\n")
    decoder = SSEDecoder(max_event_bytes=100)
    with pytest.raises(InferError, match="past the cap of 100"):
        for _ in range(10):
            decoder.feed(b"data: " + b"b" * 20 + b"\n")  # one event of many data lines


def test_events_below_the_cap_are_untouched() -> None:
    decoder = SSEDecoder(max_event_bytes=100)
    body = b"".join(f'data: {{"n":{i}}}\n\n'.encode() for i in range(100))
    assert decoder.feed(body) == [("data", f'{{"n":{i}}}') for i in range(100)]
