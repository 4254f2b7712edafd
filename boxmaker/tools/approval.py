"""Approval of tool calls: a policy says which calls wait for a decision, and who decides.

:class:`ApprovalPort` wraps any tool port. A call the :class:`~boxmaker.config.ApprovalPolicy`
names (by tool name, by the port's destructive hint, or every call) becomes a
:class:`PendingCall` handed to ``ask``, a callback; the port then waits until the call is
approved or denied, the policy's timeout passes (denied, ``by="timeout"``) or the turn's cancel
switch is set (denied, ``by="cancel"``), so waiting never blocks Stop. ``ask`` runs in a thread of
its own and may:

- decide at once: return ``True`` (approve) or ``False`` (deny), decided ``by`` the port's
  ``by`` name; or call ``pending.approve(by=..., reason=...)`` / ``pending.deny(...)``;
- decide later: return ``None`` and keep the :class:`PendingCall`; a notebook panel shows it
  with Approve and Deny buttons whose clicks call ``approve`` / ``deny`` from any thread.

The decision becomes an :class:`~boxmaker.records.Approval` record that the loop appends just
before the call's ``ToolResult``; a denied call is answered "The call was denied: ..." with
``not_run="denied"``. :class:`ConsolePrompt` is an ``ask`` for a terminal (``boxmaker chat``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import select
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from ..config import ApprovalPolicy
from ..records import Approval, ApprovalDecision
from ._ports import (
    HintedPort,
    ToolAnswer,
    ToolDenied,
    ToolFailed,
    ToolHints,
    ToolOk,
    ToolPort,
    ToolRequest,
)

__all__ = ["ApprovalPort", "Ask", "ConsolePrompt", "PendingCall", "needs_approval"]

log = logging.getLogger("boxmaker.tools.approval")

POLL_S = 0.05
"""How often (seconds) a waiting port looks at the cancel switch and the clock."""


class PendingCall:
    """A tool call waiting for a decision; thread-safe, decided once (the first decision wins).

    Attributes:
        request: the call (``tool``, ``arguments``, ``call`` number, ``session_id``).
        why: why it needs approval (which rule of the policy), in words.
        timeout_s: seconds the port waits before denying, ``None``: no timeout.
    """

    def __init__(self, request: ToolRequest, why: str, timeout_s: float | None) -> None:
        self.request = request
        self.why = why
        self.timeout_s = timeout_s
        self._asked = time.monotonic()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._decision: Approval | None = None

    @property
    def tool(self) -> str:
        """The tool's registry name."""
        return self.request.tool

    def pretty_arguments(self) -> str:
        """The arguments as indented JSON, for a person to read."""
        return json.dumps(dict(self.request.arguments), indent=2, ensure_ascii=False)

    def approve(self, *, by: str = "code", reason: str = "") -> bool:
        """Let the call run. Returns ``False`` when it was decided already (nothing changes)."""
        return self._decide("approved", by, reason)

    def deny(self, *, by: str = "code", reason: str = "") -> bool:
        """Refuse the call. Returns ``False`` when it was decided already (nothing changes)."""
        return self._decide("denied", by, reason)

    def _decide(self, decision: ApprovalDecision, by: str, reason: str) -> bool:
        with self._lock:
            if self._decision is not None:
                return False
            waited_ms = round((time.monotonic() - self._asked) * 1000, 1)
            self._decision = Approval(
                call=self.request.call,
                name=self.request.tool,
                decision=decision,
                by=by,
                reason=reason,
                waited_ms=waited_ms,
            )
        self._done.set()
        return True

    @property
    def decision(self) -> Approval | None:
        """The decision once made, else ``None``."""
        with self._lock:
            return self._decision

    @property
    def done(self) -> bool:
        """Whether the call is decided (approved, denied, timed out or cancelled)."""
        return self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until decided or ``timeout_s`` seconds pass; returns :attr:`done`."""
        return self._done.wait(timeout_s)

    def __repr__(self) -> str:
        return f"PendingCall(call={self.request.call}, tool={self.tool!r}, why={self.why!r})"


Ask = Callable[[PendingCall], "bool | None"]
"""``ask(pending) -> True`` (approve), ``False`` (deny) or ``None`` (decides later through the
:class:`PendingCall`)."""


def needs_approval(policy: ApprovalPolicy, tool: str, port: ToolPort) -> str | None:
    """Why a call of ``tool`` needs approval under ``policy``, or ``None`` when it does not.

    The destructive rule asks the port for the tool's hints (a :class:`~boxmaker.tools.HintedPort`
    such as the MCP port); a port without hints never marks a tool destructive.
    """
    if policy.every_call:
        return "the policy asks for approval of every call"
    if tool in policy.tools:
        return f"the policy names {tool}"
    if policy.destructive and isinstance(port, HintedPort):
        hints = port.hints(tool)
        if hints is not None and hints.destructive and not hints.read_only:
            return f"the server marks {tool} destructive"
    return None


class ApprovalPort:
    """A tool port that asks before it passes a call on to ``inner`` (see the module docstring).

    Args:
        inner: the port that runs approved calls (an MCP port, an :class:`InProcessPort`...).
        policy: which calls need approval, and how long to wait.
        ask: who decides (``ask(pending) -> bool | None``); it runs in a thread of its own, so
            a slow or blocking ``ask`` never blocks a cancel or the timeout.
        by: the name a ``True``/``False`` answer of ``ask`` is recorded under.

    Attributes:
        pending: calls waiting for a decision now (a UI may list them), oldest first.
    """

    def __init__(
        self, inner: ToolPort, policy: ApprovalPolicy, ask: Ask, *, by: str = "callback"
    ) -> None:
        self.inner = inner
        self.policy = policy
        self.ask = ask
        self.by = by
        self.pending: list[PendingCall] = []

    def hints(self, tool: str) -> ToolHints | None:
        """The inner port's hints of ``tool`` (``None`` when it has none)."""
        return self.inner.hints(tool) if isinstance(self.inner, HintedPort) else None

    def request(self, request: ToolRequest) -> ToolAnswer:
        """Ask when the policy says so, wait for the decision, then run the call on ``inner``
        (approved) or answer :class:`~boxmaker.tools.ToolDenied` (denied, timed out,
        cancelled). The answer carries the :class:`~boxmaker.records.Approval`."""
        why = needs_approval(self.policy, request.tool, self.inner)
        if why is None:
            return self.inner.request(request)
        pending = PendingCall(request, why, self.policy.timeout_s)
        self.pending.append(pending)
        try:
            threading.Thread(
                target=self._ask, args=(pending,), name="boxmaker-approval", daemon=True
            ).start()
            approval = self._wait(pending)
        finally:
            self.pending.remove(pending)
        if approval.decision != "approved":
            said = f"{approval.reason} ({approval.by})" if approval.reason else approval.by
            return ToolDenied(reason=f"denied by {said}", approval=approval)
        answer = self.inner.request(request)
        if isinstance(answer, ToolOk | ToolFailed | ToolDenied):
            return dataclasses.replace(answer, approval=approval)
        return answer

    def _ask(self, pending: PendingCall) -> None:
        try:
            said = self.ask(pending)
        except Exception as exc:  # the asker's bug denies the call; the turn goes on
            log.warning("approval callback failed: %r", exc)
            pending.deny(by="error", reason=f"the approval callback failed: {exc!r}")
            return
        if said is True:
            pending.approve(by=self.by)
        elif said is False:
            pending.deny(by=self.by)

    def _wait(self, pending: PendingCall) -> Approval:
        cancel = pending.request.cancel
        timeout = pending.timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        while not pending.wait(POLL_S):
            if cancel is not None and cancel.is_set():
                pending.deny(by="cancel", reason="the turn was stopped while waiting")
            elif deadline is not None and time.monotonic() >= deadline:
                pending.deny(by="timeout", reason=f"no decision within {timeout:g} s")
        decision = pending.decision
        assert decision is not None  # wait() returned True: decided
        return decision


class ConsolePrompt:
    """An ``ask`` for a terminal: shows the call and reads ``y`` (approve) or ``n [reason]``.

    The question is written to ``out``; the answer is read from ``inp`` without blocking a
    decision made elsewhere: when the call is decided first (timeout, Ctrl-C), the prompt
    stops reading. Decisions are recorded ``by="console"``. Wire it into ``boxmaker chat`` as
    ``ApprovalPort(port, config.approval, ConsolePrompt())``.

    Args:
        inp: where answers come from (default ``sys.stdin``); a stream with a ``fileno`` is
            polled, any other is read line by line.
        out: where the question goes (default ``sys.stdout``).
    """

    def __init__(self, inp: TextIO | None = None, out: TextIO | None = None) -> None:
        self.inp = inp or sys.stdin
        self.out = out or sys.stdout

    def __call__(self, pending: PendingCall) -> bool | None:
        """Ask about ``pending``; returns ``None`` (the decision is made on ``pending``)."""
        args = json.dumps(dict(pending.request.arguments), ensure_ascii=False)
        wait = "" if pending.timeout_s is None else f", denied in {pending.timeout_s:g} s"
        self.out.write(
            f"\n  approve call #{pending.request.call} {pending.tool}{args}? "
            f"({pending.why}{wait}) [y / n reason] "
        )
        self.out.flush()
        line = self._readline(pending)
        if line is None:
            return None
        answer = line.strip()
        if answer.lower() in ("y", "yes"):
            pending.approve(by="console")
        else:
            word, _, reason = answer.partition(" ")
            reason = reason.strip() if word.lower() in ("n", "no") else answer
            pending.deny(by="console", reason=reason)
        return None

    def _readline(self, pending: PendingCall) -> str | None:
        try:
            fd = self.inp.fileno()
        except (AttributeError, OSError, ValueError):
            return self.inp.readline()
        while not pending.done:
            ready, _, _ = select.select([fd], [], [], POLL_S)
            if ready and not pending.done:
                return self.inp.readline()
        return None
