"""The dataset card of ``boxmaker export parquet``'s folder (``README.md``, as the Hugging
Face Hub reads one: YAML front matter naming each table as a config, then the card):
what the tables hold, their features with units, the server and model the sessions ran on,
what is unknown, and how forks are counted."""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from ._messages import MESSAGE_COLUMNS

__all__ = ["ServersSeen", "dataset_card"]


class ServersSeen:
    """The servers and models a set of logs ran on, from their ``Capabilities`` records
    (``GET /props``, read once before a session's first request)."""

    def __init__(self) -> None:
        self.models: Counter[str] = Counter()
        self.unrecorded = 0

    def add(self, records: list[Any]) -> None:
        """Count one log's model (its first ``Capabilities`` record's)."""
        caps = next((r for r in records if r["type"] == "capabilities"), None)
        if caps is None or not caps.get("model"):
            self.unrecorded += 1
            return
        words = [str(caps["model"])]
        if caps.get("n_ctx") is not None:
            words.append(f"n_ctx {caps['n_ctx']}")
        if caps.get("slots") is not None:
            words.append(f"{caps['slots']} slot(s)")
        self.models[", ".join(words)] += 1


def _markdown(text: str) -> str:
    """A docstring's reStructuredText as Markdown: ``code`` and :role:`name` as `code`."""
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")


def _cell(text: Any) -> str:
    """Text for a Markdown table cell (pipes escaped, one line)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def dataset_card(
    loaded: Any, servers: ServersSeen, *, sessions: int, version: str, tables: list[str]
) -> str:
    """The card's text.

    Args:
        loaded: the frames written (:class:`boxmaker.frames.Frames`).
        servers: the servers and models seen.
        sessions: the sessions written (``messages.parquet``'s rows).
        version: boxmaker's version.
        tables: the tables written, in order (each ``<name>.parquet``).
    """
    from .. import frames

    summary = loaded.summary
    forks = int(summary.parent_session.notna().sum())
    own = loaded.requests[~loaded.requests.from_parent.astype(bool)]
    configs = []
    for name in tables:
        default = "\n  default: true" if name == "messages" else ""
        configs.append(f"- config_name: {name}\n  data_files: {name}.parquet{default}")
    lines = [
        "---",
        "pretty_name: boxmaker sessions",
        "tags:",
        "- agents",
        "- tool-use",
        "- llama.cpp",
        "- trajectories",
        "- boxmaker",
        "configs:",
        *configs,
        "---",
        "",
        "# boxmaker sessions",
        "",
        f"{sessions} session(s) ({forks} of them forks), {int(summary.turns.sum())} turn(s), "
        f"{len(own)} completion(s) of agent turn loops served by llama.cpp's HTTP server, "
        f"written by boxmaker {version} (`boxmaker export parquet`) on "
        f"{datetime.now(UTC).date().isoformat()}.",
        "",
        "## Server and model",
        "",
        "The sessions ran against `llama-server` (llama.cpp), through its OpenAI-compatible "
        "`/v1/chat/completions`. Token counts and times are the server's own `timings` "
        "(`cache_n`: prompt tokens reused from the slot's cache, `prompt_n`: processed anew, "
        "`predicted_n`: generated; `prompt_ms`, `predicted_ms`), else the OpenAI `usage` "
        "figures a server sent instead.",
        "",
    ]
    for model, n in servers.models.most_common():
        lines.append(f"- `{_cell(model)}`: {n} session(s)")
    if servers.unrecorded:
        lines.append(
            f"- not recorded: {servers.unrecorded} session(s) (logs without a `Capabilities` "
            "record: the model and server settings are unknown)"
        )
    lines += ["", "## Tables", ""]
    docs = {"messages": "one row per session: the conversation, as training data"}
    for name in tables:
        if name != "messages":
            paragraph = (getattr(frames, name).__doc__ or "").strip().split("\n\n")[0]
            docs[name] = _markdown(" ".join(paragraph.split())).rstrip(".")
        lines.append(f"- `{name}` (`{name}.parquet`): {_cell(docs[name])}.")
    lines += [
        "",
        "## Features",
        "",
        "### messages",
        "",
        "| column | type | meaning |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{n}` | {_cell(t)} | {_cell(d)} |" for n, t, d in MESSAGE_COLUMNS]
    for name in tables:
        if name == "messages":
            continue
        lines += [
            "",
            f"### {name}",
            "",
            "| column | dtype | unit | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for column in frames.COLUMNS[name]:
            lines.append(
                f"| `{column.name}` | {column.dtype} | {column.unit or ''} | "
                f"{_cell(_markdown(column.doc))} |"
            )
    lines += [
        "",
        "## What is unknown",
        "",
        "A figure the server did not send (an older llama.cpp build without `timings`, a "
        "server that sends only OpenAI `usage`, a completion cut off) is unknown: null here, "
        "never 0, and a total with an unknown part is null too. In the other columns null "
        "says the thing did not happen (no failed request's status, no approval asked, no "
        "fork, a cache loss not looked into): see each column's meaning. Null values per "
        "column (columns without any are left out):",
        "",
        "| table | column | null rows | rows |",
        "| --- | --- | --- | --- |",
    ]
    for name in tables:
        if name == "messages":
            continue
        df = getattr(loaded, name)
        for column, n in df.isna().sum().items():
            if n:
                lines.append(f"| {name} | `{column}` | {int(n)} | {len(df)} |")
    lines += [
        "",
        "## Forks",
        "",
        "A fork's log starts with copies of its parent's records up to where it branched. "
        "Their rows carry `from_parent` true (in `messages`, each copied message), and the "
        "`summary` totals leave them out (`inherited_turns`, `inherited_requests` count them): "
        "keep the rows with `from_parent` false to count, or train on, each completion once.",
        "",
        "## Load",
        "",
        "```python",
        "from datasets import load_dataset",
        'turns = load_dataset("parquet", data_files={"train": "turns.parquet"})["train"]',
        'messages = load_dataset("path/to/this/folder", "messages")["train"]',
        "```",
        "",
    ]
    return "\n".join(lines)
