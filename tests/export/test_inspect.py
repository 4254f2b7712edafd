"""boxmaker export inspect: a batch folder as an Inspect eval log that inspect_ai's own reader
(read_eval_log) and samples_df read: one row per run, the frames' token totals, the scores of
scores.ndjson, messages with tool calls, boxmaker's facts in metadata."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

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


GRID: dict[str, list[Any]] = {"loop.thinking_tokens": [16, 64], "sampling.temperature": [0.0, 0.7]}
TASKS = {"lisbon": "34", "tokyo": "never said"}


def grid_batch(tmp_path: Path) -> Path:
    """A 2x2 grid batch of two tasks: eight runs (the recorded demo session, renamed), each
    with its setting and target in the manifest, scored by ``target`` and ``polite``."""
    folder = tmp_path / "grid"
    (folder / "logs").mkdir(parents=True)
    manifest, scores = [], []
    text = LOGS[0].read_text()
    settings = [
        {"loop.thinking_tokens": t, "sampling.temperature": s}
        for t in GRID["loop.thinking_tokens"]
        for s in GRID["sampling.temperature"]
    ]
    for n, setting in enumerate(settings):
        for task, expected in TASKS.items():
            run = f"{task}.{n:08x}"
            (folder / "logs" / f"{run}.jsonl").write_text(
                text.replace('"session_id":"demo-turns"', f'"session_id":"{run}"')
            )
            target = {"answer": {"contains": expected}}
            manifest.append(
                {
                    "time": "2026-12-01T00:00:00+00:00",
                    "run": run,
                    "state": "planned",
                    "task": task,
                    "settings": setting,
                    "messages": 2,
                    "target": target,
                }
            )
            manifest.append({"time": "2026-12-01T00:00:01+00:00", "run": run, "state": "done"})
            right = 1.0 if task == "lisbon" and setting["loop.thinking_tokens"] == 64 else 0.0
            scores.append(
                {
                    "run": run,
                    "scorer": "target",
                    "version": "1",
                    "value": right,
                    "explanation": f"looked for {expected!r}",
                }
            )
            scores.append({"run": run, "scorer": "polite", "version": "2", "value": 0.5})
    lines = "".join(json.dumps(x) + "\n" for x in manifest)  # fmt: skip
    (folder / "manifest.ndjson").write_text(lines)
    (folder / "scores.ndjson").write_text("".join(json.dumps(s) + "\n" for s in scores))
    return folder


def _read(path: Path) -> Any:
    with warnings.catch_warnings():  # inspect_ai's own import-time deprecations are not ours
        warnings.simplefilter("ignore")
        from inspect_ai.log import read_eval_log

        return read_eval_log(str(path))


def test_a_grid_batch_is_a_log_per_setting_with_targets_answers_and_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = grid_batch(tmp_path)
    out = tmp_path / "evals"
    out.mkdir()  # an existing folder: the logs go inside it (was a ValueError traceback)
    assert main(["export", "inspect", str(folder), "--out", str(out)]) == 0
    written = [Path(p) for p in capsys.readouterr().out.split()]
    assert sorted(written) == sorted(out.glob("*.eval")) and len(written) == 4
    seen = set()
    for path in written:
        log = _read(path)
        setting = log.eval.task_args
        seen.add(tuple(sorted(setting.items())))
        assert set(setting) == set(GRID)
        assert log.eval.model_args == {"sampling.temperature": setting["sampling.temperature"]}
        assert log.eval.metadata == {"boxmaker_settings": setting}
        assert "loop.thinking_tokens=" in (log.eval.task_display_name or "")
        assert log.samples is not None
        assert sorted(str(s.id) for s in log.samples) == ["lisbon", "tokyo"]
        for sample in log.samples:
            assert json.loads(sample.target) == {"answer": {"contains": TASKS[str(sample.id)]}}
            assert sample.metadata["boxmaker_settings"] == setting
            assert sample.scores is not None and set(sample.scores) == {"target", "polite"}
            assert sample.scores["target"].answer == "In Tokyo it is 21:01."  # the last answer
            assert sample.scores["target"].explanation.startswith("looked for")
        assert [s.name for s in log.eval.scorers or []] == ["target", "polite"]
        (usage,) = log.stats.model_usage.values()  # the two runs' tokens, summed
        assert usage.total_tokens == 2 * sum(
            next(iter(s.model_usage.values())).total_tokens for s in log.samples[:1]
        )
        assert log.results is not None
        result = {s.name: (s.metrics["mean"].value, s.scored_samples) for s in log.results.scores}
        lisbon_right = setting["loop.thinking_tokens"] == 64
        assert result == {"target": (0.5 if lisbon_right else 0.0, 2), "polite": (0.5, 2)}
    assert len(seen) == 4


def test_a_grid_batch_in_one_file_labels_each_sample_with_its_setting(tmp_path: Path) -> None:
    out = tmp_path / "all.eval"
    from boxmaker.export import export_inspect

    assert export_inspect(grid_batch(tmp_path), out) == out
    log = _read(out)
    assert log.samples is not None and len(log.samples) == 8
    ids = {str(s.id) for s in log.samples}
    assert "lisbon [loop.thinking_tokens=16, sampling.temperature=0.0]" in ids
    assert len(ids) == 8 and all(s.epoch == 1 for s in log.samples)
    assert log.results is not None and {s.name for s in log.results.scores} == {"target", "polite"}
