"""A fork's warmth, measured: how much of its parent's prefix its first request reused.

:func:`boxmaker.cache.warm_fork` says how it *found* the parent's prompt cache (a slot that
holds it, a saved slot restored, neither). Whether the server then used it is only known
from the fork's first completion's ``timings``: a restore the server accepted but did not
use (ggml-org/llama.cpp#26676), a sliding-window model that keeps no cache past its last
context checkpoint and processes the parent's reply again (Gemma 3, without ``--swa-full``),
a slot that another session (or the server's idle-slot clearing) emptied in between, or a
server that found the prefix by itself (its RAM prompt cache, ``--cache-ram``) while nothing
was restored. :func:`fork_warmth` makes the fork's :class:`~boxmaker.records.Warmed` record
from that measurement: the label follows from the share of the prefix reused
(:data:`WARM_SHARE`), never from how the cache was found.

The prefix is what the parent's slot held after the last completion the fork copies
(:func:`boxmaker.cache.held_tokens`: its prompt and its reply but the reply's last token):
all of it can be reused by the fork's first request, which extends those messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..records import CacheLoss, Capabilities, Forked, Record, Usage, Warmed, WarmLabel
from ._outcome import held_tokens
from ._slot_store import WarmStart

__all__ = ["COLD_SHARE", "WARM_SHARE", "describe_warmth", "fork_prefix", "fork_warmth"]

WARM_SHARE = 0.9
"""A fork is warm (``slot``, ``restored``, ``server``) when its first request reused at least
this share of its parent's prefix; below it, ``partial``."""

COLD_SHARE = 0.1
"""Below this share of the parent's prefix reused, a fork is ``cold``."""


def fork_prefix(records: Sequence[Record], forked: Forked) -> tuple[int | None, int | None]:
    """``(held, prompt)`` of the parent's last completion a fork copies (its records before
    index ``forked.record``): the tokens its slot held after it (:func:`held_tokens`) and its
    prompt alone (``cache_n + prompt_n``); ``(None, None)`` without such a completion or
    with a count missing."""
    for record in reversed(records[: forked.record]):
        if isinstance(record, Usage):
            held = held_tokens(record.timings)
            try:
                prompt = int(record.timings["cache_n"]) + int(record.timings["prompt_n"])
            except (KeyError, TypeError, ValueError):
                prompt = None
            return held, prompt
    return None, None


def fork_warmth(
    records: Sequence[Record],
    forked: Forked,
    usage: Usage,
    start: WarmStart | None = None,
    *,
    loss: CacheLoss | None = None,
) -> Warmed:
    """The :class:`~boxmaker.records.Warmed` record of a fork's first completion.

    Args:
        records: the fork's records before that completion (its copies of the parent's
            first; a ``Capabilities`` record among them gives ``n_swa``).
        forked: the fork's ``Forked`` record.
        usage: the fork's first completion's ``Usage`` (its ``cache_n``).
        start: what :func:`~boxmaker.cache.warm_fork` did for this fork (``None``: it was
            not asked).
        loss: the ``CacheLoss`` the loop recorded for this completion (its cause and detail
            say why, when forensics could tell).

    The label: at least :data:`WARM_SHARE` of the prefix reused is ``slot`` or ``restored``
    when ``warm_fork`` found it so, else ``server`` (the server found it by itself); less is
    ``partial``, below :data:`COLD_SHARE` ``cold``, each with why in ``detail``; no
    measurement is ``unknown``.
    """
    prefix, prompt = fork_prefix(records, forked)
    reused = _count(usage.timings.get("cache_n"))

    def warmed(how: WarmLabel, detail: str = "") -> Warmed:
        return Warmed(
            how=how,
            prefix=prefix,
            reused=reused,
            found=None if start is None else start.how,
            slot=None if start is None else start.slot,
            file=None if start is None else start.file,
            restored=None if start is None else start.tokens,
            prefilled=None if start is None else start.prefilled,
            detail=detail,
        )

    if prefix is None or prefix <= 0:
        return warmed("unknown", "the parent made no completion before the fork point")
    if reused is None:
        return warmed("unknown", "the server sent no cache_n with the fork's first completion")
    share = min(reused, prefix) / prefix
    if share >= WARM_SHARE:
        if start is not None and start.how != "cold":
            return warmed(start.how)
        why = "the server held the parent's prefix by itself (a slot this process did not "
        why += "know of, or its RAM prompt cache)"
        if start is not None and start.detail:
            why += f"; warm_fork had found nothing: {start.detail}"
        return warmed("server", why)
    how: WarmLabel = "partial" if share >= COLD_SHARE else "cold"
    return warmed(how, _why(start, prefix, prompt, reused, loss, _n_swa(records)))


def _why(
    start: WarmStart | None,
    prefix: int,
    prompt: int | None,
    reused: int,
    loss: CacheLoss | None,
    n_swa: int | None,
) -> str:
    """Why a fork reused less than :data:`WARM_SHARE` of its parent's prefix, in words."""
    if start is None:
        parts = ["no warm_fork was asked for it"]
    elif start.how == "restored":
        parts = [
            f"{start.file} was restored into slot {start.slot} ({start.tokens} tokens), but "
            f"the server reused only {reused} of the {prefix}"
            + (": a restore accepted and not used" if reused < prefix * COLD_SHARE else "")
        ]
    elif start.how == "slot":
        parts = [f"slot {start.slot} was expected to hold the parent's prefix"]
    else:
        parts = [start.detail or "warm_fork found neither a slot nor a saved slot"]
    if prompt is not None and prompt <= reused < prefix:
        reply = f"the parent's reply ({prefix - prompt} tokens) was processed again"
        if n_swa:
            reply += (
                f": a sliding-window model (n_swa {n_swa}) keeps no reusable cache past its "
                "last context checkpoint (llama-server --swa-full, boxmaker serve --swa-full)"
            )
        parts.append(reply)
    elif start is not None and start.how == "cold":
        # warm_fork found nothing to warm it with: the loss's guesses (a sliding window, a
        # slot emptied) do not apply to a prefix the server was never known to hold
        parts.append(
            "the server did not hold the parent's prefix (one that never served the parent, "
            "or whose slot was used or emptied since)"
        )
    elif loss is not None and loss.cause:
        parts.append(f"{loss.cause}: {loss.detail or ''}".rstrip(": "))
    elif reused < min(prefix, prompt or prefix) * COLD_SHARE and start is not None:
        parts.append(
            "the slot was emptied or used by another prompt before the fork's request (another "
            "session, the server's idle-slot clearing, a restart)"
        )
    return "; ".join(parts)


def _n_swa(records: Sequence[Record]) -> int | None:
    """The sliding window the session's ``Capabilities`` record states (``None``: none)."""
    for record in reversed(records):
        if isinstance(record, Capabilities):
            return record.n_swa
    return None


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if value >= 0 else None


def describe_warmth(warmed: Warmed) -> str:
    """One line of a fork's measured warmth, as the CLI, the batch and ``BranchView`` say it:
    e.g. ``restored s1.turn-2.bin into slot 0: 904 of 905 prefix tokens reused (1.00)``,
    ``cold: 0 of 231 prefix tokens reused (0.00): <why>`` (a request that reused more than
    the prefix, its new message too, counts the prefix whole)."""
    share, prefix, reused = warmed.share, warmed.prefix, warmed.reused
    figure = "reuse not measured"
    if share is not None and prefix is not None and reused is not None:
        figure = f"{min(reused, prefix)} of {prefix} prefix tokens reused ({share:.2f})"
    if warmed.prefilled is not None:
        figure += f", after a prefill that processed {warmed.prefilled} tokens"
    if warmed.how == "slot":
        head = f"slot {warmed.slot} held the parent's prefix"
    elif warmed.how == "restored":
        head = f"restored {warmed.file} into slot {warmed.slot}"
    elif warmed.how == "server":
        head = "the server held the parent's prefix"
    else:
        head = warmed.how
    return f"{head}: {figure}" + (f": {warmed.detail}" if warmed.detail else "")
