"""orjson where it gives exactly what :mod:`json` gives; :mod:`json` where it would not.

orjson (a well-kept JSON library written in Rust) parses and writes JSON several times faster
than :mod:`json`, but not always alike: it reads integers beyond 64 bits as floats, refuses
``NaN``, lone surrogates and integers beyond 64 bits, writes a ``NaN`` or infinite float as
``null``, and nests 1024 levels at most. These helpers use it only where the result is the
one :mod:`json` gives (the same JSON values, keys in the same order), so callers keep
:mod:`json`'s behaviour, errors included:

- :func:`dumps`: ``json.dumps(obj, ensure_ascii=False, separators=(",", ":"))`` as UTF-8
  bytes, or ``None`` where only :mod:`json` can write it;
- :func:`loads`: ``json.loads(data)`` of bytes.

The stream's chunks are parsed by orjson in :mod:`boxmaker.client` with their own check (see
:meth:`boxmaker.client._stream._chunks.ChunkDecoder.feed`).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["dumps", "loads"]

_PAD = 123  # orjson's 1024 levels - 123 - 1 (a log's line array): values up to 900 levels deep
_OPEN, _CLOSE = b"[" * _PAD, b"]" * _PAD
_DIGITS = bytes(ord("0") if 48 <= i <= 57 else ord("x") for i in range(256))
_LONG_NUMBER = b"0" * 19  # 19 digits: an integer beyond 64 bits when negative


def dumps(obj: Any) -> bytes | None:
    """``obj`` as compact JSON in UTF-8 (``json.dumps(obj, ensure_ascii=False,
    separators=(",", ":"))`` in meaning: the same JSON value, keys in the same order), made
    by orjson; ``None`` when :mod:`json` must write it: orjson refuses it (an integer beyond
    64 bits, a lone surrogate, a key that is not a string, a type orjson does not know such
    as a float subclass), or it holds a ``NaN`` or infinite float (orjson would write
    ``null``; :mod:`json` writes ``NaN``/``Infinity`` or refuses them).
    """
    try:
        text = orjson.dumps(obj)
    except TypeError:  # orjson.JSONEncodeError
        return None
    # A NaN or infinite float became null: then the text does not read back as obj (C-speed
    # comparison; a tuple reads back as a list and goes to json too, which writes the same).
    if b"null" in text and orjson.loads(text) != obj:
        return None
    return text


def loads(data: bytes) -> Any:
    """``json.loads(data)``, made by orjson when that gives the same value.

    orjson is not used when a number has 19 digits or more (it reads integers beyond 64 bits
    as floats) and leaves to :mod:`json` what it refuses (``NaN``, lone surrogate escapes,
    invalid UTF-8). Nesting: :func:`json.loads` raises :class:`RecursionError` near Python's
    recursion limit (about 1000 levels) and orjson refuses beyond 1024, so orjson parses
    ``data`` inside 123 more levels (it then refuses beyond 900) and deeper texts go to
    :func:`json.loads`, which parses or refuses them as before.

    Raises:
        ValueError, RecursionError: as :func:`json.loads` (``ValueError`` covers
            :class:`json.JSONDecodeError` and :class:`UnicodeDecodeError`).
    """
    if _LONG_NUMBER not in data.translate(_DIGITS):
        try:
            value = orjson.loads(_OPEN + data + _CLOSE)
        except orjson.JSONDecodeError:
            pass
        else:
            for _ in range(_PAD):  # text that closes and reopens the brackets ("1], [2") or
                # is empty gives more or fewer than one value a level: json decides it
                if type(value) is not list or len(value) != 1:
                    return json.loads(data)
                value = value[0]
            return value
    return json.loads(data)
