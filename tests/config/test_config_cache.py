from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from boxmaker.cache import cache_outcome
from boxmaker.config import ClientConfig, Config, LoopLimits, ThinkingConfig, load_config
from boxmaker.errors import ConfigError


def test_defaults_work() -> None:
    c = Config()
    assert c.loop.tool_iterations == 8 and c.loop.repeat_detection is True
    assert c.thinking.turn_tokens is None and c.loop.thinking_tokens is None
    assert (c.loop.repeat_answered_at, c.loop.repeat_ends_turn_at) == (2, 3)
    assert c.slots.main is None  # the client takes a free slot (a lease), not a fixed pin


def test_toml_round(tmp_path: Path) -> None:
    p = tmp_path / "b.toml"
    p.write_text(
        '[client]\nurl = "http://127.0.0.1:9"\nretry_base_delay_s = 1\n'
        "[loop]\ntool_iterations = 3\nrepeat_detection = false\n"
        "thinking_tokens = 64\n"
    )
    c = load_config(p)
    assert c.client.url == "http://127.0.0.1:9"
    assert c.client.retry_base_delay_s == 1.0 and isinstance(c.client.retry_base_delay_s, float)
    assert (c.loop.tool_iterations, c.loop.repeat_detection) == (3, False)
    assert c.loop.thinking_tokens == 64
    assert c.loop.tool_result_cap == Config().loop.tool_result_cap


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[loop]\ntool_iteration = 3\n", "unknown key 'tool_iteration'; did you mean 'tool_it"),
        ("[lop]\ntool_iterations = 3\n", r"unknown section \[lop\]; did you mean 'loop'\?"),
        ("[lop]\n", r"unknown section \[lop\]"),
        ("[loop]\ntool_iterations = '3'\n", "tool_iterations = '3' is not of type"),
        ("[loop]\nrepeat_detection = 1\n", "repeat_detection = 1 is not of type"),
        ("[loop\n", "invalid TOML"),
    ],
)
def test_bad_config_names_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(p)
    assert "bad.toml" in str(info.value)


def test_cache_hit_and_loss() -> None:
    hit = cache_outcome({"cache_n": 10, "prompt_n": 90}, {"cache_n": 120, "prompt_n": 5})
    assert hit is not None and hit.hit and hit.lost == 0 and hit.expected == 100
    loss = cache_outcome({"cache_n": 10, "prompt_n": 90}, {"cache_n": 40, "prompt_n": 80})
    assert loss is not None and not loss.hit and loss.lost == 60 and loss.reused == 40
    exact = cache_outcome({"cache_n": 0, "prompt_n": 50}, {"cache_n": 50, "prompt_n": 1})
    assert exact is not None and exact.hit


def test_cache_outcome_without_timings_is_none() -> None:
    assert cache_outcome({}, {"cache_n": 3}) is None
    assert cache_outcome({"cache_n": 1, "prompt_n": 2}, {}) is None


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("loop", "tool_iterations", -3),
        ("loop", "tool_result_cap", -2),
        ("loop", "thinking_tokens", -2),
        ("loop", "repeat_answered_at", 1),
        ("loop", "repeat_ends_turn_at", 0),
        ("client", "retry_attempts", -2),
        ("client", "retry_base_delay_s", -1.0),
        ("client", "connect_timeout_s", 0),
        ("sampling", "temperature", -5.0),
        ("sampling", "max_tokens", 0),
        ("slots", "main", -2),
        ("thinking", "turn_tokens", -1),
    ],
)
def test_out_of_range_values_are_refused(section: str, key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"{section}\.{key} = .* is out of range"):
        Config.from_dict({section: {key: value}})


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("repeat_exempt", "get_weather", "is not a list of tool names"),  # not by substring
        ("repeat_exempt", [1], "is not a list of tool names"),
        ("cycle_length", "4", "is not a whole number"),
        ("cycle_length", 2.5, "is not a whole number"),
        ("cycle_length", True, "is not a whole number"),
        ("thinking_tokens", 3.7, "is not a whole number"),
        ("cycle_repeats", None, "is not a whole number"),
        ("repeat_detection", 1, "is not bool"),
        ("tool_call_caps", {"poll": 1.5}, "is not tool name -> count"),
    ],
)
def test_loop_limits_from_python_refuse_what_toml_refuses(
    field: str, value: object, words: str
) -> None:
    with pytest.raises(ConfigError, match=rf"loop\.{field} = .* {words}"):
        LoopLimits(**{field: value})  # type: ignore[arg-type]


def test_loop_limits_take_a_list_of_exempt_tools_as_a_tuple() -> None:
    assert LoopLimits(repeat_exempt=["a", "b"]).repeat_exempt == ("a", "b")  # type: ignore[arg-type]


def test_a_repeat_answered_after_the_turn_ends_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"repeat_answered_at = 4 is after .*ends_turn_at = 3"):
        Config.from_dict({"loop": {"repeat_answered_at": 4, "repeat_ends_turn_at": 3}})
    same = Config.from_dict({"loop": {"repeat_answered_at": 3, "repeat_ends_turn_at": 3}})
    assert (same.loop.repeat_answered_at, same.loop.repeat_ends_turn_at) == (3, 3)
    no_answer = LoopLimits(repeat_answered_at=None, repeat_ends_turn_at=2)
    assert no_answer.repeat_ends_turn_at == 2


@pytest.mark.parametrize("url", ["http://[::1", "ftp://x", "127.0.0.1:8080", "http://h:99999"])
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="is not an http"):
        Config.from_dict({"client": {"url": url}})


def test_minus_one_turns_the_result_cap_off_and_bad_utf8_is_a_config_error(tmp_path: Path) -> None:
    assert Config.from_dict({"loop": {"tool_result_cap": -1}}).loop.tool_result_cap is None
    p = tmp_path / "bad.toml"
    p.write_bytes(b"[loop]\n# \xff\xfe\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(p)


def test_the_old_thinking_cap_key_still_loads_with_a_warning_naming_the_new_one(
    tmp_path: Path,
) -> None:
    p = tmp_path / "old.toml"
    p.write_text("[thinking]\nenabled = false\nturn_tokens = 64\n")
    with pytest.warns(FutureWarning, match=r"write \[loop\] thinking_tokens = 64") as caught:
        c = load_config(p)
    assert "old.toml" in str(caught[0].message)
    assert (c.loop.thinking_tokens, c.thinking.turn_tokens, c.thinking.enabled) == (64, None, False)
    with pytest.warns(FutureWarning, match=r"LoopLimits\.thinking_tokens"):
        moved = Config(thinking=ThinkingConfig(turn_tokens=8))
    assert (moved.loop.thinking_tokens, moved.thinking.turn_tokens) == (8, None)
    p.write_text("[thinking]\nturn_tokens = 64\n[loop]\nthinking_tokens = 32\n")
    with pytest.raises(ConfigError, match="disagree"):
        load_config(p)


def test_none_turns_every_limit_off_and_minus_one_is_none_in_toml() -> None:
    text = {k: -1 for k in ("tool_iterations", "repeat_answered_at", "repeat_ends_turn_at")}
    loop = Config.from_dict({"loop": {**text, "tool_result_cap": -1, "thinking_tokens": -1}}).loop
    assert loop == LoopLimits(
        tool_iterations=None,
        repeat_answered_at=None,
        repeat_ends_turn_at=None,
        tool_result_cap=None,
        thinking_tokens=None,
    )


@pytest.mark.parametrize(
    "text",
    [
        "[client]\nidle_timeout_s = " + "[" * 1000 + "]" * 1000 + "\n",
        "[client]\nidle_timeout_s = " + "{a = " * 1000 + "1" + "}" * 1000 + "\n",
    ],
)
def test_deeply_nested_toml_is_a_config_error_naming_the_file(tmp_path: Path, text: str) -> None:
    p = tmp_path / "deep.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=r"deep\.toml: invalid TOML: .*nested too deeply"):
        load_config(p)


def test_a_deep_value_of_the_wrong_type_gives_a_short_message(tmp_path: Path) -> None:
    p = tmp_path / "deep.toml"
    p.write_text("[loop]\ntool_iterations = " + "[" * 200 + "]" * 200 + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(p)
    message = str(info.value)
    assert message == f"{p}: [loop]: tool_iterations = [[[[...]]]] is not of type int | None"


@pytest.mark.parametrize(
    ("line", "bound"),
    [
        ("idle_timeout_s = 1e308", "at most 86400 s"),
        ("connect_timeout_s = 86400.5", "at most 86400 s"),
        ("retry_max_delay_s = 1e20", "at most 86400 s"),
        ("retry_base_delay_s = 100000", "at most 86400 s"),
    ],
)
def test_absurd_durations_are_refused(tmp_path: Path, line: str, bound: str) -> None:
    p = tmp_path / "t.toml"
    p.write_text(f"[client]\n{line}\n")
    key = line.split(" = ")[0]
    with pytest.raises(ConfigError, match=rf"t\.toml: \[client\]: client\.{key} = .* {bound}"):
        load_config(p)


def test_a_day_is_the_longest_duration() -> None:
    day = Config.from_dict(tomllib.loads("[client]\nidle_timeout_s = 86400\n"))
    assert day.client.idle_timeout_s == 86400.0
    with pytest.raises(ConfigError, match=r"client\.retry_max_delay_s = 86401\.0 is out of range"):
        ClientConfig(retry_max_delay_s=86401.0)
