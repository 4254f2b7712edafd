"""The multi-format files: the extended vocab, the real templates and their rendering, the
training samples of each format, and the shipped files' metadata (offline), then the
rendering and tokenisation checked against llama.cpp on each shipped file (live)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import gguf
import httpx
import numpy as np
import pytest

from boxmaker.model import MODEL_FILES, default_model_path, model_file, model_format
from boxmaker.model.data import FAMILIES, NO_REASONING, make_sample
from boxmaker.model.format import (
    ACCENTED,
    CHAT_FORMATS,
    LLAMA3_TOKENS,
    decode,
    encode,
    read_template,
    render,
    vocab,
)
from boxmaker.model.words import HELD_OUT_ACCENTED, TOOLS, accented_names, random_city
from boxmaker.server import EmbeddedServer

FORMATS = {"tiny": 20.0, "qwen3": 35.0, "llama3": 45.0}

CALL = {
    "id": "abcdefghi",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Xi\'an"}'},
}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the weather in Xi'an?"},
    {"role": "assistant", "content": "", "reasoning_content": "I will call.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "abcdefghi", "content": '{"temp": -4, "sky": "foggy"}'},
]


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    f = reader.fields[key]
    return f.contents()


def test_extended_vocab_appends_and_keeps_every_shipped_id() -> None:
    base, base_types = vocab()
    tokens, types = vocab(True)
    assert tokens[: len(base)] == base and types[: len(base)] == base_types
    assert tokens[len(base) : len(base) + len(LLAMA3_TOKENS)] == LLAMA3_TOKENS
    assert tokens[len(base) + len(LLAMA3_TOKENS) :] == tuple(ACCENTED)
    assert len(set(tokens)) == len(tokens) == 363 + 6 + len(ACCENTED)
    text = "Weather in St. Louis? <tool_call>{}</tool_call><|im_end|>"
    assert encode(text, True) == encode(text)  # ASCII text: the same ids in both vocabs
    # an accented letter is one token in the extended vocab, its UTF-8 bytes in the shipped one
    assert len(encode("Zürich", True)) == 6 and len(encode("Zürich")) == 7
    assert decode(encode("Kraków <|eot_id|>", True), True) == "Kraków <|eot_id|>"
    assert encode("<|eot_id|>", True) == [tokens.index("<|eot_id|>")]


def test_model_files_by_format_name() -> None:
    assert model_file() == default_model_path()
    assert model_file("tiny-qwen3") == model_file("qwen3")
    assert model_file("llama3").name == "tiny-agent-llama3.gguf"
    assert {model_format(model_file(n)) for n in MODEL_FILES} == set(MODEL_FILES)
    assert model_format("elsewhere.gguf") is None
    with pytest.raises(KeyError, match="mistral"):
        model_file("mistral")


def test_templates_are_the_shipped_copies() -> None:
    qwen3, llama3 = read_template("qwen3"), read_template("llama3")
    assert "You are provided with function signatures within <tools></tools>" in qwen3
    assert "preserve_thinking" not in qwen3  # Qwen3's own: earlier reasoning is dropped
    assert '"parameters": ' in llama3 and "<|eom_id|>" in llama3 and "<|python_tag|>" in llama3
    assert read_template() == read_template("tiny")


def test_qwen3_renders_hermes_calls_and_drops_earlier_reasoning() -> None:
    later = [*CONVERSATION, {"role": "assistant", "content": "Foggy.", "reasoning_content": "r2"},
             {"role": "user", "content": "Thanks!"}]  # fmt: skip
    text = render(CONVERSATION, TOOLS, add_generation_prompt=True, chat_format="qwen3")
    assert '<think>\nI will call.\n</think>\n\n<tool_call>\n{"name": "get_weather", ' in text
    assert '"arguments": {"city": "Xi\'an"}}\n</tool_call><|im_end|>' in text
    dropped = render(later, TOOLS, add_generation_prompt=True, chat_format="qwen3")
    assert "I will call." not in dropped and "r2" not in dropped  # before the last user turn


def test_llama3_renders_json_calls_with_object_arguments_and_the_date() -> None:
    text = render(CONVERSATION, TOOLS, add_generation_prompt=True, chat_format="llama3",
                  date_string="03 Dec 2026")  # fmt: skip
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    assert (
        "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 03 Dec 2026"
        in text
    )
    assert '{"name": "get_weather", "parameters": {"city": "Xi\'an"}}<|eot_id|>' in text
    assert "I will call." not in text  # no reasoning
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    # the tools go into the first user message, as the model card's template does by default
    assert text.index('"name": "get_time"') < text.index("What is the weather in Xi'an?")


@pytest.mark.parametrize("chat_format", ["tiny", "qwen3", "llama3"])
def test_samples_of_each_format_weight_their_own_end_token(chat_format: str) -> None:
    rng = random.Random(3)
    eos = encode(CHAT_FORMATS[chat_format].eos, True)[0]
    seen = set()
    for _ in range(60):
        sample = make_sample(rng, formats={chat_format: 1.0})
        assert sample.chat_format == chat_format and sample.extended
        assert sample.ids == encode(sample.text, True)
        seen.add(sample.family)
        trained_ends = [i for i, t in enumerate(sample.ids) if t == eos and sample.weights[i]]
        assert len(trained_ends) == len(sample.trained)
        if chat_format == "llama3":
            assert "<think>" not in sample.text and "<|im_start|>" not in sample.text
            assert sample.date_string is not None and sample.date_string in sample.text
    if chat_format == "llama3":
        assert not seen & NO_REASONING
    if chat_format == "qwen3":
        assert "kept" not in seen
    assert len(seen) >= 6


def test_accented_names_only_inside_the_block() -> None:
    plain = random_city(random.Random(5))
    rng = random.Random(5)
    with accented_names(1.0):
        names = [random_city(rng) for _ in range(200)]
    assert sum(not n.isascii() for n in names) > 150
    assert all(c in ACCENTED or c.isascii() for n in names for c in n)
    assert not {n.lower() for n in names} & {n.lower() for n in HELD_OUT_ACCENTED}
    assert random_city(random.Random(5)) == plain  # outside: the shipped model's draws
    assert all(random_city(rng).isascii() for _ in range(200))


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_shipped_multi_format_files_carry_their_template_and_tokens(name: str) -> None:
    reader = gguf.GGUFReader(str(model_file(name)))
    tokens = vocab(True)[0]
    assert tuple(_field(reader, "tokenizer.ggml.tokens")) == tokens
    assert _field(reader, "tokenizer.chat_template") == read_template(name)
    fmt = CHAT_FORMATS[name]
    assert int(_field(reader, "tokenizer.ggml.eos_token_id")) == tokens.index(fmt.eos)
    assert int(_field(reader, "tokenizer.ggml.bos_token_id")) == tokens.index(fmt.bos)
    assert model_file(name).stat().st_size < 4_000_000
    # one retraining: both files hold the same weights
    other = model_file("llama3" if name == "qwen3" else "qwen3")
    mine = {t.name: np.array(t.data) for t in reader.tensors}
    theirs = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(other)).tensors}
    assert all(np.array_equal(mine[k], theirs[k]) for k in mine)


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
@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_training_prompts_match_llama_cpp_on_each_file(name: str, tmp_path: Path) -> None:
    """What a sample of each family trains on is what llama.cpp renders and tokenises."""
    rng = random.Random(17)
    checked = 0
    today = time.strftime("%d %b %Y")  # llama.cpp passes today as date_string
    with EmbeddedServer(model_file(name), n_ctx=4096, n_parallel=1, n_threads=1) as server:
        for family in FAMILIES:
            if family == "kept" or (name == "llama3" and family in NO_REASONING):
                continue
            sample = make_sample(rng, family, formats={name: 1.0})
            i = sample.trained[-1]
            msgs = [
                {k: v.replace("\x00", "") if isinstance(v, str) else v for k, v in m.items()}
                for m in sample.messages[:i]
            ]
            body: dict[str, Any] = {"messages": msgs}
            if sample.tools:
                body["tools"] = sample.tools
            prompt = httpx.post(f"{server.url}/apply-template", json=body, timeout=30).json()
            tools = _as_llama_cpp_sends(sample.tools)
            want = render(msgs, tools, add_generation_prompt=True, chat_format=name,
                          date_string=today if name == "llama3" else None)  # fmt: skip
            assert prompt["prompt"] == want
            tok = httpx.post(
                f"{server.url}/tokenize",
                json={"content": want, "add_special": False, "parse_special": True},
                timeout=30,
            ).json()
            assert tok["tokens"] == encode(want, True)
            checked += 1
    assert checked >= 10
