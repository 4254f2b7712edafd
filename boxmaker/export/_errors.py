"""The exporters' error (defined in :mod:`boxmaker.errors`, with every other)."""

from __future__ import annotations

from ..errors import ExportError

__all__ = ["ExportError"]
