"""The spans in a receiver researchers use: MLflow's tracking server (from PyPI, started here
on 127.0.0.1 with a SQLite store, offline) takes them over OTLP/HTTP, and its own client reads
them back: span names, parent links and token counts equal to the frames'."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from extras import need

from boxmaker import frames
from boxmaker.export import export_otel

pytestmark = pytest.mark.live
need("mlflow")
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def mlflow_url(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with (tmp_path / "mlflow.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers",
             "1", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
             "--default-artifact-root", str(tmp_path / "artifacts")],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # a cold MLflow import takes about a minute here
        while True:
            assert proc.poll() is None, (tmp_path / "mlflow.log").read_text()[-2000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "MLflow did not start"
            time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_mlflow_reads_back_the_spans(mlflow_url: str, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for p in [
        *(ROOT / "tests" / "data").glob("schema-*.jsonl"),
        ROOT / "cassettes" / "demo-turns.session.jsonl",
    ]:
        shutil.copy(p, logs / p.name)  # fmt: skip
    with warnings.catch_warnings():  # MLflow's own import-time deprecations are not ours
        warnings.simplefilter("ignore")
        from mlflow import MlflowClient

        client = MlflowClient(mlflow_url)
        experiment = client.create_experiment("boxmaker")
    n = export_otel(
        logs,
        endpoint=f"{mlflow_url}/v1/traces",
        headers={"x-mlflow-experiment-id": experiment},
        timeout=120,
    )
    loaded = frames.load(logs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traces = client.search_traces(locations=[experiment], max_results=100)
    assert len(traces) == (~loaded.turns.from_parent).sum()  # a trace per turn, a fork's own
    spans = [s for t in traces for s in t.data.spans]
    assert len(spans) == n
    inputs = outputs = 0
    for trace in traces:
        roots = [s for s in trace.data.spans if s.parent_id is None]
        assert [r.name for r in roots] == ["invoke_agent boxmaker"]
        for s in trace.data.spans:
            if s is roots[0]:
                continue
            assert s.parent_id == roots[0].span_id
            assert s.name.startswith(("chat ", "execute_tool "))
            attrs: dict[str, Any] = s.attributes
            inputs += int(attrs.get("gen_ai.usage.input_tokens", 0))
            outputs += int(attrs.get("gen_ai.usage.output_tokens", 0))
        session = roots[0].attributes["gen_ai.conversation.id"]
        assert session in set(loaded.turns.session)
    req = loaded.requests
    in_turns = req[req.turn.notna() & ~req.from_parent]
    assert inputs == in_turns.prompt_tokens.sum()
    assert outputs == in_turns.generated_tokens.sum()
