"""Turns made readable, without widgets: ``Transcript`` folds turn events and log records
into plain turns; the render functions make model text safe to show (sanitized HTML,
``terminal_safe`` for terminals); ``ConsoleView`` prints a turn live.
"""

from .._public import publish
from ._console import ConsoleView, format_usage_table, usage_rows
from ._render import (
    TRANSCRIPT_CSS,
    render_block,
    render_stream_head,
    render_text,
    render_turn,
    render_turn_foot,
    render_user,
    terminal_safe,
)
from ._transcript import AnswerBlock, Block, ReasoningBlock, ToolBlock, Transcript, TurnView

__all__ = [
    "TRANSCRIPT_CSS",
    "AnswerBlock",
    "Block",
    "ConsoleView",
    "ReasoningBlock",
    "ToolBlock",
    "Transcript",
    "TurnView",
    "format_usage_table",
    "render_block",
    "render_stream_head",
    "render_text",
    "render_turn",
    "render_turn_foot",
    "render_user",
    "terminal_safe",
    "usage_rows",
]

publish(globals(), __all__)
