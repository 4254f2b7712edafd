"""boxmaker export inspect: a batch folder as an Inspect eval log that inspect_ai's own reader
(read_eval_log) and samples_df read: one row per run, the frames' token totals, the scores of
scores.ndjson, messages with tool calls, boxmaker's facts in metadata."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from extras import need

from boxmaker import frames
from boxmaker.cli import main

need("inspect_ai")
ROOT = Path(__file__).resolve().parents[2]
LOGS = [
    ROOT / "cassettes" / "demo-turns.session.jsonl",  # recorded from the embedded server
    ROOT / "cassettes" / "demo-thinking-cap.session.jsonl",
    *sorted((ROOT / "tests" / "data").glob("schema-*.jsonl")),
]


@pytest.fixture
def batch(tmp_path: Path) -> Path:
    folder = tmp_path / "batch"
    (folder / "logs").mkdir(parents=True)
    for p in LOGS:
        shutil.copy(p, folder / "logs" / p.name)
    (folder / "manifest.ndjson").write_text("")
    scores = [
        {"run": "schema-1", "scorer": "target", "version": "1", "value": 1.0,
         "explanation": "<b>ok</b>"},
        {"run": "schema-2", "scorer": "target", "version": "1", "value": 0.0},
        {"run": "schema-2", "scorer": "target", "version": "1", "value": None, "error": "x"},
    ]  # fmt: skip
    (folder / "scores.ndjson").write_text("".join(json.dumps(s) + "\n" for s in scores))
    return folder


def test_read_eval_log_and_samples_df_give_a_row_per_run(batch: Path, tmp_path: Path) -> None:
    out = tmp_path / "batch.eval"
    assert main(["export", "inspect", str(batch), "--out", str(out)]) == 0
    with warnings.catch_warnings():  # inspect_ai's own import-time deprecations are not ours
        warnings.simplefilter("ignore")
        from inspect_ai.analysis import samples_df
        from inspect_ai.log import read_eval_log

        log = read_eval_log(str(out))
        df = samples_df(str(out))
    summary = frames.summary(batch / "logs").set_index("session")
    assert log.samples is not None and len(log.samples) == len(summary) == len(df)
    for sample in log.samples:
        row = summary.loc[str(sample.id)]
        (usage,) = sample.model_usage.values()
        assert usage.input_tokens == row.cached_tokens + row.processed_tokens
        assert usage.output_tokens == row.generated_tokens
        assert usage.input_tokens_cache_read == row.cached_tokens
        assert sample.metadata["boxmaker_requests"] == row.requests
        assert sample.metadata["boxmaker_turns"] == row.turns
        calls = [c for m in sample.messages if m.role == "assistant" for c in m.tool_calls or ()]
        assert len(calls) == frames.requests(batch / "logs" / sample.metadata["boxmaker_log"]
                                             ).tool_calls.sum()  # fmt: skip
    by_id = {str(s.id): s for s in log.samples}
    assert by_id["schema-1"].scores is not None
    assert by_id["schema-1"].scores["target"].value == 1.0
    assert by_id["schema-1"].scores["target"].explanation == "<b>ok</b>"  # data, as written
    assert by_id["schema-2"].scores is not None and by_id["schema-2"].scores["target"].value == 0.0
    assert by_id["schema-3"].scores is None
    assert sorted(df.id.astype(str)) == sorted(summary.index)
    totals = summary.cached_tokens + summary.processed_tokens + summary.generated_tokens
    got = dict(zip(df.id.astype(str), df.total_tokens, strict=True))
    assert got == {k: int(v) for k, v in totals.items()}
    lost = dict(zip(df.id.astype(str), df.metadata_boxmaker_lost_tokens, strict=True))
    assert lost == {k: int(v) for k, v in summary.lost_tokens.items()}
