"""The tiny agent model's format: char-level vocab, chat-template rendering, GGUF writer.

Everything here must agree with what llama.cpp does with the written file, because the
training text is rendered and tokenised here and the served model sees llama.cpp's rendering
and tokenisation of the same conversation (``tests/model/test_model.py`` checks both against the
server's ``POST /apply-template`` and ``POST /tokenize``).

Vocab (tokenizer model ``llama``, i.e. SentencePiece-style, one token per character):

====== =============================================== ==============
ids    tokens                                          GGUF type
====== =============================================== ==============
0      ``<unk>``                                       UNKNOWN
1-4    ``<s>`` ``</s>`` ``<|im_start|>`` ``<|im_end|>``  CONTROL
5-10   ``<think>`` ``</think>`` ``<tool_call>``          USER_DEFINED
       ``</tool_call>`` ``<tool_response>``
       ``</tool_response>``
11-266 ``<0x00>`` ... ``<0xFF>`` (UTF-8 byte fallback)  BYTE
267    ``\\n``                                          NORMAL
268-   printable ASCII 32..126, space written as ``▁``  NORMAL
====== =============================================== ==============

``add_bos`` and ``add_eos`` are false, ``add_space_prefix`` is false, eos is ``<|im_end|>``.

Weights: llama architecture, F32, rope NORMAL (rotation of adjacent pairs ``x[2i], x[2i+1]``,
base 10000), so q/k are written as trained with no permutation; a torch ``Linear`` weight of
shape (out, in) is written as it is. ``output.weight`` is omitted: llama.cpp then ties the
output to ``token_embd.weight``.

Needs the ``dev`` or ``train`` extra (``gguf``, ``numpy``, ``jinja2``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import gguf
import jinja2
import numpy as np
import numpy.typing as npt

from boxmaker.model import template_path

__all__ = [
    "ACCENTED",
    "ARCH",
    "BYTE_OFFSET",
    "CHAT_FORMATS",
    "CONTROL_TOKENS",
    "EOS_TOKEN",
    "LLAMA3_TOKENS",
    "USER_DEFINED_TOKENS",
    "ChatFormat",
    "ModelConfig",
    "decode",
    "encode",
    "random_weights",
    "read_gguf_weights",
    "read_template",
    "render",
    "tensor_shapes",
    "vocab",
    "write_gguf",
]

ARCH = "llama"
"""GGUF architecture name written to ``general.architecture``."""

UNK_TOKEN = "<unk>"
CONTROL_TOKENS: tuple[str, ...] = ("<s>", "</s>", "<|im_start|>", "<|im_end|>")
"""Control tokens (ids 1-4); parsed from text only when special parsing is on."""

USER_DEFINED_TOKENS: tuple[str, ...] = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
"""User-defined tokens (ids 5-10); always parsed from text as one token."""

EOS_TOKEN = "<|im_end|>"
"""End-of-generation token: the server stops a completion when the model emits it."""

SPACE = "\u2581"
"""The SentencePiece space mark ``▁`` that stands for a space in the vocab."""

BYTE_OFFSET = 1 + len(CONTROL_TOKENS) + len(USER_DEFINED_TOKENS)
"""Id of ``<0x00>``; byte ``b`` is token ``BYTE_OFFSET + b``."""

_SPECIALS: tuple[str, ...] = CONTROL_TOKENS + USER_DEFINED_TOKENS

LLAMA3_TOKENS: tuple[str, ...] = (
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)
"""Control tokens of Llama 3.x's template, appended to the extended vocab (ids 363-368)."""

ACCENTED = (
    "\u00e0\u00e1\u00e2\u00e3\u00e4\u00e5\u00e6\u00e7\u00e8\u00e9\u00ea\u00eb\u00ec\u00ed\u00ee\u00ef"
    "\u00f1\u00f2\u00f3\u00f4\u00f5\u00f6\u00f8\u00f9\u00fa\u00fb\u00fc\u00fd\u00ff\u00df"
    "\u00c0\u00c1\u00c2\u00c3\u00c4\u00c5\u00c6\u00c7\u00c8\u00c9\u00ca\u00cb\u00cc\u00cd\u00ce\u00cf"
    "\u00d1\u00d2\u00d3\u00d4\u00d5\u00d6\u00d8\u00d9\u00da\u00db\u00dc\u00dd"
    "\u0105\u0107\u0119\u0142\u0144\u015b\u017a\u017c\u010d\u011b\u0148\u0159\u0161\u017e\u0151\u0171"
    "\u011f\u0131\u015f\u0103\u0219\u021b\u0141\u0160\u017d\u010c\u015a\u0130\u00f0\u00fe\u00d0\u00de"
)
"""Latin letters with diacritics, one NORMAL token each in the extended vocab (after
:data:`LLAMA3_TOKENS`); other non-ASCII text falls back to byte tokens."""


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the llama model (sizes in elements, context in tokens).

    Attributes:
        dim: embedding width.
        n_layers: transformer blocks.
        n_heads: attention heads (and KV heads: no grouped-query attention).
        ffn: hidden width of the SwiGLU feed-forward.
        context_length: the longest context the model was trained for, written as
            ``llama.context_length`` (the server's ``n_ctx`` may not exceed it usefully).
        rope_base: rope frequency base.
        norm_eps: RMSNorm epsilon.
    """

    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    ffn: int = 384
    context_length: int = 4096
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        """Width of one attention head (``dim // n_heads``)."""
        return self.dim // self.n_heads


@lru_cache(maxsize=2)
def vocab(extended: bool = False) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The vocab as (token texts, GGUF token types), in id order (see the module table).

    ``extended``: the vocab of the retrained multi-format files (``tiny-agent-qwen3.gguf``,
    ``tiny-agent-llama3.gguf``): the shipped 363 tokens with their ids unchanged, then
    :data:`LLAMA3_TOKENS` (CONTROL) and :data:`ACCENTED` (NORMAL).
    """
    tokens: list[str] = [UNK_TOKEN]
    types: list[int] = [int(gguf.TokenType.UNKNOWN)]
    for tok in CONTROL_TOKENS:
        tokens.append(tok)
        types.append(int(gguf.TokenType.CONTROL))
    for tok in USER_DEFINED_TOKENS:
        tokens.append(tok)
        types.append(int(gguf.TokenType.USER_DEFINED))
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(int(gguf.TokenType.BYTE))
    tokens.append("\n")
    types.append(int(gguf.TokenType.NORMAL))
    for c in range(32, 127):
        tokens.append(SPACE if c == 32 else chr(c))
        types.append(int(gguf.TokenType.NORMAL))
    if extended:
        for tok in LLAMA3_TOKENS:
            tokens.append(tok)
            types.append(int(gguf.TokenType.CONTROL))
        for ch in ACCENTED:
            tokens.append(ch)
            types.append(int(gguf.TokenType.NORMAL))
    return tuple(tokens), tuple(types)


@lru_cache(maxsize=2)
def _char_ids(extended: bool = False) -> dict[str, int]:
    tokens, types = vocab(extended)
    ids: dict[str, int] = {}
    for i, (tok, typ) in enumerate(zip(tokens, types, strict=True)):
        if typ == int(gguf.TokenType.NORMAL):
            ids[" " if tok == SPACE else tok] = i
    return ids


def encode(text: str, extended: bool = False) -> list[int]:
    """Token ids of ``text`` as llama.cpp tokenises it with special-token parsing on.

    Control and user-defined token texts become their one token; every other character is
    its own token, or its UTF-8 bytes as byte tokens when it is not in the vocab. No BOS is
    added and no space prefix. ``extended``: in the extended vocab (see :func:`vocab`).
    """
    chars = _char_ids(extended)
    tokens, _ = vocab(extended)
    specials = _SPECIALS + LLAMA3_TOKENS if extended else _SPECIALS
    special_ids = {tok: tokens.index(tok) for tok in specials}
    out: list[int] = []
    i = 0
    n = len(text)
    while i < n:
        if text[i] == "<":
            for tok in specials:
                if text.startswith(tok, i):
                    out.append(special_ids[tok])
                    i += len(tok)
                    break
            else:
                out.append(chars["<"])
                i += 1
            continue
        c = text[i]
        cid = chars.get(c)
        if cid is not None:
            out.append(cid)
        else:
            out.extend(BYTE_OFFSET + b for b in c.encode("utf-8"))
        i += 1
    return out


def decode(ids: Iterable[int], extended: bool = False) -> str:
    """Text of token ids (inverse of :func:`encode`; byte tokens are joined as UTF-8)."""
    tokens, types = vocab(extended)
    parts: list[str] = []
    pending = bytearray()
    for i in ids:
        if types[i] == int(gguf.TokenType.BYTE):
            pending.append(i - BYTE_OFFSET)
            continue
        if pending:
            parts.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
        tok = tokens[i]
        parts.append(" " if tok == SPACE else tok)
    if pending:
        parts.append(pending.decode("utf-8", errors="replace"))
    return "".join(parts)


@dataclass(frozen=True)
class ChatFormat:
    """A chat template the model is trained on and shipped with, and its special tokens.

    Attributes:
        name: the format's short name (``"tiny"``, ``"qwen3"``, ``"llama3"``).
        template: the template file's path inside this package (``boxmaker/model/...``).
        eos: the end-of-generation token written as ``tokenizer.ggml.eos_token_id``.
        bos: the token written as ``tokenizer.ggml.bos_token_id`` (the template's
            ``bos_token``; never added by the tokenizer: ``add_bos`` is false).
        object_arguments: the template writes ``tool_calls[i].function.arguments`` with
            ``tojson``, so llama.cpp passes them as an object, not a JSON text (Llama 3.x).
        thinks: the template renders ``<think>`` reasoning.
    """

    name: str
    template: str
    eos: str
    bos: str
    object_arguments: bool = False
    thinks: bool = True


CHAT_FORMATS: dict[str, ChatFormat] = {
    "tiny": ChatFormat("tiny", "chat_template.jinja", "<|im_end|>", "<s>"),
    "qwen3": ChatFormat("qwen3", "templates/qwen3.jinja", "<|im_end|>", "<s>"),
    "llama3": ChatFormat(
        "llama3",
        "templates/llama3.jinja",
        "<|eot_id|>",
        "<|begin_of_text|>",
        object_arguments=True,
        thinks=False,
    ),
}
"""The chat formats by name: ``tiny`` is boxmaker's own Qwen3-style template (the shipped
``tiny-agent.gguf``); ``qwen3`` and ``llama3`` are the real templates of Qwen3-0.6B and
Llama-3.1-8B-Instruct as llama.cpp ships them (``boxmaker/model/templates/README.md``)."""


def read_template(chat_format: str = "tiny") -> str:
    """The Jinja source of a chat format's template (default: the shipped model's
    ``boxmaker/model/chat_template.jinja``).

    Raises:
        KeyError: ``chat_format`` is not a key of :data:`CHAT_FORMATS`.
    """
    rel = CHAT_FORMATS[chat_format].template
    return (template_path().parent / rel).read_text(encoding="utf-8")


def _tojson(value: Any, indent: int | None = None) -> str:
    """llama.cpp's ``tojson``: key order kept, non-ASCII kept, no HTML escaping."""
    return json.dumps(value, indent=indent, ensure_ascii=False)


def _raise(message: str) -> str:
    raise jinja2.TemplateError(message)


@lru_cache(maxsize=4)
def _jinja_template(chat_format: str = "tiny") -> jinja2.Template:
    env = jinja2.Environment(undefined=jinja2.Undefined, autoescape=False)
    # llama.cpp's tojson keeps key order; jinja2 sorts keys unless told not to.
    env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    if chat_format != "tiny":  # the shipped model's rendering stays as it was trained
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
    return env.from_string(read_template(chat_format))


def _object_arguments(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        msg = dict(m)
        if msg.get("tool_calls"):
            calls = []
            for call in msg["tool_calls"]:
                fn = dict(call["function"])
                if isinstance(fn.get("arguments"), str):
                    fn["arguments"] = json.loads(fn["arguments"])
                calls.append({**call, "function": fn})
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def render(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
    preserve_thinking: bool = False,
    chat_format: str = "tiny",
    date_string: str | None = None,
) -> str:
    """Render a conversation with the model's chat template, as llama.cpp's jinja does.

    Args:
        messages: OpenAI-style messages (``role``, ``content``, and for assistants
            ``reasoning_content`` and ``tool_calls`` whose ``function.arguments`` may be a
            JSON text or an object).
        tools: OpenAI-style tool definitions, or ``None``/empty for no tools prefix.
        add_generation_prompt: end with the assistant's header (``<|im_start|>assistant\\n``).
        preserve_thinking: the template kwarg (llama.cpp's ``chat_template_kwargs``) that
            renders the reasoning of every earlier assistant message, not only those after
            the last user message (what the history option ``keep`` asks for; only the
            ``tiny`` template reads it).
        chat_format: a key of :data:`CHAT_FORMATS`; its ``bos_token`` and ``eos_token`` are
            passed as llama.cpp passes them.
        date_string: the ``date_string`` llama.cpp passes (today as ``"%d %b %Y"``, e.g.
            ``"03 Dec 2026"``; only Llama 3.x's template reads it); ``None``: not passed.

    Raises:
        KeyError: ``chat_format`` is unknown.
    """
    fmt = CHAT_FORMATS[chat_format]
    msgs = _object_arguments(messages) if fmt.object_arguments else list(messages)
    return _jinja_template(chat_format).render(
        messages=msgs,
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        preserve_thinking=preserve_thinking,
        bos_token=fmt.bos,
        eos_token=fmt.eos,
        **({} if date_string is None else {"date_string": date_string}),
    )


def tensor_shapes(config: ModelConfig, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """GGUF tensor names and numpy shapes (rows, cols) = torch ``Linear`` (out, in)."""
    d, f = config.dim, config.ffn
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (n_vocab, d),
        "output_norm.weight": (d,),
    }
    for i in range(config.n_layers):
        p = f"blk.{i}."
        shapes[p + "attn_norm.weight"] = (d,)
        shapes[p + "attn_q.weight"] = (d, d)
        shapes[p + "attn_k.weight"] = (d, d)
        shapes[p + "attn_v.weight"] = (d, d)
        shapes[p + "attn_output.weight"] = (d, d)
        shapes[p + "ffn_norm.weight"] = (d,)
        shapes[p + "ffn_gate.weight"] = (f, d)
        shapes[p + "ffn_up.weight"] = (f, d)
        shapes[p + "ffn_down.weight"] = (d, f)
    return shapes


def random_weights(config: ModelConfig, seed: int = 0) -> dict[str, npt.NDArray[np.float32]]:
    """Seeded random weights (normal, std 0.02; norms 1) for every tensor of the model."""
    rng = np.random.default_rng(seed)
    n_vocab = len(vocab()[0])
    out: dict[str, npt.NDArray[np.float32]] = {}
    for name, shape in tensor_shapes(config, n_vocab).items():
        if len(shape) == 1:
            out[name] = np.ones(shape, dtype=np.float32)
        else:
            out[name] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    return out


def read_gguf_weights(path: str | Path) -> dict[str, npt.NDArray[np.float32]]:
    """The tensors of a GGUF written by :func:`write_gguf`, by GGUF name, as float32 arrays
    of the shapes of :func:`tensor_shapes` (a fine-tune starts from the shipped file).

    Raises:
        ValueError: the file holds a tensor that is not float32.
    """
    out: dict[str, npt.NDArray[np.float32]] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise ValueError(f"tensor {t.name} is {t.tensor_type.name}, not F32")
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        out[t.name] = np.array(t.data, dtype=np.float32).reshape(shape)
    return out


def write_gguf(
    path: str | Path,
    config: ModelConfig,
    weights: Mapping[str, npt.NDArray[np.float32]],
    *,
    name: str = "boxmaker-tiny-agent",
    description: str = "",
    chat_format: str = "tiny",
    extended: bool = False,
) -> Path:
    """Write a llama-architecture GGUF with the char vocab and the chat template.

    Args:
        path: output file (overwritten).
        config: the model's hyper-parameters.
        weights: every tensor of :func:`tensor_shapes`, as float32 arrays of those shapes.
        name: ``general.name``.
        description: ``general.description`` (e.g. how it was trained), omitted when empty.
        chat_format: a key of :data:`CHAT_FORMATS`: the template stored as
            ``tokenizer.chat_template`` and its bos and eos tokens.
        extended: write the extended vocab (see :func:`vocab`); ``weights`` must match it.

    Returns:
        The path written.

    Raises:
        ValueError: a tensor is missing or has the wrong shape.
    """
    fmt = CHAT_FORMATS[chat_format]
    tokens, types = vocab(extended)
    shapes = tensor_shapes(config, len(tokens))
    for tname, shape in shapes.items():
        if tname not in weights:
            raise ValueError(f"missing tensor {tname}")
        if tuple(weights[tname].shape) != shape:
            raise ValueError(f"tensor {tname} has shape {weights[tname].shape}, want {shape}")
    out = Path(path)
    writer = gguf.GGUFWriter(str(out), ARCH)
    writer.add_name(name)
    if description:
        writer.add_description(description)
    writer.add_context_length(config.context_length)
    writer.add_embedding_length(config.dim)
    writer.add_block_count(config.n_layers)
    writer.add_feed_forward_length(config.ffn)
    writer.add_head_count(config.n_heads)
    writer.add_head_count_kv(config.n_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_base)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(list(tokens))
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(list(types))
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(tokens.index(fmt.bos))
    writer.add_eos_token_id(tokens.index(fmt.eos))
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(read_template(chat_format))
    writer.add_string("boxmaker.model_config", json.dumps(asdict(config)))
    for tname in shapes:
        writer.add_tensor(tname, np.ascontiguousarray(weights[tname], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
