"""The tiny agent model shipped with boxmaker, and where to find it.

The package data beside this module holds:

- ``tiny-agent.gguf``: a small char-level llama model in GGUF format (see ``MODEL_CARD.md``),
  loaded by default by :class:`boxmaker.server.EmbeddedServer`;
- ``chat_template.jinja``: its Qwen3-style ChatML chat template (also stored inside the GGUF
  as ``tokenizer.chat_template``);
- ``tiny-agent-qwen3.gguf`` and ``tiny-agent-llama3.gguf``: one retraining of it that also
  speaks Qwen3's and Llama 3.x's tool-call formats, each file carrying that family's real chat
  template (``templates/``, as llama.cpp ships them) and special tokens (:data:`MODEL_FILES`,
  :func:`model_file`; ``MODEL_CARD.md``, "The multi-format files").

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
    "MODEL_FILES",
    "NO_SLIDING_WINDOW",
    "TEMPLATE_FILENAME",
    "default_model_path",
    "model_file",
    "model_format",
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


MODEL_FILES: dict[str, str] = {
    "tiny": MODEL_FILENAME,
    "qwen3": "tiny-agent-qwen3.gguf",
    "llama3": "tiny-agent-llama3.gguf",
}
"""The shipped model files by the name of the tool-call format (chat template) they speak:
``tiny`` (boxmaker's own Qwen3-style template, the default model), ``qwen3`` (Qwen3's real
template: ``<tool_call>`` JSON, ``<think>`` reasoning, earlier turns' reasoning dropped),
``llama3`` (Llama 3.1's real template: JSON calls after ``<|start_header_id|>assistant``,
``<|eot_id|>``, no reasoning). ``BOXMAKER_TEST_MODEL=tiny-qwen3`` (or ``tiny-llama3``) runs
the live suite on one of them."""


def model_file(chat_format: str = "tiny") -> Path:
    """Path of the shipped model file that speaks ``chat_format`` (a key of
    :data:`MODEL_FILES`; also accepted with a ``tiny-`` prefix: ``"tiny-qwen3"``).

    Raises:
        KeyError: the name is not a key of :data:`MODEL_FILES`, naming the keys.
    """
    name = chat_format.removeprefix("tiny-") if chat_format != "tiny" else chat_format
    if name not in MODEL_FILES:
        raise KeyError(f"no shipped model speaks {chat_format!r}: one of {sorted(MODEL_FILES)}")
    return Path(__file__).resolve().parent / MODEL_FILES[name]


def model_format(path: str | Path) -> str | None:
    """The format name (a key of :data:`MODEL_FILES`) of a shipped model file's path, or
    ``None`` when ``path`` is not one of the shipped files."""
    resolved = Path(path).resolve()
    for name in MODEL_FILES:
        if model_file(name) == resolved:
            return name
    return None


def template_path() -> Path:
    """Path of the model's Jinja chat template (``boxmaker/model/chat_template.jinja``)."""
    return Path(__file__).resolve().parent / TEMPLATE_FILENAME


# GGUF value types (ggml's gguf.h, GGUF_TYPE_*): fixed sizes; 8 is a string, 9 an array
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_SLIDING_WINDOW = ".attention.sliding_window"

NO_SLIDING_WINDOW = frozenset({"llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe"})
"""GGUF architectures (``general.architecture``) llama.cpp's loader runs with full attention
when the file names no ``ARCH.attention.sliding_window`` (no window of their own in the
loader, unlike ``gemma2``, ``llama4`` or ``phi3``): :func:`sliding_window` gives ``0`` for
them, so that a cache loss on such a model is not said to be a context checkpoint."""


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
        The window in tokens; ``0`` when the file has no such key and its
        ``general.architecture`` is one llama.cpp runs without a sliding window whatever the
        file says (:data:`NO_SLIDING_WINDOW`: ``llama``, ``qwen2``, ``qwen3``...: the shipped
        models, SmolLM2); ``None`` when it has no such key otherwise (a converter that did not
        write it, an architecture with a window of its own in llama.cpp's loader), is not
        GGUF (version 2 or later), or cannot be read.
    """
    architecture = None
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
                if key == "general.architecture" and kind == _STRING:
                    architecture = _read(file, _u64(file)).decode("utf-8", "replace")
                    continue
                _skip(file, kind)
    except (OSError, ValueError, struct.error):
        return None
    return 0 if architecture in NO_SLIDING_WINDOW else None
