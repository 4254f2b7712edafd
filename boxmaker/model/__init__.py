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

from pathlib import Path

__all__ = ["MODEL_FILENAME", "TEMPLATE_FILENAME", "default_model_path", "template_path"]

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
