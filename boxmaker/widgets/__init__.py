"""ipywidgets views that consume turn events: ``ChatPanel`` (live turns, Stop) and
``SessionView`` (a stored log), ``BranchView`` (a session and its forks: the tree, where each
fork first differs).
"""

from .._public import publish
from ._branch import Branch, BranchView
from ._widgets import MAX_FLUSHES_PER_S, SUBMIT, ChatPanel, SessionView

__all__ = ["MAX_FLUSHES_PER_S", "SUBMIT", "Branch", "BranchView", "ChatPanel", "SessionView"]

publish(globals(), __all__)
