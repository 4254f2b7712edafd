"""Saved slots: a session's prompt cache written to a file at a turn's end and brought back
for a fork (llama.cpp's ``POST /slots/{id}?action=save|restore``, server flag
``--slot-save-path``; :class:`boxmaker.server.EmbeddedServer` ``slot_save_path``).

Why: a fork's first request is served from the cache when a slot still holds its parent's
prefix. In this process the client's slot leases know which slot that is (the one whose last
request the fork's prompt extends). When no slot holds it any more (another session used the
slot, another process, a later day), the slot saved at the parent's turn is restored into a
slot and the fork's requests go there. When neither works (no saved file, a server without
``--slot-save-path``, a missing or corrupt file), the fork runs cold with a
:class:`ColdFork` warning, never silently; nothing in any log changes.

Files are named by session and turn, ``<session id>.turn-<k>.bin`` (:meth:`SlotStore.name`),
in the server's slot folder; where that folder is local (the embedded server's), the store
lists them and removes a session's with it (:meth:`SlotStore.files`,
:meth:`SlotStore.remove`). A local folder the store cannot use (missing, not a folder, not
readable and writable, or not the one the server saves in) is a :class:`SlotError` at once,
never a file that silently goes elsewhere.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from ..client import Client
from ..config import Config
from ..errors import ColdFork, InferError, SlotError
from ..events import Hook
from ..records import SESSION_ID, TurnEnd, User
from ..session import Session

__all__ = ["ColdFork", "SlotFile", "SlotStore", "WarmStart", "warm_fork"]

_FILE = re.compile(rf"(?P<session>{SESSION_ID.pattern})\.turn-(?P<turn>[0-9]+)\.bin")


@dataclass(frozen=True)
class SlotFile:
    """A saved slot: ``session`` and ``turn`` it was saved at, ``name`` of the file in the
    server's slot folder, ``path`` when the folder is local (else ``None``), ``tokens`` saved
    and ``bytes`` written (from the server's answer; ``None`` for a file only listed)."""

    session: str
    turn: int
    name: str
    path: Path | None = None
    tokens: int | None = None
    bytes: int | None = None


@dataclass(frozen=True)
class WarmStart:
    """How a fork's first request finds its parent's prefix: ``how`` is ``"slot"`` (a slot
    still holds it), ``"restored"`` (the saved slot ``file`` was restored into ``slot``:
    ``tokens`` of prompt cache back, in ``restore_ms``) or ``"cold"`` (``detail`` says why);
    ``slot`` is the slot the fork's requests should go to (``None``: any); ``session`` the
    fork it was made for (:func:`warm_fork`; ``""`` from :meth:`SlotStore.restore`).
    ``prefilled`` / ``prefill_ms``: the prompt tokens the prefill request processed and its
    ``prompt_ms`` (a sliding-window model: the fork's prefix sent once into the slot so that a
    context checkpoint ends where the fork begins; ``None``: no prefill).

    It says how the cache was *found*: whether the server used it is measured at the fork's
    first completion (:func:`boxmaker.cache.fork_warmth`; set ``Runtime.warm`` to this and
    the loop records both in the fork's :class:`~boxmaker.records.Warmed` record)."""

    how: Literal["slot", "restored", "cold"]
    slot: int | None = None
    file: str | None = None
    tokens: int | None = None
    restore_ms: float | None = None
    detail: str = ""
    session: str = ""
    prefilled: int | None = None
    prefill_ms: float | None = None


@dataclass(frozen=True, init=False)
class SlotStore:
    """The saved slots of one llama-server.

    Args:
        folder: the server's ``--slot-save-path`` when it is on this machine (a ``str`` or
            any path-like; listing, removing and telling a missing file from a corrupt one
            need it); ``None`` for a remote server (save and restore still work).

    Raises:
        SlotError: ``folder`` does not exist, is no folder, or cannot be read and written.
    """

    folder: Path | None

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        path = None if folder is None else Path(folder)
        if path is not None:
            _check_folder(path)
        object.__setattr__(self, "folder", path)

    @staticmethod
    def name(session_id: str, turn: int) -> str:
        """The file name of ``session_id``'s slot saved at the end of turn ``turn``."""
        return f"{session_id}.turn-{turn}.bin"

    def save(self, client: Client, session: Session, *, slot: int | None = None) -> SlotFile:
        """Save the slot of the session's latest request (``client.last_slot``, or ``slot``)
        as ``<session>.turn-<k>.bin``, ``k`` the session's turns so far.

        Raises:
            SlotError: no slot known yet (none sent, or the server picks them:
                :attr:`~boxmaker.client.Client.server_picks_slots`), the server has no
                ``--slot-save-path`` (HTTP 501), it refused the save (the message gives its
                answer), or it saved the file
                elsewhere than the store's local ``folder`` (not the server's
                ``--slot-save-path``).
        """
        if client.server_picks_slots:  # a slot named too: the server gave it to another
            raise SlotError(
                f"{session.id}: the server at {client.url} picks the slot of each request (it "
                "clears idle slots: llama-server's --cache-idle-slots; client.slot_choice), so "
                "no slot of this session is known to save: start it with --no-cache-idle-slots"
            )
        slot = client.last_slot if slot is None else slot
        if slot is None:
            raise SlotError(f"{session.id}: no request was sent yet, so no slot to save")
        turn = sum(1 for r in session.records if isinstance(r, User))
        name = self.name(session.id, turn)
        answer = _act(client, slot, "save", name)
        if self.folder is not None and not (self.folder / name).is_file():
            raise SlotError(
                f"the server at {client.url} saved {name}, but not in {self.folder}: give the "
                "folder the server was started with (its --slot-save-path)"
            )
        return SlotFile(
            session=session.id,
            turn=turn,
            name=name,
            path=None if self.folder is None else self.folder / name,
            tokens=_int(answer.get("n_saved")),
            bytes=_int(answer.get("n_written")),
        )

    def check(self, client: Client) -> None:
        """Make sure the server at ``client`` saves slots, before a session relies on it:
        a save to an invalid file name is refused HTTP 400 by a server that saves slots
        (nothing is written), HTTP 501 by one without ``--slot-save-path``.

        Raises:
            SlotError: the server cannot save slots, or answered something else.
        """
        try:
            client.slot_action(0, "save", "../boxmaker-check")
        except InferError as exc:
            if exc.status == 400 and "filename" in str(exc.body or exc).lower():
                return
            raise _refusal(client, 0, "save", "a probe", exc) from exc
        raise SlotError(f"the server at {client.url} saved a file named '../boxmaker-check'")

    def saver(self, session: Session, client: Client, *, slot: int | None = None) -> Hook:
        """A turn event hook that saves the session's slot at each turn's end (its
        ``TurnEnd``): pass it as ``on_event`` (an error saving is logged by the loop's hook
        guard, the turn is not touched). ``slot``: the slot the session's requests are
        pinned to (a client shared by several sessions at once: its ``last_slot`` is
        another's); ``None``: the client's ``last_slot``. Where the server picks the slots
        (:attr:`~boxmaker.client.Client.server_picks_slots`) nothing is saved: the first turn
        end says why (:meth:`save`'s error), the later ones are let be."""
        said = [False]

        def on_event(event: object) -> None:
            if isinstance(event, TurnEnd):
                if client.server_picks_slots and said[0]:
                    return
                said[0] = client.server_picks_slots
                self.save(client, session, slot=slot)

        return on_event

    def restore(
        self, client: Client, session_id: str, turn: int, slot: int, *, holds: Any = None
    ) -> WarmStart:
        """Restore ``session_id``'s slot saved at turn ``turn`` into ``slot``.

        Args:
            holds: the ``messages`` the restored slot holds (so unpinned requests that extend
                them go there).

        Raises:
            SlotError: the server has no ``--slot-save-path``; the file is missing (local
                folder) or the server could not restore it (missing, corrupt, or too large
                for the KV cache): the message says which and names the file.
        """
        name = self.name(session_id, turn)
        if self.folder is not None and not (self.folder / name).is_file():
            raise SlotError(f"saved slot {self.folder / name} is missing")
        answer = _act(client, slot, "restore", name, holds=holds)
        timings = answer.get("timings")
        ms = timings.get("restore_ms") if isinstance(timings, dict) else None
        return WarmStart(
            how="restored",
            slot=slot,
            file=name,
            tokens=_int(answer.get("n_restored")),
            restore_ms=float(ms) if isinstance(ms, int | float) else None,
        )

    def files(self, session_id: str | None = None) -> list[SlotFile]:
        """The saved slots in the local folder (of one session when given), by session and
        turn; ``[]`` without a folder."""
        if self.folder is None or not self.folder.is_dir():
            return []
        out = []
        for path in self.folder.iterdir():
            match = _FILE.fullmatch(path.name)
            if match and session_id in (None, match["session"]):
                out.append(SlotFile(match["session"], int(match["turn"]), path.name, path))
        return sorted(out, key=lambda f: (f.session, f.turn))

    def remove(self, session_id: str) -> list[SlotFile]:
        """Remove a session's saved slots from the local folder (with the session's log);
        returns what was removed."""
        gone = self.files(session_id)
        for f in gone:
            assert f.path is not None
            f.path.unlink(missing_ok=True)
        return gone


def warm_fork(
    fork: Session,
    client: Client,
    store: SlotStore | None = None,
    *,
    slot: int | None = None,
    pinned: bool = False,
    prefill: bool | None = None,
    config: Config | None = None,
) -> WarmStart:
    """Make a fork's first request find its parent's prefix in a slot.

    1. A slot that, as far as this process knows, holds the fork's messages as a prefix (its
       last prompt starts with them, or they start with it): ``"slot"``; the fork's requests
       are sent there.
    2. Else, with a ``store``, the parent's slot saved at the turn the fork's copy ends with
       (``after_turn``: turn ``k``; before an answer or at an edited result: turn ``k - 1``)
       is restored into ``slot`` (default: the slot the client's leases would pick):
       ``"restored"``.
    3. Else, or when the restore fails: ``"cold"``, with a :class:`ColdFork` warning saying
       why. Nothing is lost: the fork's log and the saved file stay as they were.

    On a sliding-window model (Gemma 3: ``n_swa`` in the server's capabilities) a slot, or a
    restored one, does not serve the whole prefix: llama.cpp reuses a sliding-window cache
    only from a context checkpoint, made a few tokens before the end of each prompt, so the
    parent's last reply is processed again (0.65 of a 373-token prefix reused on Gemma 3
    270M), and a restored file carries no checkpoint at all (0 reused on llama-server
    b11434). Unless the server keeps a full cache (``--swa-full``: then nothing of this is
    needed), the best it allows is a prefill: the fork's messages sent once into the slot
    (``max_tokens`` 0: one token generated), which leaves a checkpoint where the fork's
    prefix ends; the fork's first request then reuses it (0.99), and so does every later
    fork of the same prefix on that slot (the prefill then costs a few tokens). Its cost is
    in ``prefilled`` and ``prefill_ms`` (and the fork's ``Warmed`` record), never hidden.

    Args:
        pinned: the fork's requests all go to ``slot`` (a batch run keeps its slot): only
            that slot counts in step 1 (another slot holding the prefix is another run's).
        prefill: prefill the slot found or restored (``None``: when the server's model has
            a sliding window, ``Capabilities.n_swa`` > 0; with ``--swa-full`` it costs about
            a token); never for a cold fork (a prefill would cost what the fork saves).
        config: what the fork runs with (the template kwargs the prefill's prompt is
            rendered with, as the fork's own requests are); ``None``: the defaults.

    Raises:
        SlotError: ``fork`` is no fork, or ``pinned`` without a ``slot``.
    """
    forked = fork.forked
    if forked is None:
        raise SlotError(f"{fork.path}: not a fork (no 'forked' record)")
    if pinned and slot is None:
        raise SlotError("warm_fork(pinned=True) needs the slot the fork's requests go to")
    messages = fork.messages()
    held = client.holder(messages, [slot] if pinned and slot is not None else None)
    if held is not None:  # the fork's next request, which extends its messages, goes there
        client.note_slot(held, messages)
        found = WarmStart(how="slot", slot=held, session=fork.id)
        return _prefilled(found, fork, client, prefill, config)
    turn = forked.turn if forked.point == "after_turn" else forked.turn - 1
    why = "no slot store (the server's --slot-save-path) was given"
    if store is not None and turn < 1:
        why = "the fork starts before the parent's first turn ended: nothing was saved"
    elif store is not None:
        target = client.pick_slot(messages) if slot is None else slot
        try:
            restored = store.restore(client, forked.parent_session, turn, target, holds=messages)
            found = replace(restored, session=fork.id)
            return _prefilled(found, fork, client, prefill, config)
        except (SlotError, OSError) as exc:
            why = str(exc)
    warnings.warn(f"{fork.id}: the fork runs cold: {why}", ColdFork, stacklevel=2)
    return WarmStart(how="cold", detail=why, session=fork.id)


def _prefilled(
    found: WarmStart,
    fork: Session,
    client: Client,
    prefill: bool | None,
    config: Config | None,
) -> WarmStart:
    """``found`` after the fork's prefix was sent once into its slot (see :func:`warm_fork`),
    when ``prefill`` says so (``None``: a sliding-window model); a prefill that fails leaves
    ``found`` as it was, with why in its ``detail`` (the fork's first request measures the
    rest)."""
    if prefill is None:
        caps = client.capabilities()
        prefill = bool(caps is not None and caps.n_swa)
    if not prefill or found.slot is None:
        return found
    cfg = config or Config()
    body: dict[str, Any] = {
        "messages": fork.messages(),
        "id_slot": found.slot,
        "max_tokens": 0,  # llama.cpp: the prompt evaluated into the cache, one token sampled
        "chat_template_kwargs": cfg.template_kwargs(),
    }
    if fork.baseline.tools:
        body["tools"] = [dict(t) for t in fork.baseline.tools]
    try:
        done = client.chat_with_retry(body, lambda event: None)
    except InferError as exc:
        return replace(found, detail=f"the prefill of slot {found.slot} failed: {exc}")
    timings = done.usage_record().timings
    ms = timings.get("prompt_ms")
    return replace(
        found,
        prefilled=_int(timings.get("prompt_n")),
        prefill_ms=float(ms) if isinstance(ms, int | float) else None,
    )


def _act(client: Client, slot: int, action: str, name: str, *, holds: Any = None) -> dict[str, Any]:
    """``client.slot_action`` with the server's refusals as :class:`SlotError`."""
    try:
        return client.slot_action(slot, action, name, holds=holds)
    except InferError as exc:
        raise _refusal(client, slot, action, name, exc) from exc


def _refusal(client: Client, slot: int, action: str, name: str, exc: InferError) -> SlotError:
    """The :class:`SlotError` of a refused slot action: no slot saving (HTTP 501), else a
    file the server could not use."""
    if exc.status == 501:
        return SlotError(
            f"the server at {client.url} cannot save or restore slots (start it with "
            f"--slot-save-path; EmbeddedServer(slot_save_path=...)): {exc}"
        )
    return SlotError(
        f"slot {slot}: {action} of {name} failed (a missing or corrupt file, or one too "
        f"large for the KV cache): {exc}"
    )


def _check_folder(path: Path) -> None:
    """Refuse a local slot folder the store cannot use, naming it and why."""
    if not path.exists():
        raise SlotError(
            f"slot folder {path} does not exist: give the folder the server saves slots in "
            "(llama-server --slot-save-path DIR; boxmaker serve/demo/batch --slot-save-path "
            "DIR make it)"
        )
    if not path.is_dir():
        raise SlotError(f"slot folder {path} is not a folder")
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise SlotError(f"slot folder {path} cannot be read and written by this user")


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
