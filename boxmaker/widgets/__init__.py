"""ipywidgets views that consume turn events: ``ChatPanel`` (live turns, Stop) and
``SessionView`` (a stored log).
"""

from .._public import publish
from ._widgets import MAX_FLUSHES_PER_S, SUBMIT, ChatPanel, SessionView

__all__ = ["MAX_FLUSHES_PER_S", "SUBMIT", "ChatPanel", "SessionView"]

publish(globals(), __all__)
