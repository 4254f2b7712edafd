"""The int flags the commands share: bounded by :data:`boxmaker.server.LIMITS`, and the
embedded server's context flags with one meaning across commands."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..errors import ServerError
from ..server import LIMITS, check_param


def bounded(param: str) -> Callable[[str], int]:
    """An argparse ``type`` for an int flag checked against :data:`boxmaker.server.LIMITS`
    (argparse then names the flag: ``argument --threads: ...``, exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        try:
            check_param(param, value)
        except ServerError:
            low, high = LIMITS[param]
            raise argparse.ArgumentTypeError(
                f"{value} is out of range: it must be from {low} to {high}"
            ) from None
        return value

    parse.__name__ = param  # argparse names the type in some messages
    return parse


def number(
    parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup,
    flag: str | tuple[str, ...],
    param: str,
    default: int | None,
    text: str,
    *,
    unset: str = "llama.cpp's choice",
) -> None:
    """Add an int flag (or its aliases) for the server parameter ``param``, its bounds in its
    help; ``unset`` says what no value means."""
    low, high = LIMITS[param]
    shown = f"; default: {unset}" if default is None else f"; default {default}"
    flags = (flag,) if isinstance(flag, str) else flag
    parser.add_argument(
        *flags,
        type=bounded(param),
        metavar="N",
        default=default,
        help=f"{text} ({low} to {high}{shown})",
    )


def add_ctx(parser: argparse.ArgumentParser, per_slot: int) -> None:
    """The embedded server's context flags of a command that runs several slots: ``--ctx N``
    means what it means everywhere (``serve``, ``demo``, llama-server's ``-c``): all slots
    together; ``--ctx-per-slot N`` gives each slot's instead (the server then gets it times
    ``--parallel``; the default, ``per_slot`` tokens)."""
    ctx = parser.add_mutually_exclusive_group()
    number(ctx, "--ctx", "n_ctx", None, "embedded: context size in tokens, all slots together",
            unset=f"{per_slot} per slot, times --parallel")  # fmt: skip
    number(ctx, "--ctx-per-slot", "n_ctx", per_slot, "embedded: context per slot (tokens)")


def server_ctx(args: argparse.Namespace) -> int:
    """The embedded server's whole context from :func:`add_ctx`'s flags (tokens)."""
    return int(args.ctx) if args.ctx is not None else int(args.ctx_per_slot) * args.parallel
