"""Cache forensics without a server: the pure divergence and classification (examples and
hypothesis properties), and the edge (:mod:`boxmaker.cache`) against a toy template and
char-level tokenizer behind ``httpx.MockTransport``. The live tests (``test_forensics_live``)
prove it on llama.cpp."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.cache import (
    CAUSES,
    REMEDIES,
    CacheForensics,
    TokenizedText,
    cache_loss,
    classify_loss,
    explain_log,
    first_divergence,
    history_change,
    reprocessed,
    window,
)
from boxmaker.cache._forensics import SentRequest, TemplateServer, explain_loss
from boxmaker.cassettes import use_cassette
from boxmaker.client import SIDE_REQUEST, Client, refused
from boxmaker.config import CacheConfig, ClientConfig, Config, HistoryConfig, load_config
from boxmaker.errors import ConfigError, InferError
from boxmaker.records import Assistant, Baseline, CacheLoss, ToolResult, TurnEnd, Usage, User
from boxmaker.session import Session, message_of
from boxmaker.testing import ScriptedClient, answer, call, timings
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn
from boxmaker.view import ConsoleView

# --- pure: divergence and classification ----------------------------------------------------


def toks(text: str) -> TokenizedText:
    return TokenizedText(ids=tuple(ord(c) for c in text), pieces=tuple(text))


@given(st.lists(st.integers(0, 3)), st.lists(st.integers(0, 3)))
def test_first_divergence_is_the_common_prefix_length(a: list[int], b: list[int]) -> None:
    p = first_divergence(a, b)
    assert a[:p] == b[:p]
    assert p == min(len(a), len(b)) or a[p] != b[p]


def test_first_divergence_examples() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([], [1]) == 0


def test_window_is_clipped_to_the_tokens() -> None:
    t = toks("abcdefgh")
    assert window(t, 4, size=2) == "cdef"
    assert window(t, 0, size=3) == "abc"
    assert window(t, 8, size=3) == "fgh"


def test_history_change_names_what_changed() -> None:
    sys = {"role": "system", "content": "a"}
    user = {"role": "user", "content": "q"}
    tool = {"type": "function", "function": {"name": "f"}}
    assert history_change([sys, user], [tool], [sys, user, user], [tool]) is None
    assert history_change([sys], [tool], [sys], []) == "the tools changed"
    edited = {"role": "system", "content": "b"}
    assert history_change([sys, user], [], [edited, user], []) == "messages[0] (system) changed"
    assert history_change([sys, user], [], [sys], []) == "messages[1] removed"


prefixes = st.text(alphabet="abc", min_size=1, max_size=30)


@given(prefixes, st.text(alphabet="xy", min_size=1, max_size=10), st.data())
def test_a_prompt_changed_inside_the_old_one_is_a_history_cause(
    old_text: str, gen: str, data: st.DataObject
) -> None:
    k = data.draw(st.integers(0, len(old_text) - 1), label="divergence")
    new_text = old_text[:k] + "z" + old_text[k + 1 :] + gen + "u"
    kwargs: dict[str, Any] = {
        "expected": len(old_text),
        "reused": k,
        "old_prompt": toks(old_text),
        "generated": toks(gen),
        "new_prompt": toks(new_text),
    }
    rewritten = classify_loss(**kwargs, edited=None)
    assert (rewritten.cause, rewritten.position) == ("history_rewritten", k)
    assert rewritten.old_window and rewritten.old_window[min(k, 24)] == old_text[k]
    assert rewritten.new_window and rewritten.new_window[min(k, 24)] == "z"
    edited = classify_loss(**kwargs, edited="the tools changed")
    assert (edited.cause, edited.position, edited.detail) == (
        "history_edited",
        k,
        "the tools changed",
    )
    if k > 0:  # the server reused less than the prompts share: the slot was taken
        evicted = classify_loss(**{**kwargs, "reused": k - 1}, edited=None)
        assert (evicted.cause, evicted.position) == ("evicted", k)


@given(prefixes, st.text(alphabet="xy", max_size=10), st.integers(0, 100))
def test_prompts_that_agree_past_the_old_prompt_are_evicted_or_truncated(
    old_text: str, gen: str, reused_cut: int
) -> None:
    new_text = old_text + gen + "u"
    reused = reused_cut % len(old_text)  # less than expected: a loss
    kwargs: dict[str, Any] = {
        "expected": len(old_text),
        "reused": reused,
        "old_prompt": toks(old_text),
        "generated": toks(gen),
        "new_prompt": toks(new_text),
        "edited": None,
    }
    held = len(old_text) + len(gen)
    assert classify_loss(**kwargs).cause == "evicted"
    assert classify_loss(**kwargs).position == held
    assert classify_loss(**kwargs, held_tokens=held, n_ctx=held + 1).cause == "evicted"
    truncated = classify_loss(**kwargs, held_tokens=held, n_ctx=held)
    assert (truncated.cause, truncated.position) == ("truncated", held)


def test_an_old_prompt_of_another_length_is_unknown() -> None:
    found = classify_loss(
        expected=10,
        reused=2,
        old_prompt=toks("abcd"),
        generated=toks(""),
        new_prompt=toks("abXd"),
        edited=None,
    )
    assert found.cause == "unknown" and found.position == 2
    assert "4 tokens, the server counted 10" in found.detail
    assert set(CAUSES) >= {found.cause}


# --- config ---------------------------------------------------------------------------------


def test_history_and_cache_config_from_toml(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('[history]\nreasoning = "keep"\n[cache]\nforensics = false\n')
    c = load_config(p)
    assert (c.history.reasoning, c.cache.forensics) == ("keep", False)
    assert c.template_kwargs() == {"enable_thinking": True, "preserve_thinking": True}
    assert Config().template_kwargs() == {"enable_thinking": True}
    p.write_text('[history]\nreasoning = "forget"\n')
    with pytest.raises(ConfigError, match=r"c\.toml: \[history\]: history\.reasoning = 'forget' "):
        load_config(p)
    p.write_text('[cache]\nforensics = "yes"\n')
    with pytest.raises(ConfigError, match=r"\[cache\]: forensics = 'yes' is not of type bool"):
        load_config(p)
    with pytest.raises(ConfigError, match="one of 'drop', 'keep'"):
        HistoryConfig(reasoning="Keep")


def test_keep_asks_the_template_to_preserve_thinking_and_drop_sends_what_it_did(
    tmp_path: Path,
) -> None:
    bodies = []
    for reasoning in ("drop", "keep"):
        session = Session.create(tmp_path / reasoning, Baseline())
        client = ScriptedClient([answer("a", reasoning="r"), answer("b")])
        config = Config(history=HistoryConfig(reasoning=reasoning))
        runtime = Runtime(config=config, client=client, registry=Registry())
        run_turn(session, runtime, "one")
        run_turn(session, runtime, "two")
        bodies.append(client.bodies[1])
    drop, keep = bodies
    assert drop["chat_template_kwargs"] == {"enable_thinking": True}
    assert keep["chat_template_kwargs"] == {"enable_thinking": True, "preserve_thinking": True}
    assert drop["messages"] == keep["messages"]
    assert drop["messages"][1] == {"role": "assistant", "content": "a", "reasoning_content": "r"}


# --- the edge, against a toy template -------------------------------------------------------


class ToyServer:
    """``/apply-template`` with a Qwen3-like rule (an assistant's reasoning is rendered after
    the last user message, or everywhere with ``preserve_thinking``), ``/tokenize`` one token
    per character (BOS ``<s>`` with ``add_special``), ``/props`` with ``n_ctx``."""

    def __init__(
        self,
        n_ctx: int = 4096,
        fail: str | None = None,
        n_swa: int | None = None,
        refuse_continue: bool = False,
    ) -> None:
        self.n_ctx = n_ctx
        self.fail = fail
        self.n_swa = n_swa  # exposed in /props when given (newer builds)
        self.refuse_continue = refuse_continue  # llama.cpp's 400 to a last call message
        self.paths: list[str] = []

    @staticmethod
    def render(body: dict[str, Any]) -> str:
        msgs = body["messages"]
        keep = body.get("chat_template_kwargs", {}).get("preserve_thinking", False)
        out = f"<tools>{json.dumps(body['tools'])}</tools>\n" if body.get("tools") else ""
        last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                out += f"<{m['role']}>{m['content']}</{m['role']}>\n"
                continue
            think = m.get("reasoning_content") and (i > last_user or keep)
            out += "<a>" + (f"<think>{m['reasoning_content']}</think>" if think else "")
            out += m.get("content", "") + "".join(
                f"<call>{c['function']['name']}</call>" for c in m.get("tool_calls", [])
            )
            out += "" if i == len(msgs) - 1 else "</a>\n"
        return out + ("" if msgs[-1]["role"] == "assistant" else "<a>")

    @staticmethod
    def tokens(text: str, add_special: bool) -> list[dict[str, Any]]:
        head = [{"id": 1, "piece": "<s>"}] if add_special else []
        return head + [{"id": ord(c), "piece": c} for c in text]

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.paths.append(path)
        if path == self.fail:
            return httpx.Response(500, json={"error": {"message": "boom"}})
        if path == "/props":
            props: dict[str, Any] = {"default_generation_settings": {"n_ctx": self.n_ctx}}
            props |= {"n_swa": self.n_swa} if self.n_swa is not None else {}
            return httpx.Response(200, json=props)
        body = json.loads(request.content)
        last = body.get("messages", [{}])[-1]
        if self.refuse_continue and last.get("role") == "assistant" and last.get("tool_calls"):
            message = "Cannot continue an assistant message that contains tool calls."
            error = {"code": 400, "message": message, "type": "invalid_request_error"}
            return httpx.Response(400, json={"error": error})
        if path == "/apply-template":
            return httpx.Response(200, json={"prompt": self.render(body)})
        assert path == "/tokenize" and body["with_pieces"] is True
        return httpx.Response(
            200, json={"tokens": self.tokens(body["content"], body["add_special"])}
        )


TOOLS = ({"type": "function", "function": {"name": "get_weather", "parameters": {}}},)
A1 = Assistant(
    content=None, reasoning="look", tool_calls=(call("get_weather", {"city": "X"}, "c1"),)
)
A2 = Assistant(content="sunny", reasoning="read")


def two_turns(tmp_path: Path) -> Session:
    """A session after one turn (a tool call, its result, an answer) and the next user
    message: the loop is about to record the next turn's first completion."""
    session = Session.create(tmp_path, Baseline(system="sys", tools=TOOLS))
    session.extend(
        [
            User(content="weather?"),
            A1,
            Usage(timings=timings(0, 40)),
            ToolResult(call=1, tool_call_id="c1", name="get_weather", content="{}"),
            A2,
            Usage(timings=timings(40, 30, 10)),
            TurnEnd(outcome="answered"),
            User(content="again?"),
        ]
    )
    return session


def body_of(session: Session, config: Config) -> dict[str, Any]:
    return {
        "messages": session.messages(),
        "tools": [dict(t) for t in TOOLS],
        "chat_template_kwargs": config.template_kwargs(),
    }


def toy_runtime(toy: ToyServer, config: Config | None = None) -> Runtime:
    client = Client(
        ClientConfig(url="http://llama.test"), transport=httpx.MockTransport(toy.handler)
    )
    return Runtime(config=config or Config(), client=client, registry=Registry())


def request_text(session: Session, upto: int, config: Config) -> str:
    """The toy's rendering of the request of the ``upto``-th record's completion."""
    body = {**body_of(session, config), "messages": session.messages()[:upto]}
    return ToyServer.render(body)


def test_dropped_reasoning_is_history_rewritten_at_the_first_earlier_reasoning(
    tmp_path: Path,
) -> None:
    session, toy, config = two_turns(tmp_path), ToyServer(), Config()
    old = request_text(session, 4, config)  # system, user, a1, tool: the answer's request
    expected = 1 + len(old)  # BOS + one token per character
    first = request_text(session, 2, config)  # system, user: a1 starts after it
    at = 1 + len(first) + 1  # BOS, then "<think>" and "<call>" share their "<"
    usage = Usage(timings=timings(at, 20))
    earlier = Usage(timings=timings(0, expected, 10))
    (loss,) = CacheForensics().losses(
        session, toy_runtime(toy, config), body_of(session, config), earlier, usage
    )
    assert (loss.expected, loss.reused) == (expected, at)
    assert (loss.cause, loss.position) == ("history_rewritten", at)
    assert loss.old_window is not None and "<a><think>look" in loss.old_window
    assert loss.new_window is not None and "<a><call>get_weather" in loss.new_window
    assert toy.paths.count("/apply-template") == 3 and len(toy.paths) <= 7


def test_kept_reasoning_agrees_so_a_short_reuse_is_an_eviction(tmp_path: Path) -> None:
    session, toy = two_turns(tmp_path), ToyServer()
    config = Config(history=HistoryConfig(reasoning="keep"))
    expected = 1 + len(request_text(session, 4, config))
    earlier = Usage(timings=timings(0, expected, 10))
    (loss,) = CacheForensics().losses(
        session,
        toy_runtime(toy, config),
        body_of(session, config),
        earlier,
        Usage(timings=timings(5, 200)),
    )
    held = expected + len("<think>read</think>sunny")
    assert (loss.cause, loss.position, loss.reused) == ("evicted", held, 5)
    assert loss.detail == (
        f"the prompts agree on {expected} tokens, the server reused 5 (or a context "
        "checkpoint was restored, on a sliding-window or hybrid model: the server does not "
        "say n_swa)"
    )  # what forensics could not know
    # the slot held the prompt and the reply (10 tokens); the new prompt is 205 tokens long
    assert loss.reprocessed == min(expected + 10, 5 + 200) - 5
    assert loss.reprocessed_ms == pytest.approx(1.5 * loss.reprocessed)  # the prompt rate
    windowed = ToyServer(n_swa=512)  # a sliding-window model: a context checkpoint restored
    (checkpoint,) = CacheForensics().losses(
        session,
        toy_runtime(windowed, config),
        body_of(session, config),
        earlier,
        Usage(timings=timings(5, 200)),
    )
    assert (checkpoint.cause, checkpoint.position) == ("checkpoint", held)
    assert checkpoint.detail is not None and "n_swa 512" in checkpoint.detail
    assert "--swa-full" in checkpoint.detail
    unwindowed = ToyServer(n_swa=0)  # the server says there is no window: an eviction
    (evicted,) = CacheForensics().losses(
        session,
        toy_runtime(unwindowed, config),
        body_of(session, config),
        earlier,
        Usage(timings=timings(5, 200)),
    )
    assert evicted.detail == f"the prompts agree on {expected} tokens, the server reused 5"
    small = ToyServer(n_ctx=expected)  # the slot was full: a context shift
    (shifted,) = CacheForensics().losses(
        session,
        toy_runtime(small, config),
        body_of(session, config),
        earlier,
        Usage(timings=timings(5, 200)),
    )
    assert (shifted.cause, shifted.position) == ("truncated", held)


def test_tools_changed_between_requests_is_history_edited(tmp_path: Path) -> None:
    session, toy, config = two_turns(tmp_path), ToyServer(), Config()
    forensics, runtime = CacheForensics(), toy_runtime(toy, config)
    old_body = {**body_of(session, config), "messages": session.messages()[:4]}
    expected = 1 + len(ToyServer.render(old_body))
    assert (
        forensics.losses(session, runtime, old_body, None, Usage(timings=timings(0, expected)))
        == []
    )
    new_body = {**body_of(session, config), "tools": []}  # the client dropped the tool
    earlier = Usage(timings=timings(0, expected, 10))
    (loss,) = forensics.losses(session, runtime, new_body, earlier, Usage(timings=timings(2, 90)))
    # BOS, then "<tools>" and "<system>" share their "<"
    assert (loss.cause, loss.position, loss.detail) == ("history_edited", 2, "the tools changed")


def test_forensics_off_paused_or_failing_never_fails_and_records_the_loss(tmp_path: Path) -> None:
    session = two_turns(tmp_path)
    earlier, usage = Usage(timings=timings(0, 100)), Usage(timings=timings(10, 100))
    off = Config(cache=CacheConfig(forensics=False))
    toy = ToyServer()
    body = body_of(session, off)
    (plain,) = CacheForensics().losses(session, toy_runtime(toy, off), body, earlier, usage)
    assert isinstance(plain, CacheLoss)
    assert (plain.expected, plain.reused, plain.cause, plain.detail) == (100, 10, None, None)
    with use_cassette(tmp_path / "c.yaml", "all"):  # a cassette refuses the side requests
        (paused,) = CacheForensics().losses(session, toy_runtime(toy), body, earlier, usage)
    assert (paused.cause, paused.detail) == (None, None)
    assert toy.paths == []
    broken = ToyServer(fail="/tokenize")
    (failed,) = CacheForensics().losses(session, toy_runtime(broken), body, earlier, usage)
    assert (failed.expected, failed.reused, failed.cause, failed.position) == (100, 10, None, None)
    assert failed.detail is not None and failed.detail.startswith(
        "forensics failed: POST /tokenize: HTTP 500"
    )
    fake = Runtime(config=Config(), client=ScriptedClient([]), registry=Registry())
    (no_server,) = CacheForensics().losses(session, fake, body, earlier, usage)
    assert no_server.detail == "no server to ask: not a boxmaker Client" and no_server.cause is None


def test_the_cache_rule_is_pure_and_gives_the_record_without_a_cause() -> None:
    earlier = Usage(timings=timings(0, 100))
    assert cache_loss(earlier, Usage(timings=timings(100, 5))) is None  # a hit
    assert cache_loss(None, Usage(timings=timings(0, 5))) is None  # the first completion
    assert cache_loss(earlier, Usage(timings={})) is None  # no timings
    new = Usage(timings=timings(10, 100))
    loss = cache_loss(earlier, new)
    assert loss is not None and loss.cause is None
    # both quantities of a loss, by the one rule the loop and the tap call (issue 34)
    again = reprocessed(earlier.timings, new.timings)
    assert again is not None
    assert loss == CacheLoss(
        expected=100, reused=10, reprocessed=again[0], reprocessed_ms=again[1], time=loss.time
    )
    # the reply re-processed while the prompt held is no loss by this rule (the tap's slack
    # rule logged one with reused >= expected, against the frames' definition)
    held = Usage(timings={"cache_n": 0, "prompt_n": 100, "predicted_n": 50})
    assert cache_loss(held, Usage(timings={"cache_n": 100, "prompt_n": 60})) is None


def test_side_requests_go_through_the_client_and_a_cassette_refuses_them(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"default_generation_settings": {"n_ctx": 512}})

    config = ClientConfig(url="http://llama.test", api_key="k")
    with Client(config, transport=httpx.MockTransport(handler)) as client:
        assert not hasattr(client, "transport")  # no public transport: forensics asks the client
        server = TemplateServer.of(client)
        assert server is not None and server.n_ctx() == 512
        assert seen[0].headers["authorization"] == "Bearer k"
        assert seen[0].extensions[SIDE_REQUEST] is True
        with use_cassette(tmp_path / "c.yaml", "all"), pytest.raises(InferError) as caught:
            client.server_json("GET", "/props", timeout_s=1.0)
    assert len(seen) == 1 and refused(caught.value) and caught.value.status == 503


def test_template_server_reads_byte_pieces_and_refuses_odd_answers() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            return httpx.Response(
                200, json={"tokens": [{"id": 5, "piece": [0xC3, 0xA9]}, {"id": 6, "piece": [0xC3]}]}
            )
        return httpx.Response(200, json={"nothing": 1})

    server = TemplateServer("http://llama.test", transport=httpx.MockTransport(handler))
    assert server.tokenize("x", add_special=False) == TokenizedText(
        ids=(5, 6), pieces=("é", "\ufffd")
    )
    assert server.n_ctx() is None
    with pytest.raises(Exception, match="no 'prompt' string"):
        server.render(SentRequest(messages=({"role": "user", "content": "q"},)))


def test_explain_log_explains_each_loss_of_a_log_made_earlier(tmp_path: Path) -> None:
    session, config = two_turns(tmp_path), Config()
    old = request_text(session, 4, config)
    at = 1 + len(request_text(session, 2, config)) + 1
    session.extend(
        [
            Assistant(content="done"),
            Usage(timings=timings(at, 50)),
            CacheLoss(expected=1 + len(old), reused=at),
        ]
    )
    session.close()
    toy = ToyServer()
    (explained,) = explain_log(
        session.path, "http://llama.test", transport=httpx.MockTransport(toy.handler)
    )
    assert (explained.request, explained.lost_tokens) == (3, 1 + len(old) - at)
    assert explained.found is not None and explained.error is None
    assert (explained.found.cause, explained.found.position) == ("history_rewritten", at)
    assert explained.to_json()["cause"] == "history_rewritten"
    assert explained.to_json()["reprocessed_tokens"] is None  # the record does not say
    assert set(explained.to_json()) == {
        "request",
        "expected",
        "reused",
        "lost_tokens",
        "reprocessed_tokens",
        "position",
        "cause",
        "old_window",
        "new_window",
        "detail",
        "error",
        "rebuilt_tokens",
        "prompt_tokens",
    }
    # the prompt rebuilt from the log, against what the server counted of it
    assert explained.rebuilt_tokens is not None and explained.prompt_tokens is not None
    # (this log's timings are made up: the server "counted" at + 50 of a longer prompt)
    assert explained.prompt_tokens == at + 50 < explained.rebuilt_tokens
    assert explained.settings_differ
    broken = ToyServer(fail="/apply-template")
    (failed,) = explain_log(
        session.path, "http://llama.test", transport=httpx.MockTransport(broken.handler)
    )
    assert failed.found is None and failed.error is not None and "HTTP 500" in failed.error
    assert failed.to_json()["cause"] is None


def test_explain_log_stops_asking_a_server_that_does_not_answer(tmp_path: Path) -> None:
    """A hung server costs one timeout, not one per loss of a long log."""
    session, config = two_turns(tmp_path), Config()
    old = request_text(session, 4, config)
    at = 1 + len(request_text(session, 2, config)) + 1
    loss = CacheLoss(expected=1 + len(old), reused=at)
    session.extend([Assistant(content="done"), Usage(timings=timings(at, 50)), loss])
    again = CacheLoss(expected=1 + len(old), reused=at)  # its own record (a time of its own)
    session.extend([Assistant(content="more"), Usage(timings=timings(at, 60)), again])
    session.close()
    asked: list[str] = []

    def hung(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        raise httpx.ReadTimeout("timed out", request=request)

    first, second = explain_log(
        session.path, "http://llama.test", transport=httpx.MockTransport(hung)
    )
    assert len(asked) == 1
    assert first.error is not None and "ReadTimeout" in first.error
    assert second.error is not None and second.error.startswith("not asked: the server did not")
    assert (second.request, second.found) == (4, None)


def test_explain_log_says_when_a_loss_has_no_earlier_completion(tmp_path: Path) -> None:
    session = Session.create(tmp_path, Baseline())
    session.extend(
        [
            User(content="q"),
            Assistant(content="a"),
            Usage(timings=timings(0, 9)),
            CacheLoss(expected=5, reused=0),
        ]
    )
    session.close()
    (explained,) = explain_log(
        session.path, "http://llama.test", transport=httpx.MockTransport(ToyServer().handler)
    )
    assert (explained.request, explained.found, explained.error) == (
        1,
        None,
        "no earlier completion in the log",
    )


def test_the_console_says_the_cause_of_a_loss() -> None:
    out = io.StringIO()
    view = ConsoleView(out)
    view(CacheLoss(expected=777, reused=571, position=571, cause="history_rewritten"))
    view.end()
    assert (
        "[cache loss: 571 of 777 cached prompt tokens reused, history_rewritten at token 571]"
        in (out.getvalue())
    )


def test_a_stale_remembered_request_gives_way_to_the_log(tmp_path: Path) -> None:
    session, toy, config = two_turns(tmp_path), ToyServer(), Config()
    forensics, runtime = CacheForensics(), toy_runtime(toy, config)
    stale = {"messages": [{"role": "user", "content": "from another runtime"}], "tools": []}
    assert forensics.losses(session, runtime, stale, None, Usage(timings=timings(0, 9))) == []
    expected = 1 + len(request_text(session, 4, config))
    at = 1 + len(request_text(session, 2, config)) + 1
    earlier = Usage(timings=timings(0, expected, 10))
    body = body_of(session, config)
    (loss,) = forensics.losses(session, runtime, body, earlier, Usage(timings=timings(at, 20)))
    assert (loss.cause, loss.position) == ("history_rewritten", at)


ids = st.lists(st.integers(0, 3), max_size=12)


@given(ids, ids, ids, st.integers(0, 20), st.integers(0, 20), st.booleans())
def test_any_loss_gets_a_known_cause_at_the_first_divergence(
    old: list[int], gen: list[int], new: list[int], expected: int, reused: int, edited: bool
) -> None:
    def t(xs: list[int]) -> TokenizedText:
        return TokenizedText(ids=tuple(xs), pieces=tuple(str(x) for x in xs))

    found = classify_loss(
        expected=expected,
        reused=reused,
        old_prompt=t(old),
        generated=t(gen),
        new_prompt=t(new),
        edited="the tools changed" if edited else None,
        held_tokens=len(old) + len(gen),
        n_ctx=8,
    )
    assert found.cause in CAUSES
    assert found.position == first_divergence(old + gen, new)
    if len(old) != expected:
        assert found.cause == "unknown"
    elif reused < min(found.position, expected):
        assert found.cause == ("truncated" if len(old) + len(gen) >= 8 else "evicted")
    else:
        assert found.cause == ("history_edited" if edited else "history_rewritten")


def test_a_reply_with_tool_calls_is_rendered_in_a_form_the_server_accepts() -> None:
    """Issue 22 section 3: after a cancelled turn llama.cpp answered the re-render of the
    slot (the prompt, then the reply with its tool calls as the last message) with HTTP 400
    "Cannot continue an assistant message that contains tool calls.": ``cache explain``
    exited 1 and the report said "not explained"."""
    toy = ToyServer(refuse_continue=True)
    server = TemplateServer("http://llama.test", transport=httpx.MockTransport(toy.handler))
    asked = ({"role": "system", "content": "sys"}, {"role": "user", "content": "weather?"})
    old = SentRequest(messages=asked, tools=TOOLS)
    result = {"role": "tool", "tool_call_id": "c1", "content": "{}"}
    reply = {**(message_of(A1) or {}), "content": ""}
    new = SentRequest(messages=(*asked, reply, result), tools=TOOLS)
    expected = 1 + len(ToyServer.render({"messages": list(asked), "tools": list(TOOLS)}))
    found = explain_loss(server, old=old, reply=A1, new=new, expected=expected, reused=3)
    assert found.cause == "evicted" and found.position is not None
    assert "rendered before an empty user message" in found.detail
    assert found.old_window is not None and "boxmaker-reply-end" not in found.old_window
    assert toy.paths.count("/apply-template") == 4 and len(toy.paths) <= 8  # MAX_REQUESTS


def test_what_the_server_reprocessed_counts_the_reply_it_held() -> None:
    """Issue 24, measured on Gemma 3 270M (window 512): a prompt of 30 tokens and a reply of
    270, then 25 reused and 297 processed in 3.2 s. ``expected - reused`` said 5 tokens (53
    ms); the server re-processed 274 of what its slot held: the reply's last token was sampled
    and never entered the cache (issue 34: the count ran 1 token high)."""
    previous = {"cache_n": 0, "prompt_n": 30, "predicted_n": 270, "prompt_ms": 300.0}
    new = {"cache_n": 25, "prompt_n": 297, "prompt_ms": 3200.0}
    tokens, ms = reprocessed(previous, new) or (0, None)
    assert tokens == 274 and ms == pytest.approx(3200 * 274 / 297)
    # a one-token reply left only the prompt in the slot; no reply, the same
    for predicted in (0, 1):
        only_prompt = {**previous, "predicted_n": predicted}
        got = reprocessed(only_prompt, new)
        assert got is not None and got[0] == 5 and got[1] == pytest.approx(3200 * 5 / 297)
    assert reprocessed(previous, {**new, "prompt_n": 0}) == (0, None)
    assert reprocessed({"cache_n": 0}, new) is None
    # more reused than the slot held (the cross-request prompt cache): nothing re-processed
    assert reprocessed(previous, {"cache_n": 400, "prompt_n": 5, "prompt_ms": 1.0}) == (0, 0.0)


def test_every_cause_has_its_remedy() -> None:
    assert set(REMEDIES) == set(CAUSES)
    assert all(REMEDIES[c] for c in CAUSES)


@pytest.mark.parametrize(
    ("extra", "cause", "said"),
    [
        ({"n_slots": 4, "n_swa": 0}, "idle_slot_cleared", "--no-cache-idle-slots"),
        ({"n_slots": 1, "n_swa": 0}, "slept", "--sleep-idle-seconds"),
        # a sliding window: another prompt that shares less than its first checkpoint is
        # processed whole (Gemma 3: 0 reused), not told apart from an emptied slot
        ({"n_slots": 4, "n_swa": 512}, "checkpoint", "may also have been emptied"),
        ({"n_slots": 4}, "evicted", "may also have been emptied"),  # n_swa not known
        ({"n_slots": 4, "restored": True}, "restore_cold", "restored slot was not used"),
        ({"n_slots": 4, "restored": True, "reused": 3}, "evicted", "the server reused 3"),
        ({"swapped": "the session ran on a, the server now serves b"}, "model_swapped",
         "one model per server"),
    ],
)  # fmt: skip
def test_a_slot_emptied_a_restore_unused_or_another_model_is_named_with_its_remedy(
    extra: dict[str, Any], cause: str, said: str
) -> None:
    found = classify_loss(
        **{"reused": 0, **extra},
        expected=4,
        old_prompt=toks("abcd"),
        generated=toks("ef"),
        new_prompt=toks("abcdefg"),
        edited=None,
    )
    assert found.cause == cause and said in found.detail
    assert found.cause in CAUSES


def test_a_model_swapped_is_named_even_when_the_old_prompt_renders_otherwise() -> None:
    found = classify_loss(expected=10, reused=0, old_prompt=toks("abcd"), generated=toks(""),
                          new_prompt=toks("abXd"), edited=None, swapped="a to b")  # fmt: skip
    assert found.cause == "model_swapped"
    partly = classify_loss(expected=4, reused=2, old_prompt=toks("abcd"), generated=toks(""),
                           new_prompt=toks("abcdx"), edited=None, n_slots=4, n_swa=0)  # fmt: skip
    assert partly.cause == "evicted"  # two tokens reused: another prompt, not an empty slot
