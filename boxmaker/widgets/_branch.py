"""``BranchView``: the tree of a session and its forks, and where each fork first differs.

Read from the logs only (read-only opens: a log another process is writing can be shown). For
each fork (a log whose first record is a :class:`~boxmaker.records.Forked`): the turn and
point it branches at, its settings, the first of its own records that differs from the
parent's record at the same place (:func:`boxmaker.session.first_difference`), how warm its
first request found the parent's prefix (its ``Warmed`` record: the share reused, measured), its
completions, prompt tokens processed, limit hits and last answer next to the parent's from the
fork point on.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ipywidgets as ipw

from ..cache import describe_warmth
from ..errors import SessionError
from ..records import Forked, Warmed, record_to_json
from ..session import Session, find_logs, first_difference

__all__ = ["Branch", "BranchView"]


@dataclass(frozen=True)
class Branch:
    """One log of the tree: ``session`` and ``path``; ``forked`` its origin (``None``: a
    root); ``first_difference`` the 1-based number of its first own record that differs from
    the parent's (``None``: none, or no parent to compare); ``own``/``theirs`` a short text of
    those two records; ``usage``: (completions, prompt tokens, limit hits, last answer) of
    the fork's own records and of the parent's after the fork point; ``warmth``: its
    measured cache reuse in words (:func:`boxmaker.cache.describe_warmth` of its ``Warmed``
    record; ``""`` without one)."""

    session: str
    path: Path
    forked: Forked | None
    first_difference: int | None = None
    own: str = ""
    theirs: str = ""
    usage: tuple[tuple[int, int, int, str | None], tuple[int, int, int, str | None]] | None = None
    warmth: str = ""


def _summary(records: Sequence[dict[str, Any]]) -> tuple[int, int, int, str | None]:
    usages = [r for r in records if r["type"] == "usage"]
    prompt = sum(int((r.get("timings") or {}).get("prompt_n", 0)) for r in usages)
    hits = sum(1 for r in records if r["type"] == "limit_hit")
    answers = [r for r in records if r["type"] == "assistant" and not r.get("tool_calls")]
    return len(usages), prompt, hits, (answers[-1].get("content") or "") if answers else None


def _short(record: dict[str, Any] | None) -> str:
    if record is None:
        return "(none: the log ends)"
    shown = {k: v for k, v in record.items() if k not in ("time", "group")}
    return json.dumps(shown, ensure_ascii=False)[:160]


def branches(paths: Iterable[str | os.PathLike[str]]) -> list[Branch]:
    """The :class:`Branch` of each log of ``paths`` (files, or folders searched for
    ``*.jsonl``), in path order: the logs :func:`boxmaker.session.find_logs` names (the one
    source iterator's list).

    Raises:
        SessionError: a path names no log, or a log cannot be read.
    """
    files = [item for item in find_logs(list(paths)) if isinstance(item, Path)]
    out = []
    for path in files:
        with Session.open(path, read_only=True) as session:
            forked, records = session.forked, [record_to_json(r) for r in session.records]
            parent_path = session.parent_path()
            warmed = [r for r in session.records[forked.record if forked else 0 :]
                      if isinstance(r, Warmed)]  # fmt: skip
        if forked is None or parent_path is None:
            out.append(Branch(session.id, path, None))
            continue
        warmth = describe_warmth(warmed[0]) if warmed else ""
        own = records[forked.record :]
        try:
            with Session.open(parent_path, read_only=True) as parent:
                theirs = [record_to_json(r) for r in parent.records][forked.record - 1 :]
        except SessionError:  # a parent gone: the fork is shown without a comparison
            out.append(Branch(session.id, path, forked, warmth=warmth))
            continue
        at = first_difference(own, theirs)
        out.append(
            Branch(
                session.id,
                path,
                forked,
                None if at is None else forked.record + at + 1,
                _short(own[at] if at is not None and at < len(own) else None),
                _short(theirs[at] if at is not None and at < len(theirs) else None),
                (_summary(own), _summary(theirs)),
                warmth,
            )
        )
    return out


class BranchView:
    """The tree of sessions and forks among ``paths`` (session logs, or folders of them), as
    an ipywidgets ``HTML``: each fork under its parent, with its fork point, settings, first
    differing record (the fork's and the parent's, side by side) and a small table comparing
    completions, prompt tokens, limit hits and the last answer.

    Attributes:
        branches: the :class:`Branch` of each log.
        widget: the ``ipywidgets.HTML`` shown (also by displaying the view).

    Raises:
        SessionError: a log cannot be read.
    """

    def __init__(self, paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> None:
        items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
        self.branches = branches(items)
        self.widget = ipw.HTML(self.html())
        self.widget.add_class("bxm-branches")

    def html(self) -> str:
        """The tree as one HTML string (``<ul class="bxm-tree">``)."""
        children: dict[str, list[Branch]] = {}
        ids = {b.session for b in self.branches}
        for b in self.branches:
            key = b.forked.parent_session if b.forked and b.forked.parent_session in ids else ""
            children.setdefault(key, []).append(b)

        def tree(key: str) -> str:
            items = "".join(
                f"<li>{self._node(b)}{tree(b.session)}</li>" for b in children.get(key, [])
            )
            return f"<ul class='bxm-tree'>{items}</ul>" if items else ""

        return f"<div class='bxm-branch-view'><b>Sessions and forks</b>{tree('')}</div>"

    @staticmethod
    def _node(b: Branch) -> str:
        name = f"<span class='bxm-branch-id'>{html.escape(b.session)}</span>"
        if b.forked is None:
            return name
        f = b.forked
        settings = json.dumps(dict(f.settings), ensure_ascii=False) if f.settings else "{}"
        text = (f"{name} <span class='bxm-fork-point'>forked from "
                f"{html.escape(f.parent_session)} at turn {f.turn} ({f.point})</span> "
                f"<code>{html.escape(settings)}</code>")  # fmt: skip
        if b.warmth:
            text += f"<div class='bxm-fork-cache'>cache: {html.escape(b.warmth)}</div>"
        if b.first_difference is None and b.usage is None:
            return text + " <i>parent not found</i>"
        where = ("no record differs" if b.first_difference is None
                 else f"first differs at record {b.first_difference}")  # fmt: skip
        text += (f"<div class='bxm-first-diff'>{where}<br>fork: <code>{html.escape(b.own)}"
                 f"</code><br>parent: <code>{html.escape(b.theirs)}</code></div>")  # fmt: skip
        if b.usage is not None:
            rows = "".join(
                f"<tr><td>{who}</td><td>{n}</td><td>{p}</td><td>{h}</td>"
                f"<td>{html.escape(a or '')}</td></tr>"
                for who, (n, p, h, a) in zip(("fork", "parent"), b.usage, strict=True)
            )
            text += ("<table class='bxm-fork-usage'><tr><th></th><th>completions</th>"
                     "<th>prompt tokens</th><th>limit hits</th><th>answer</th></tr>"
                     f"{rows}</table>")  # fmt: skip
        return text

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)
