"""The exporters' error."""

from __future__ import annotations

from ..errors import BoxmakerError

__all__ = ["ExportError"]


class ExportError(BoxmakerError):
    """An export cannot run or failed: an optional library is missing (the message names the
    extra to install), or a receiver refused the data (its status and words kept)."""
