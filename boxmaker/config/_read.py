"""Reading a TOML file into typed values: :func:`read_toml` (the file, with :mod:`tomllib`)
and :func:`build` (nested tables into frozen dataclasses, each value checked against the
field's type hint), every refusal a :class:`~boxmaker.errors.ConfigError` naming the file and
the key. Knows nothing of which knobs exist (that is ``_knobs``)."""

from __future__ import annotations

import dataclasses
import difflib
import os
import reprlib
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["build", "fits", "read_toml"]


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The tables of the TOML file at ``path``.

    Raises:
        ConfigError: the file cannot be read, is not TOML (or not UTF-8), or nests arrays or
            tables too deeply for the parser (about 300 levels); the message names the file.
    """
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config: {exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from exc
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError(f"{p}: invalid TOML: arrays or tables nested too deeply") from None


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` naming the known key closest to a misspelled ``key``
    (:func:`difflib.get_close_matches`), else ``"; known keys: a, b, ..."``."""
    names = sorted(known)
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; known keys: {', '.join(names)}"


def type_hints(cls: Any, namespace: dict[str, Any]) -> dict[str, Any]:
    """``typing.get_type_hints(cls, globalns=namespace)``, worked out once per class (a batch
    builds a config per run: each call compiled every string annotation again). The dict is
    shared: do not change it."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls, globalns=namespace)
    return hints


_HINTS: dict[Any, dict[str, Any]] = {}


def build(cls: Any, values: dict[str, Any], where: str, namespace: dict[str, Any]) -> Any:
    """The dataclass ``cls`` from a TOML table: unknown keys refused, each value read as its
    field's type (``namespace``: the globals its string annotations are resolved in; the
    classes' ``__module__`` is their public path, which does not hold them all).

    Raises:
        ConfigError: an unknown key, a value of the wrong type, a missing required key, or a
            value the dataclass refuses; the message starts with ``where``.
    """
    hints = type_hints(cls, namespace)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}{did_you_mean(key, known)}")
        kwargs[key] = _value(hints[key], value, where, key, namespace)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except TypeError as exc:  # a required key is missing (e.g. an mcp server's name)
        raise ConfigError(f"{where}: {exc}") from None


def _value(hint: Any, value: Any, where: str, key: str, namespace: dict[str, Any]) -> Any:
    """``value`` read from TOML as the type ``hint``: a list becomes a ``tuple[X, ...]`` and a
    table a config dataclass, item by item; a whole number becomes a float where one is due."""
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: {key} = {_short(value)} is not a list")
        item = typing.get_args(hint)[0]
        return tuple(_value(item, v, where, f"{key}[{i}]", namespace) for i, v in enumerate(value))
    if typing.get_origin(hint) is Mapping:  # a TOML table of name = value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {key} must be a table")
        item = typing.get_args(hint)[1]
        return {str(k): _value(item, v, where, f"{key}.{k}", namespace) for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {key} must be a table")
        return build(hint, value, f"{where} {key}", namespace)
    if not fits(hint, value):
        raise ConfigError(f"{where}: {key} = {_short(value)} is not of type {_type_name(hint)}")
    return float(value) if hint is float and isinstance(value, int) else value


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 60, 60


def _short(value: Any) -> str:
    """``repr`` cut to a line: a value in an error message may be a huge or deep TOML value."""
    return _REPR.repr(value)


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("NoneType", "None")


def fits(hint: Any, value: Any) -> bool:
    """Whether ``value`` (as TOML gives it) is of type ``hint`` (a union, ``None``, ``float``
    taking whole numbers, ``int`` refusing ``bool``, or a class)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(fits(arg, value) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)
