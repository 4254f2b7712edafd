"""boxmaker export parquet: every frame as Parquet, the frames' names, dtypes and units; the
conversations in messages.parquet; a dataset card; a folder ``datasets.load_dataset`` loads."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from extras import ENGINES, need
from pandas.testing import assert_frame_equal

from boxmaker import frames
from boxmaker.cli import main
from boxmaker.export import write_parquet
from boxmaker.records import Assistant, Baseline, Capabilities, TurnEnd, Usage, User
from boxmaker.session import Session

pq = need("pyarrow.parquet")
DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize("engine", ENGINES)
def test_every_frame_reads_back_equal_with_units(tmp_path: Path, engine: str) -> None:
    written = write_parquet(DATA, tmp_path / "out", engine=engine)
    assert list(written) == [*frames.Frames._fields, "messages", "README"]
    loaded = frames.load(DATA)
    for name in frames.Frames._fields:
        path = written[name]
        table = pq.read_table(path)
        want = getattr(loaded, name)
        got = table.to_pandas()
        assert list(got.columns) == [c.name for c in frames.COLUMNS[name]]
        # an empty category set reads back with object categories: dtypes compared by name
        assert [str(d) for d in got.dtypes] == [str(d) for d in want.dtypes]
        assert_frame_equal(
            got, want, check_exact=False, rtol=1e-9, check_dtype=False, check_categorical=False
        )
        field = table.schema.field(want.columns[-1])
        spec = frames.COLUMNS[name][-1]
        assert field.metadata[b"unit"].decode() == spec.unit
        assert field.metadata[b"doc"].decode() == spec.doc
        units = json.loads(table.schema.metadata[b"boxmaker.units"])
        assert units == {c.name: c.unit for c in frames.COLUMNS[name]}
    requests = pq.read_table(written["requests"]).to_pandas()
    assert requests.cached_tokens.dtype == pd.Int64Dtype()
    assert str(requests.time.dtype) == "datetime64[ns, UTC]"


def test_the_command_writes_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "parquet", str(DATA), "--out", str(tmp_path / "pq")]) == 0
    assert sorted(p.name for p in (tmp_path / "pq").iterdir()) == sorted(
        [*(f"{n}.parquet" for n in frames.Frames._fields), "messages.parquet", "README.md"]
    )
    assert "summary.parquet" in capsys.readouterr().out


def _sessions_with_a_model_and_unknown_usage(folder: Path) -> None:
    """Two logs beside the test data: one whose server said its model (a Capabilities record)
    and one whose completion's usage the server did not send."""
    with Session.create(folder, Baseline(system="be brief"), session_id="known") as s:
        s.append(Capabilities(model="tiny-agent", n_ctx=4096, slots=1))
        s.extend([User(content="hi"), Assistant(content="yo", reasoning="think")])
        s.append(Usage(timings={"cache_n": 0, "prompt_n": 12, "predicted_n": 3}))
        s.append(TurnEnd(outcome="answered"))
    with Session.create(folder, session_id="unknown") as s:
        s.extend([User(content="hi"), Assistant(content="yo"), Usage()])
        s.append(TurnEnd(outcome="answered"))


def test_the_folder_is_a_dataset_that_datasets_loads(tmp_path: Path) -> None:
    datasets = need("datasets")
    logs = tmp_path / "logs"
    shutil.copytree(DATA, logs)
    _sessions_with_a_model_and_unknown_usage(logs)
    out = tmp_path / "dataset"
    write_parquet(logs, out)
    cache = str(tmp_path / "hf-cache")
    loaded = frames.load(logs)
    for name in frames.Frames._fields:
        files = {"train": str(out / f"{name}.parquet")}
        got = datasets.load_dataset("parquet", data_files=files, cache_dir=cache)["train"]
        assert got.column_names == [c.name for c in frames.COLUMNS[name]]
        assert got.num_rows == len(getattr(loaded, name))
    turns = datasets.load_dataset(str(out), "turns", cache_dir=cache)["train"]  # the card's configs
    assert turns.num_rows == len(loaded.turns)
    summary = datasets.load_dataset(str(out), "summary", cache_dir=cache)["train"].to_pandas()
    by_session = summary.set_index("session")
    assert pd.isna(by_session.loc["unknown", "prompt_tokens"])  # unknown: null, never 0
    assert by_session.loc["known", "prompt_tokens"] == 12
    messages = datasets.load_dataset(str(out), cache_dir=cache)["train"]  # the default config
    rows = {row["session"]: row for row in messages}
    assert set(rows) == set(loaded.summary.session.astype(str))
    for session_id, row in rows.items():
        with Session.open(logs / f"{session_id}.jsonl", read_only=True) as session:
            sent = session.messages()
            assert json.loads(row["tools"]) == [dict(t) for t in session.baseline.tools]
        got = [{k: v for k, v in m.items() if v is not None and k != "from_parent"}
               for m in row["messages"]]  # fmt: skip
        assert got == sent
    fork = rows["schema-4"]
    copied = [m["from_parent"] for m in fork["messages"]]
    assert fork["parent_session"] == "schema-3" and fork["copied_messages"] == sum(copied) > 0
    assert copied == sorted(copied, reverse=True)  # the copies come first
    assert rows["known"]["messages"][0] == {
        "role": "system",
        "content": "be brief",
        "reasoning_content": None,
        "tool_calls": None,
        "tool_call_id": None,
        "from_parent": False,
    }


def test_the_dataset_card_says_features_units_server_and_what_is_unknown(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    _sessions_with_a_model_and_unknown_usage(logs)
    card = write_parquet(logs, tmp_path / "out")["README"].read_text()
    head, body = card.split("---\n")[1], card.split("---\n", 2)[2]
    front = yaml.safe_load(head)
    assert [c["config_name"] for c in front["configs"]] == ["messages", *frames.Frames._fields]
    assert front["configs"][0] == {
        "config_name": "messages",
        "data_files": "messages.parquet",
        "default": True,
    }
    assert "2 session(s) (0 of them forks), 2 turn(s), 2 completion(s)" in body
    assert "- `tiny-agent, n_ctx 4096, 1 slot(s)`: 1 session(s)" in body
    assert "- not recorded: 1 session(s)" in body
    assert "| `cached_tokens` | Int64 | tokens |" in body
    assert "| requests | `cached_tokens` | 1 | 2 |" in body  # the completion without usage
    assert ":mod:" not in body and re.search(r"(?<!`)``(?!`)", body) is None  # Markdown, not RST
