"""Prompt-cache outcome between two completions of a session (llama.cpp ``timings``).

After each completion llama.cpp reports ``timings.cache_n`` (prompt tokens reused from the
slot's cache) and ``timings.prompt_n`` (prompt tokens processed anew). Because every request of
a session extends the previous one, the next request should reuse at least the previous
``cache_n + prompt_n`` tokens. Less is a loss: the server threw away (part of) what it had.
Recordings made in separate conversations do not line up, and a loss between them is correct.

The second half says where and why (cache forensics, pure): :func:`classify_loss` compares
what the slot held (the previous prompt plus what was generated) with the new prompt, in the
model's tokens, and names a cause (:data:`CAUSES`). The tokens come from the server
(:mod:`boxmaker.cache`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..records import CacheLoss, Usage

__all__ = [
    "CAUSES",
    "REMEDIES",
    "WINDOW_TOKENS",
    "CacheOutcome",
    "LossCause",
    "TokenizedText",
    "cache_loss",
    "cache_outcome",
    "classify_loss",
    "first_divergence",
    "held_tokens",
    "history_change",
    "reprocessed",
    "window",
]


@dataclass(frozen=True, kw_only=True)
class CacheOutcome:
    """``expected``: previous ``cache_n + prompt_n`` (tokens); ``reused``: new ``cache_n``
    (tokens); ``hit``: ``reused >= expected``; ``lost``: ``max(0, expected - reused)``."""

    expected: int
    reused: int

    @property
    def hit(self) -> bool:
        """True when the new request reused everything the previous one made cacheable."""
        return self.reused >= self.expected

    @property
    def lost(self) -> int:
        """Tokens that had to be processed again (0 on a hit)."""
        return max(0, self.expected - self.reused)


def cache_outcome(
    previous_timings: Mapping[str, float], new_timings: Mapping[str, float]
) -> CacheOutcome | None:
    """Compare two completions' ``timings``; ``None`` when either lacks ``cache_n``/``prompt_n``.

    Args:
        previous_timings: llama.cpp ``timings`` of the earlier completion.
        new_timings: ``timings`` of the completion that followed it in the same session.
    """
    try:
        expected = int(previous_timings["cache_n"]) + int(previous_timings["prompt_n"])
        reused = int(new_timings["cache_n"])
    except (KeyError, TypeError, ValueError):
        return None
    return CacheOutcome(expected=expected, reused=reused)


def cache_loss(earlier: Usage | None, usage: Usage) -> CacheLoss | None:
    """The one cache-loss rule (SPEC "Cache outcome"), of the loop and the tap alike: the
    ``CacheLoss`` record when the completion of ``usage`` reused less than the session's
    earlier completion ``earlier`` made cacheable (``reused < expected``), with both
    quantities of the loss: ``expected - reused`` (the previous prompt's tokens not reused)
    and ``reprocessed`` / ``reprocessed_ms`` (what the server processed again of what its
    slot held, :func:`reprocessed`; ``None`` when the timings do not say); no cause yet
    (forensics adds it). ``None`` on a hit, without an earlier completion, or when either
    lacks ``cache_n``/``prompt_n``. A reply processed again while the prompt held is no loss
    by this rule."""
    outcome = cache_outcome(earlier.timings, usage.timings) if earlier is not None else None
    if earlier is None or outcome is None or outcome.hit:
        return None
    again = reprocessed(earlier.timings, usage.timings)
    tokens, ms = again if again is not None else (None, None)
    return CacheLoss(
        expected=outcome.expected, reused=outcome.reused, reprocessed=tokens, reprocessed_ms=ms
    )


# --------------------------------------------------------------------------------------------
# forensics: where the slot's tokens and the new prompt part, and why (pure; the requests that
# render and tokenize are in boxmaker.cache)

CAUSES: tuple[str, ...] = (
    "history_rewritten",
    "history_edited",
    "evicted",
    "checkpoint",
    "truncated",
    "unknown",
    "idle_slot_cleared",
    "restore_cold",
    "slept",
    "model_swapped",
)
"""Why a cache reuse fell short, as :func:`classify_loss` says it (each with its remedy in
:data:`REMEDIES`). ``checkpoint``: a sliding-window (or hybrid) model cannot reuse part of a
slot's cache, so llama.cpp restores a context checkpoint from before and re-processes the rest.
``idle_slot_cleared``: the slot held nothing at all (not even the template's first tokens) on
a server of several slots: llama-server saves an idle slot to its RAM cache and clears it when
another slot starts a task (``--cache-idle-slots``, on by default with a unified KV cache),
and a request pinned to the emptied slot (``id_slot``) is not reloaded from the RAM cache.
``slept``: the same on a one-slot server: it slept (``--sleep-idle-seconds``, the model
unloaded) or restarted. ``restore_cold``: the fork's first request after its parent's slot
was restored reused less than the restored prompt: the server accepted the restore and did not
use it. ``model_swapped``: ``GET /props`` names another model than the session's
``Capabilities`` record (a router, llama-swap, a restart with another model)."""

REMEDIES: dict[str, str] = {
    "history_rewritten": 'history.reasoning = "keep" where the template supports it',
    "history_edited": "append to the history, do not edit it",
    "evicted": "one slot per session (slots.main), more slots (--parallel)",
    "checkpoint": "llama-server --swa-full (EmbeddedServer(swa_full=True)); a fork: "
    "warm_fork's prefill",
    "truncated": "a larger n_ctx",
    "unknown": "explain the log with the server that made it",
    "idle_slot_cleared": "llama-server --no-cache-idle-slots (or --no-kv-unified): idle slots "
    "are then kept, and boxmaker's pinned requests find their slot as they left it; or "
    'client.slot_choice = "server" (the default "auto" switches once it saw a slot emptied): '
    "the server picks the slot and reloads the prompt from its RAM cache",
    "restore_cold": "a sliding-window or hybrid model's slot file holds no context "
    "checkpoints (ggml-org/llama.cpp#25913): llama-server --swa-full, or warm_fork's prefill; "
    "a dense model: a build where a restore is used (ggml-org/llama.cpp#26676)",
    "slept": "a longer --sleep-idle-seconds (or none), and --slot-save-path with slots saved at "
    "turn ends, to restore them",
    "model_swapped": "one model per server, or a router that keeps the session's model loaded "
    "(llama-swap's ttl, llama-server --models-max)",
}
"""What avoids each of :data:`CAUSES`, in words (a server flag or a client setting)."""


def held_tokens(timings: Mapping[str, float]) -> int | None:
    """The tokens a slot holds after a completion (llama.cpp ``timings``): its prompt
    (``cache_n + prompt_n``) and its reply but the last token, which the server samples and
    never decodes into the cache (``predicted_n - 1``; a prompt alone without a reply);
    ``None`` when a count is missing."""
    try:
        prompt = int(timings["cache_n"]) + int(timings["prompt_n"])
        return prompt + max(0, int(timings["predicted_n"]) - 1)
    except (KeyError, TypeError, ValueError):
        return None


def reprocessed(
    previous_timings: Mapping[str, float], new_timings: Mapping[str, float]
) -> tuple[int, float | None] | None:
    """What the server processed again of the history its slot held: ``(tokens, ms)``, or
    ``None`` when the timings lack a count.

    The slot held the previous prompt and reply but the reply's last token (llama.cpp samples
    it and never decodes it into the cache): ``held = cache_n + prompt_n + predicted_n - 1``
    of the previous timings (``predicted_n`` 0: the prompt alone). The new prompt is
    ``cache_n + prompt_n`` of the new ones; its first ``min(held, new length)`` tokens stand
    for that history (the same tokens, or the same messages rendered anew), and of them the
    server reused ``cache_n``: ``tokens = max(0, min(held, new length) - cache_n)``. It counts
    the reply too, which ``expected - reused`` (the previous prompt only) leaves out; when the
    history renders shorter than it was held (a template that drops earlier reasoning), the
    tokens of the new message that fall inside ``held`` are counted too: then an upper bound.
    ``ms`` prices them at the new request's own prompt rate (``prompt_ms / prompt_n``;
    ``None`` without ``prompt_ms`` or with ``prompt_n`` 0).

    Example (Gemma 3 270M, window 512, measured): previous prompt 30 tokens and a reply of
    270; the new request reused 25 and processed 297 in 3.2 s: 274 tokens re-processed (the
    prompt's 5 and the reply's 269 the slot held), not the 5 that ``expected - reused`` says.
    """
    held = held_tokens(previous_timings)
    try:
        reused, processed = int(new_timings["cache_n"]), int(new_timings["prompt_n"])
    except (KeyError, TypeError, ValueError):
        return None
    if held is None:
        return None
    tokens = max(0, min(held, reused + processed) - reused)
    ms = new_timings.get("prompt_ms")
    if not isinstance(ms, int | float) or processed <= 0:
        return tokens, None
    return tokens, float(ms) * tokens / processed


WINDOW_TOKENS = 24
"""Tokens each side of the divergence in a loss's text windows."""


@dataclass(frozen=True, kw_only=True)
class TokenizedText:
    """A text in the model's tokens: ``ids`` and, one per id, the text ``pieces`` (both as
    llama.cpp's ``POST /tokenize`` with ``with_pieces`` gives them)."""

    ids: tuple[int, ...]
    pieces: tuple[str, ...]

    def __add__(self, other: TokenizedText) -> TokenizedText:
        return TokenizedText(ids=self.ids + other.ids, pieces=self.pieces + other.pieces)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, kw_only=True)
class LossCause:
    """What forensics found for one loss.

    ``position``: first token (0-based) where what the slot held and the new prompt differ
    (``None`` when not found); ``cause``: one of :data:`CAUSES`; ``old_window`` /
    ``new_window``: the text of :data:`WINDOW_TOKENS` tokens each side of ``position`` in the
    slot's tokens and in the new prompt; ``detail``: what was seen, in words.
    """

    position: int | None
    cause: str
    old_window: str | None = None
    new_window: str | None = None
    detail: str = ""


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the common prefix of two token sequences: the first index where they
    differ, or the shorter length when one is a prefix of the other."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def window(tokens: TokenizedText, position: int, size: int = WINDOW_TOKENS) -> str:
    """The text of the tokens ``[position - size, position + size)`` (clipped to the sequence),
    the pieces joined; ``""`` for an empty range."""
    start = max(0, position - size)
    return "".join(tokens.pieces[start : position + size])


def history_change(
    old_messages: Sequence[Mapping[str, Any]],
    old_tools: Sequence[Mapping[str, Any]],
    new_messages: Sequence[Mapping[str, Any]],
    new_tools: Sequence[Mapping[str, Any]],
) -> str | None:
    """What the client changed in the history between two requests of a session, or ``None``
    when the new request extends the old one (its first messages equal the old ones, the tools
    are the same).

    Returns:
        e.g. ``"the tools changed"``, ``"messages[0] (system) changed"``, ``"messages[2]
        removed"``.
    """
    if list(old_tools) != list(new_tools):
        return "the tools changed"
    for i, old in enumerate(old_messages):
        if i >= len(new_messages):
            return f"messages[{i}] removed"
        if dict(old) != dict(new_messages[i]):
            return f"messages[{i}] ({old.get('role', '?')}) changed"
    return None


def classify_loss(
    *,
    expected: int,
    reused: int,
    old_prompt: TokenizedText,
    generated: TokenizedText,
    new_prompt: TokenizedText,
    edited: str | None,
    held_tokens: int | None = None,
    n_ctx: int | None = None,
    n_swa: int | None = None,
    n_slots: int | None = None,
    swapped: str | None = None,
    restored: bool = False,
) -> LossCause:
    """Say where and why a cache reuse fell short, from the server's own tokens.

    Args:
        expected: previous ``cache_n + prompt_n`` (tokens): the old prompt's length as counted.
        reused: the new ``cache_n`` (tokens).
        old_prompt: the previous request's prompt, re-rendered and tokenized.
        generated: what the previous completion added to the slot, re-rendered (empty when it
            could not be rebuilt).
        new_prompt: the new request's prompt, rendered and tokenized.
        edited: :func:`history_change` of the two requests (``None``: the client only
            appended).
        held_tokens: tokens the slot held after the previous completion (``cache_n +
            prompt_n + predicted_n``), ``None`` if unknown.
        n_ctx: the slot's context size (tokens), ``None`` if unknown.
        n_swa: the model's sliding-window size (tokens; ``0``: none), ``None`` if the server
            does not say.
        n_slots: the server's slots (``total_slots``), ``None`` if it does not say.
        swapped: the model change between the session's ``Capabilities`` record and the
            server now, in words (``None``: the same model, or not known).
        restored: the new request is a fork's first after its parent's slot was restored.

    The slot held ``old_prompt + generated``; ``position`` is the first token where that and
    the new prompt differ. The prompts agree up to ``agree = min(position, expected)``:

    - the server's model is not the session's (``swapped``): ``model_swapped``;
    - the re-rendered old prompt is not ``expected`` tokens long: ``unknown`` (another model
      or template than the one that served the session);
    - ``reused < agree``: the server reused less than the prompts share: ``truncated`` when
      the slot was full (``held_tokens >= n_ctx``: context shift), ``restore_cold`` after a
      restore (``restored``) that served next to nothing (less than a tenth of what the
      prompts share), ``idle_slot_cleared`` when nothing at all was reused on a server of
      several slots and a model without a sliding window (``n_swa == 0``: the slot was
      emptied, not taken by another prompt, which shares at least the template's first
      tokens; ``slept`` on a one-slot server, where no other slot starts a task; the slots or
      the window unknown, or a sliding window, where a prompt that shares less than its first
      checkpoint is processed whole: not told apart, ``detail`` says so),
      ``checkpoint`` on a sliding-window model (``n_swa > 0``: a context checkpoint
      restored), else ``evicted`` (``detail`` says when a checkpoint could not be told
      apart: ``n_swa`` unknown);
    - otherwise the new prompt differs inside the old one: ``history_edited`` when the client
      changed the history (``edited``), else ``history_rewritten`` (the template rendered the
      same messages differently, e.g. dropped an earlier reasoning).
    """
    held = old_prompt + generated
    position = first_divergence(held.ids, new_prompt.ids)
    windows = {"old_window": window(held, position), "new_window": window(new_prompt, position)}
    agree = min(position, expected)
    if swapped is not None:
        detail = f"the server's model changed: {swapped}; {REMEDIES['model_swapped']}"
        return LossCause(position=position, cause="model_swapped", detail=detail, **windows)
    if len(old_prompt) != expected:
        detail = (
            f"the old prompt re-renders to {len(old_prompt)} tokens, the server counted "
            f"{expected}: not the model or template that served the session?"
        )
        return LossCause(position=position, cause="unknown", detail=detail, **windows)
    if reused < agree:
        full = held_tokens is not None and n_ctx is not None and held_tokens >= n_ctx
        if full:
            detail = f"the slot held {held_tokens} tokens of n_ctx {n_ctx}: context shift"
            return LossCause(position=position, cause="truncated", detail=detail, **windows)
        detail = f"the prompts agree on {agree} tokens, the server reused {reused}"
        if restored and reused * 10 < agree:  # next to nothing of the restored prompt
            detail += f": the restored slot was not used; {REMEDIES['restore_cold']}"
            return LossCause(position=position, cause="restore_cold", detail=detail, **windows)
        emptied = ": the slot held nothing at all (another prompt shares at least the "
        emptied += "template's first tokens)"
        if reused == 0 and n_swa == 0 and n_slots is not None:
            if n_slots == 1:  # no other slot to start a task: a sleep, a restart
                detail += f"{emptied}: the server slept or restarted; {REMEDIES['slept']}"
                return LossCause(position=position, cause="slept", detail=detail, **windows)
            detail += (
                f"{emptied}: cleared while idle when another slot started a task "
                "(llama-server's --cache-idle-slots; or the server slept or restarted); "
                + REMEDIES["idle_slot_cleared"]
            )
            return LossCause(position=position, cause="idle_slot_cleared", detail=detail,
                             **windows)  # fmt: skip
        if reused == 0:  # a sliding window, or one not known: a reset cannot be told apart
            detail += (
                " (nothing reused: on a sliding-window model a prompt that shares less than its "
                "first checkpoint with the slot is processed whole; the slot may also have been "
                "emptied: cleared while idle, --cache-idle-slots, a sleep or a restart)"
            )
        if n_swa:
            detail += (
                f": a sliding-window model (n_swa {n_swa}) restored a context checkpoint "
                "instead of reusing the slot (llama-server --swa-full keeps the whole cache)"
            )
            return LossCause(position=position, cause="checkpoint", detail=detail, **windows)
        if n_swa is None:
            detail += (
                " (or a context checkpoint was restored, on a sliding-window or hybrid model: "
                "the server does not say n_swa)"
            )
        return LossCause(position=position, cause="evicted", detail=detail, **windows)
    if edited is not None:
        return LossCause(position=position, cause="history_edited", detail=edited, **windows)
    detail = f"the same messages render differently from token {position} on"
    return LossCause(position=position, cause="history_rewritten", detail=detail, **windows)
