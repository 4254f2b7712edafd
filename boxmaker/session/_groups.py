"""Groups of records written together: all of them on a reader's screen, or none.

:meth:`~boxmaker.session.Session.extend` writes records that belong together (the
``Assistant``, ``Usage`` and ``TurnEnd`` that end an answered turn) in one ``write``; a kill
can still cut that write at any byte, leaving the first records whole and the rest missing.
So, since schema 3, a group of two or more records is framed: its first line carries
``"group": n``, the number of lines of the group (``n >= 2``; a single record carries none).
A reader (:func:`boxmaker.session.read_log`) keeps a group only when all ``n`` lines are
there; a group cut short at the end of the file is dropped as a torn write is (a
``LogReadWarning``; when repairing, its bytes go to ``<log>.torn`` and the log is cut back to
where the group starts). The key is framing, not data: the reader removes it, so records,
frames and widgets never see it.

A cut anywhere in a group's bytes therefore leaves either the whole group (the cut fell
after its last ``\\n``, or just before it: a whole last line is kept) or none of it; the
test cuts the group write at every byte offset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["GROUP_KEY", "GROUP_MARK", "GroupError", "dumps_group", "whole_groups"]

GROUP_KEY = "group"
"""The key of a group's first line: how many lines the group has (an int, 2 or more)."""

GROUP_MARK = b'"group":'
"""The key as it appears in a line (compact JSON, :func:`boxmaker.session.dumps_line`): a file
without these bytes has no group, and the reader skips the scan."""


class GroupError(ValueError):
    """A group marker that cannot be right: not an int of 2 or more, or a group that ends
    before its count in the middle of the log (``line``: the 1-based line number)."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


def dumps_group(objs: Sequence[dict[str, Any]], dumps: Any) -> bytes:
    """The lines of records written together, framed: ``dumps(obj)`` of each (a
    ``\\n``-terminated line, :func:`boxmaker.session.dumps_line`), the first with
    ``"group": len(objs)`` added last when there are two or more."""
    if len(objs) < 2:
        return b"".join(dumps(o) for o in objs)
    first = {**objs[0], GROUP_KEY: len(objs)}
    return b"".join([dumps(first), *(dumps(o) for o in objs[1:])])


def whole_groups(records: list[Any], first_line: int = 2) -> int:
    """Remove the group markers from ``records`` (the JSON values after the baseline, in
    place) and say how many of them are whole.

    Args:
        records: the lines after the baseline, as parsed; ``records[i]`` is line
            ``first_line + i`` of the file.
        first_line: the line number of ``records[0]`` (for messages).

    Returns:
        The length of the prefix made of whole groups: ``len(records)`` unless the last group
        is cut short (then the index of its first line).

    Raises:
        GroupError: a marker that is not an int of 2 or more, or a group followed by another
            group's first line before its count is reached (not a cut: the writer cuts a torn
            group before it writes again).
    """
    i, total = 0, len(records)
    while i < total:
        item = records[i]
        size = item.pop(GROUP_KEY, None) if type(item) is dict else None
        if size is None:
            i += 1
            continue
        if type(size) is not int or size < 2:
            raise GroupError(
                f"group marker {size!r:.40} is not a count of 2 or more", first_line + i
            )
        for j in range(i + 1, min(i + size, total)):
            later = records[j]
            if type(later) is dict and GROUP_KEY in later:
                raise GroupError(
                    f"a group of {size} lines from line {first_line + i} is cut short by another "
                    "group",
                    first_line + j,
                )
        if i + size > total:
            return i
        i += size
    return total
