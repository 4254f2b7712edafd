"""``boxmaker report``: usage, cache loss and limit hits of session logs, as text or HTML.

Placeholder wired into the CLI; the frames/plots work (issue "Usage, cache loss and limit hits
as pandas frames") fills it in.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["run_report"]


def run_report(paths: Sequence[str], *, html: str | None = None) -> int:
    """Print the summary and per-kind tables of the session logs under ``paths``; with
    ``html``, also write a self-contained HTML report there. Returns the exit code.

    Raises:
        NotImplementedError: not built yet.
    """
    raise NotImplementedError("boxmaker report is not built yet")
