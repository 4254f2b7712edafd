"""The tiny agent model shipped with boxmaker, and where to find it.

The package data beside this module holds:

- ``tiny-agent.gguf``: a small char-level llama model in GGUF format (see ``MODEL_CARD.md``),
  loaded by default by :class:`boxmaker.server.EmbeddedServer`;
- ``chat_template.jinja``: its Qwen3-style ChatML chat template (also stored inside the GGUF
  as ``tokenizer.chat_template``).

Writing and training the model lives in :mod:`boxmaker.model.format` (vocab, rendering, GGUF
writer; needs the ``dev`` or ``train`` extra), :mod:`boxmaker.model.make` (a random, loadable
model) and :mod:`boxmaker.model.train` (PyTorch, the ``train`` extra). None of them is imported
by ``import boxmaker`` or by this module.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "MODEL_FILENAME",
    "TEMPLATE_FILENAME",
    "default_model_path",
    "sliding_window",
    "template_path",
]

MODEL_FILENAME = "tiny-agent.gguf"
"""File name of the shipped model inside this package."""

TEMPLATE_FILENAME = "chat_template.jinja"
"""File name of the chat template inside this package."""


def default_model_path() -> Path:
    """Path of the shipped GGUF model (``boxmaker/model/tiny-agent.gguf``).

    The path is returned whether or not the file exists; the server checks existence and
    raises :class:`boxmaker.errors.ServerError` naming the path when it is missing.
    """
    return Path(__file__).resolve().parent / MODEL_FILENAME


def template_path() -> Path:
    """Path of the model's Jinja chat template (``boxmaker/model/chat_template.jinja``)."""
    return Path(__file__).resolve().parent / TEMPLATE_FILENAME


# GGUF value types (ggml's gguf.h, GGUF_TYPE_*): fixed sizes; 8 is a string, 9 an array
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_SLIDING_WINDOW = ".attention.sliding_window"


def _read(file: BinaryIO, size: int) -> bytes:
    data = file.read(size)
    if len(data) != size:
        raise ValueError("GGUF header cut short")
    return data


def _u64(file: BinaryIO) -> int:
    return int(struct.unpack("<Q", _read(file, 8))[0])


def _skip(file: BinaryIO, kind: int, count: int = 1) -> None:
    if kind in _FIXED:
        file.seek(_FIXED[kind] * count, 1)
    elif kind == _STRING:
        for _ in range(count):
            file.seek(_u64(file), 1)
    elif kind == _ARRAY:
        for _ in range(count):
            inner = int(struct.unpack("<I", _read(file, 4))[0])
            _skip(file, inner, _u64(file))
    else:
        raise ValueError(f"GGUF value type {kind} unknown")


def sliding_window(path: str | Path) -> int | None:
    """The sliding-window attention size of a GGUF model, in tokens, read from its header.

    GGUF (ggml's ``docs/gguf.md``): ``GGUF``, version, tensor count, then key/value pairs; the
    window is the ``ARCH.attention.sliding_window`` value (Gemma 3: 512). Only the header is
    read, up to that key.

    Returns:
        The window in tokens; ``None`` when the file has no such key (no sliding window, or a
        converter that did not write it), is not GGUF (version 2 or later), or cannot be read.
    """
    try:
        with open(path, "rb") as file:
            magic, version = struct.unpack("<4sI", _read(file, 8))
            if magic != b"GGUF" or version < 2:
                return None
            _u64(file)  # tensors
            for _ in range(_u64(file)):
                key = _read(file, _u64(file)).decode("utf-8", "replace")
                kind = int(struct.unpack("<I", _read(file, 4))[0])
                if key.endswith(_SLIDING_WINDOW) and kind == _UINT32:
                    return int(struct.unpack("<I", _read(file, 4))[0])
                _skip(file, kind)
    except (OSError, ValueError, struct.error):
        return None
    return None
