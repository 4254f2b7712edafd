"""Range checks shared by the config's dataclasses (:mod:`boxmaker.config`,
:mod:`boxmaker.config_ports`): one message format, one bound for every duration."""

from __future__ import annotations

import math

from .errors import ConfigError

__all__ = ["MAX_SECONDS", "check", "nonneg"]

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
