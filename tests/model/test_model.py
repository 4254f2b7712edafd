"""The tiny model's format: vocab, GGUF round trip, template rendering against llama.cpp."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import gguf
import httpx
import numpy as np
import pytest

from boxmaker.model import default_model_path, template_path
from boxmaker.model.data import COPY_WEIGHT, FAMILIES, HELD_OUT_CITIES, TOOLS, make_sample
from boxmaker.model.data import random_city as data_random_city
from boxmaker.model.format import (
    BYTE_OFFSET,
    ModelConfig,
    decode,
    encode,
    random_weights,
    read_gguf_weights,
    read_template,
    render,
    tensor_shapes,
    vocab,
    write_gguf,
)
from boxmaker.server import EmbeddedServer

SMALL = ModelConfig(dim=32, n_layers=2, n_heads=2, ffn=64, context_length=1024)

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help?", "reasoning_content": "Small talk."},
    {"role": "user", "content": "What is the weather in Xi'an and the time in St. Louis?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "The user wants the weather in Xi'an. I will call get_weather.",
        "tool_calls": [
            {
                "id": "call1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Xi\'an"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call1", "content": '{"temperature": -4, "sky": "foggy"}'},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Now the time in St. Louis.",
        "tool_calls": [
            {
                "id": "call2",
                "type": "function",
                "function": {"name": "get_time", "arguments": '{"city": "St. Louis"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call2", "content": '{"time": "09:05"}'},
]


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    f = reader.fields[key]
    return f.contents()


def test_vocab_layout() -> None:
    tokens, types = vocab()
    assert len(tokens) == 1 + 4 + 6 + 256 + 1 + 95 == 363
    assert tokens[:5] == ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
    assert tokens[5:11] == (
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
    )
    assert tokens[BYTE_OFFSET] == "<0x00>"
    assert tokens[BYTE_OFFSET + 255] == "<0xFF>"
    assert tokens[267] == "\n"
    assert tokens[268] == "\u2581"
    assert tokens[-1] == "~"
    assert types[1:5] == (int(gguf.TokenType.CONTROL),) * 4
    assert types[5:11] == (int(gguf.TokenType.USER_DEFINED),) * 6
    assert set(types[BYTE_OFFSET : BYTE_OFFSET + 256]) == {int(gguf.TokenType.BYTE)}


def test_encode_decode_round_trip() -> None:
    text = '<|im_start|>user\nWeather in Xi\'an? <think>a</think>\t{"é": 1}<|im_end|>'
    ids = encode(text)
    assert ids[0] == 3
    assert ids[-1] == 4
    assert 5 in ids and 6 in ids
    # "\t" and "é" are not in the vocab: UTF-8 byte tokens.
    assert BYTE_OFFSET + 0x09 in ids
    assert [i - BYTE_OFFSET for i in ids if BYTE_OFFSET <= i < BYTE_OFFSET + 256] == [
        0x09,
        0xC3,
        0xA9,
    ]
    assert decode(ids) == text
    assert encode("a b") == [vocab()[0].index("a"), 268, vocab()[0].index("b")]
    assert encode("<tool") == [vocab()[0].index(c) for c in "<tool"]


def test_gguf_round_trip(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", SMALL, random_weights(SMALL, seed=3), name="t")
    reader = gguf.GGUFReader(str(path))
    tokens, types = vocab()
    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "general.name") == "t"
    assert _field(reader, "tokenizer.ggml.model") == "llama"
    assert tuple(_field(reader, "tokenizer.ggml.tokens")) == tokens
    assert tuple(_field(reader, "tokenizer.ggml.token_type")) == types
    assert _field(reader, "tokenizer.ggml.eos_token_id") == 4
    assert _field(reader, "tokenizer.ggml.bos_token_id") == 1
    assert _field(reader, "tokenizer.ggml.add_bos_token") is False
    assert _field(reader, "tokenizer.ggml.add_space_prefix") is False
    assert _field(reader, "tokenizer.chat_template") == read_template()
    assert _field(reader, "llama.embedding_length") == 32
    assert _field(reader, "llama.block_count") == 2
    assert _field(reader, "llama.context_length") == 1024
    assert _field(reader, "llama.rope.dimension_count") == 16
    assert json.loads(_field(reader, "boxmaker.model_config"))["ffn"] == 64
    by_name = {t.name: t for t in reader.tensors}
    shapes = tensor_shapes(SMALL, len(tokens))
    assert set(by_name) == set(shapes)
    assert "output.weight" not in by_name  # tied to token_embd
    weights = random_weights(SMALL, seed=3)
    q = by_name["blk.1.attn_q.weight"]
    assert tuple(int(n) for n in q.shape) == (32, 32)
    np.testing.assert_array_equal(
        np.asarray(by_name["blk.0.ffn_down.weight"].data), weights["blk.0.ffn_down.weight"]
    )
    # ne0 is the input width: numpy (out, in) shapes are stored as they are.
    assert tuple(int(n) for n in by_name["blk.0.ffn_gate.weight"].shape) == (32, 64)
    read = read_gguf_weights(path)  # what a fine-tune starts from
    assert set(read) == set(weights)
    for name, array in weights.items():
        np.testing.assert_array_equal(read[name], array)


def test_write_gguf_rejects_wrong_shapes(tmp_path: Path) -> None:
    weights = random_weights(SMALL)
    weights["blk.0.attn_q.weight"] = np.zeros((3, 3), dtype=np.float32)
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight"):
        write_gguf(tmp_path / "m.gguf", SMALL, weights)
    del weights["output_norm.weight"]
    with pytest.raises(ValueError, match=r"missing tensor output_norm\.weight"):
        write_gguf(tmp_path / "m.gguf", SMALL, weights)


def test_shipped_model_carries_the_template() -> None:
    reader = gguf.GGUFReader(str(default_model_path()))
    assert _field(reader, "tokenizer.chat_template") == template_path().read_text()
    assert tuple(_field(reader, "tokenizer.ggml.tokens")) == vocab()[0]
    assert default_model_path().stat().st_size < 8_000_000


def test_template_keeps_reasoning_after_last_user_only() -> None:
    text = render(CONVERSATION, TOOLS, add_generation_prompt=True)
    assert "Small talk." not in text  # before the last user message: dropped (Qwen3)
    want = "<think>\nThe user wants the weather in Xi'an. I will call get_weather.\n</think>"
    assert want in text
    assert "<think>\nNow the time in St. Louis.\n</think>\n\n<tool_call>\n" in text
    assert '{"name": "get_time", "arguments": {"city": "St. Louis"}}\n</tool_call>' in text
    assert '<tool_response>\n{"time": "09:05"}\n</tool_response><|im_end|>\n' in text
    assert text.endswith("<|im_start|>assistant\n")
    # tojson keeps key order (type before function) as llama.cpp does
    assert '{"type": "function", "function": {"name": "get_weather"' in text
    # every request of a turn extends the previous one (from the last user message on)...
    for k in range(4, len(CONVERSATION)):
        gen = CONVERSATION[k - 1]["role"] != "assistant"
        assert text.startswith(render(CONVERSATION[:k], TOOLS, add_generation_prompt=gen))
    # ...but a new user message drops the reasoning of the turn before: the prompt changes
    first_turn = render(CONVERSATION[:3], TOOLS)
    assert "<think>\nSmall talk.\n</think>" in first_turn
    assert not text.startswith(first_turn)


def test_preserve_thinking_keeps_every_reasoning_so_each_turn_extends_the_last() -> None:
    text = render(CONVERSATION, TOOLS, add_generation_prompt=True, preserve_thinking=True)
    assert "<think>\nSmall talk.\n</think>" in text  # before the last user message: kept
    first_turn = render(CONVERSATION[:3], TOOLS, preserve_thinking=True)
    assert text.startswith(first_turn)  # the next user turn only appends: the cache holds
    # without it, the Qwen3 rule: the same prompt minus the earlier reasoning
    dropped = render(CONVERSATION, TOOLS, add_generation_prompt=True)
    assert text.replace("<think>\nSmall talk.\n</think>\n\n", "") == dropped


def test_random_city_never_returns_held_out_names() -> None:
    rng = random.Random(1)
    held = {c.lower() for c in HELD_OUT_CITIES}
    names = [data_random_city(rng) for _ in range(3000)]
    assert not held & {n.lower() for n in names}
    assert all(3 <= len(n) <= 24 for n in names)
    assert any(" " in n for n in names)
    assert any("'" in n or "-" in n for n in names)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_samples_weight_only_assistant_tokens(family: str) -> None:
    sample = make_sample(random.Random(7), family)
    assert len(sample.ids) == len(sample.weights)
    assert decode(sample.ids) == sample.text
    assert sample.ids == encode(sample.text)
    # the first token (system or user header) is never a target; the last assistant's
    # <|im_end|> is, with weight 1
    assert sample.weights[0] == 0.0
    last_end = max(i for i, t in enumerate(sample.ids) if t == 4)
    assert sample.weights[last_end] == 1.0
    assert (COPY_WEIGHT in sample.weights) == (family != "small_talk")
    for i, t in enumerate(sample.ids):
        if t == 3:  # <|im_start|> is never generated
            assert sample.weights[i] == 0.0


@pytest.mark.live
def test_rendering_and_tokens_match_llama_cpp() -> None:
    with EmbeddedServer(n_ctx=2048, n_threads=1, reasoning_preserve=False) as server:
        body = {"messages": CONVERSATION, "tools": TOOLS}
        served = httpx.post(f"{server.url}/apply-template", json=body, timeout=30).json()
        ours = render(CONVERSATION, TOOLS, add_generation_prompt=True)
        assert served["prompt"] == ours
        tok = httpx.post(
            f"{server.url}/tokenize",
            json={"content": ours, "add_special": False, "parse_special": True},
            timeout=30,
        ).json()
        assert tok["tokens"] == encode(ours)
        no_tools = [*CONVERSATION[:3], {"role": "user", "content": "Repeat: Q-9 r'x"}]
        served = httpx.post(
            f"{server.url}/apply-template", json={"messages": no_tools}, timeout=30
        ).json()
        assert served["prompt"] == render(no_tools, add_generation_prompt=True)
        assert served["prompt"].startswith("<|im_start|>system\nYou are a helpful assistant.")


@pytest.mark.live
def test_llama_cpp_renders_preserve_thinking_from_chat_template_kwargs() -> None:
    with EmbeddedServer(n_ctx=2048, n_threads=1, reasoning_preserve=False) as server:
        body = {
            "messages": CONVERSATION,
            "tools": TOOLS,
            "chat_template_kwargs": {"preserve_thinking": True},
        }
        served = httpx.post(f"{server.url}/apply-template", json=body, timeout=30).json()
        ours = render(CONVERSATION, TOOLS, add_generation_prompt=True, preserve_thinking=True)
        assert served["prompt"] == ours
        assert "<think>\nSmall talk.\n</think>" in served["prompt"]


def _as_llama_cpp_sends(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """llama.cpp gives a tool without a description ``"description": ""`` (after the name)."""
    if not tools:
        return tools
    out = []
    for tool in tools:
        fn = dict(tool["function"])
        if "description" not in fn:
            fn = {"name": fn["name"], "description": "", **fn}
        out.append({**tool, "function": fn})
    return out


@pytest.mark.live
def test_training_samples_match_llama_cpp_rendering() -> None:
    """Every prompt a training sample trains on is the prompt llama.cpp renders and tokenises."""
    rng = random.Random(11)
    checked = 0
    with EmbeddedServer(n_ctx=4096, n_threads=1, reasoning_preserve=False) as server:
        for family in FAMILIES:
            for _ in range(2):
                sample = make_sample(rng, family)
                for i in sample.trained:
                    msgs = [
                        {
                            k: v.replace("\x00", "") if isinstance(v, str) else v
                            for k, v in m.items()
                        }
                        for m in sample.messages[:i]
                    ]
                    body: dict[str, Any] = {"messages": msgs}
                    if sample.tools:
                        body["tools"] = sample.tools
                    keep = sample.preserve_thinking
                    if keep:
                        body["chat_template_kwargs"] = {"preserve_thinking": True}
                    served = httpx.post(f"{server.url}/apply-template", json=body, timeout=30)
                    prompt = served.json()["prompt"]
                    tools = _as_llama_cpp_sends(sample.tools)
                    want = render(msgs, tools, add_generation_prompt=True, preserve_thinking=keep)
                    assert prompt == want
                    if tools == sample.tools:
                        assert sample.text.startswith(prompt)
                    tok = httpx.post(
                        f"{server.url}/tokenize",
                        json={"content": prompt, "add_special": False, "parse_special": True},
                        timeout=30,
                    ).json()
                    assert tok["tokens"] == encode(prompt)
                    if tools == sample.tools:
                        assert tok["tokens"] == sample.ids[: len(tok["tokens"])]
                    checked += 1
    assert checked >= 2 * len(FAMILIES)


@pytest.mark.live
def test_llama_cpp_adds_empty_description_to_tools() -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    msgs = [{"role": "user", "content": "hi"}]
    with EmbeddedServer(n_ctx=1024, n_threads=1) as server:
        served = httpx.post(
            f"{server.url}/apply-template", json={"messages": msgs, "tools": [tool]}, timeout=30
        ).json()["prompt"]
    assert '{"name": "get_time", "description": "", "parameters": ' in served
    assert served != render(msgs, [tool], add_generation_prompt=True)
