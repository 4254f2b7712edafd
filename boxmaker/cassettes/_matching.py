"""Request matching: bodies compared as parsed JSON, and where two bodies first differ.

Requests match on method, path and body compared as parsed JSON (key order and white space do
not matter; host and port do not, so a recording from one embedded server replays against
another URL). When nothing matches, :func:`first_body_difference` names the first differing place,
e.g. ``messages[5].content``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vcr.request import Request as VcrRequest

from ._serializer import compact

__all__ = [
    "MISSING",
    "body_for_matching",
    "describe_difference",
    "first_body_difference",
    "json_body_matcher",
    "parse_body",
    "short",
]

_MISSING = object()


def first_body_difference(recorded: Any, sent: Any, where: str = "") -> tuple[str, Any, Any] | None:
    """Where two JSON values first differ: ``(place, recorded_part, sent_part)`` or ``None``.

    ``place`` is a path such as ``messages[5].content`` (``""`` for the whole value). Mappings
    are walked in the recorded key order, then keys only ``sent`` has; lists by index, then a
    length difference (``messages[7]`` missing on one side). A part missing on one side is
    :data:`MISSING`.
    """
    if recorded == sent and type(recorded) is type(sent):
        return None
    if isinstance(recorded, Mapping) and isinstance(sent, Mapping):
        for key in [*recorded, *(k for k in sent if k not in recorded)]:
            place = f"{where}.{key}" if where else str(key)
            a, b = recorded.get(key, _MISSING), sent.get(key, _MISSING)
            if a is _MISSING or b is _MISSING:
                return place, a, b
            found = first_body_difference(a, b, place)
            if found:
                return found
        return None
    if isinstance(recorded, list) and isinstance(sent, list):
        for i in range(max(len(recorded), len(sent))):
            place = f"{where}[{i}]"
            if i >= len(recorded) or i >= len(sent):
                a = recorded[i] if i < len(recorded) else _MISSING
                b = sent[i] if i < len(sent) else _MISSING
                return place, a, b
            found = first_body_difference(recorded[i], sent[i], place)
            if found:
                return found
        return None
    if recorded == sent:  # 1 == 1.0, True == 1: JSON-equal enough for matching
        return None
    return where, recorded, sent


MISSING = _MISSING
"""The marker :func:`first_body_difference` puts where one side has no such key or index."""


def parse_body(body: Any) -> Any:
    """A request body (bytes, text or ``None``) as parsed JSON; ``None`` when empty, the text
    itself when it is not JSON."""
    if body is None or body == b"" or body == "":
        return None
    try:
        return json.loads(body)
    except (ValueError, TypeError):
        return body.decode("utf-8", "replace") if isinstance(body, bytes) else body


def short(value: Any) -> str:
    """A value in at most 60 characters for a message (``(absent)`` for :data:`MISSING`)."""
    if value is _MISSING:
        return "(absent)"
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    text = compact(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe_difference(found: tuple[str, Any, Any]) -> str:
    """A :func:`first_body_difference` result in words: ``place (recorded 'a', sent 'b')``."""
    place, recorded, sent = found
    return f"{place or 'the whole body'} (recorded {short(recorded)}, sent {short(sent)})"


SCHEDULING_KEYS = ("id_slot",)
"""Top-level request keys never matched: the slot is where a request ran, chosen by the
client's leases or the server (``ClientConfig.slot_choice``), not what the model was asked
(a recording made where the server picked, ``-1``, replays where the client pins)."""


def body_for_matching(body: Any, ignore: Sequence[str]) -> Any:
    """A request body parsed (:func:`parse_body`) without the top-level keys ``ignore`` and
    :data:`SCHEDULING_KEYS`."""
    parsed = parse_body(body)
    if isinstance(parsed, dict):
        return {k: v for k, v in parsed.items() if k not in ignore and k not in SCHEDULING_KEYS}
    return parsed


def json_body_matcher(ignore: Sequence[str]) -> Callable[[VcrRequest, VcrRequest], None]:
    """vcrpy matcher: bodies equal as parsed JSON, leaving out the top-level keys ``ignore``
    (raises AssertionError naming the first differing place)."""

    def json_body(r1: VcrRequest, r2: VcrRequest) -> None:
        found = first_body_difference(
            body_for_matching(r2.body, ignore), body_for_matching(r1.body, ignore)
        )
        if found:
            raise AssertionError(f"bodies differ at {describe_difference(found)}")

    return json_body
