"""Range checks shared by the config's dataclasses (:mod:`boxmaker.config`,
:mod:`boxmaker.config`): one message format, one bound for every duration."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError

__all__ = ["MAX_SECONDS", "check", "check_loop_types", "nonneg"]

MAX_SECONDS = 86_400.0
"""Upper bound of every duration knob (names ending in ``_s``): one day. Larger values are
typos or overflow the socket layer (``1e308`` seconds cannot be a socket timeout)."""


def check(where: str, **bounds: tuple[object, bool]) -> None:
    """Raise ConfigError for the first ``name=(value, ok)`` whose ``ok`` is false.

    Whatever ``ok`` says, a float that is infinite or NaN is refused, and so is a duration
    (a name ending in ``_s``) above :data:`MAX_SECONDS`.
    """
    for name, (value, ok) in bounds.items():
        if isinstance(value, float) and not math.isfinite(value):
            ok = False
        if name.endswith("_s") and isinstance(value, int | float) and value > MAX_SECONDS:
            raise ConfigError(
                f"{where}.{name} = {value!r} is out of range: at most {MAX_SECONDS:.0f} s (a day)"
            )
        if not ok:
            raise ConfigError(f"{where}.{name} = {value!r} is out of range")


def nonneg(x: float) -> bool:
    """``x`` is a finite number, zero or more."""
    return math.isfinite(x) and x >= 0


def check_loop_types(loop: Any, optional: Sequence[str]) -> None:
    """Refuse what :class:`~boxmaker.config.LoopLimits` cannot hold, with ConfigError: the
    whole-number fields (``optional`` ones may be ``None``) and ``cycle_repeats`` not an int
    (a bool, a float, a text), ``repeat_detection`` not a bool, ``repeat_exempt`` a text
    (matched by substring if let through) or not all texts, ``tool_call_caps`` not
    text -> int."""
    for name in (*optional, "cycle_repeats"):
        value = getattr(loop, name)
        if not (type(value) is int or (value is None and name in optional)):
            raise ConfigError(f"loop.{name} = {value!r:.60} is not a whole number")
    if type(loop.repeat_detection) is not bool:
        raise ConfigError(f"loop.repeat_detection = {loop.repeat_detection!r:.60} is not bool")
    exempt = loop.repeat_exempt
    if isinstance(exempt, str) or not all(isinstance(t, str) for t in exempt):
        raise ConfigError(f"loop.repeat_exempt = {exempt!r:.60} is not a list of tool names")
    caps = loop.tool_call_caps
    if not all(isinstance(k, str) and type(v) is int for k, v in dict(caps).items()):
        raise ConfigError(f"loop.tool_call_caps = {caps!r:.60} is not tool name -> count")
