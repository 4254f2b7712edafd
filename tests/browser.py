"""Shared by the real-browser tests: Debian's headless Chromium driven over the DevTools
protocol (websocket-client), free ports on 127.0.0.1, and Jupyter servers started for one test
and always stopped. Skipped where ``/usr/bin/chromium`` is absent (``bash .ci/setup-browser``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import websocket  # websocket-client, installed with jupyter_server

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def server_env() -> dict[str, str]:
    """The environment for a Jupyter server and its kernels: this checkout's ``boxmaker``
    first on the path, platform dirs for Jupyter's files."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "JUPYTER_PLATFORM_DIRS": "1", "PYTHONPATH": path}


@contextlib.contextmanager
def running(command: list[str], port: int, log: Path, cwd: Path) -> Iterator[None]:
    """Run ``command`` until the block ends (terminated, killed if it lingers); waits until
    it listens on ``port`` (a socket connect: a GET could start a kernel)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=server_env()
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"{command[2]} did not start:\n" + log.read_text())
                time.sleep(0.2)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


class DevTools:
    """A minimal Chrome DevTools protocol client over one page's websocket."""

    def __init__(self, ws_url: str) -> None:
        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    def js(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(f"!!({expression})")  # a DOM node is not returned by value
            if value:
                return value
            if time.monotonic() > deadline:
                text = self.js("document.body ? document.body.innerText : ''")
                raise AssertionError(f"timed out waiting for {expression}; page text:\n{text}")
            time.sleep(0.25)

    def key(self, key: str, code: int, modifiers: int = 0, text: str = "") -> None:
        for kind in ("keyDown", "keyUp"):
            params: dict[str, Any] = {
                "type": kind,
                "key": key,
                "code": key,
                "windowsVirtualKeyCode": code,
                "nativeVirtualKeyCode": code,
                "modifiers": modifiers,
            }
            if kind == "keyDown" and text:
                params["text"] = text
            self.call("Input.dispatchKeyEvent", **params)

    def close(self) -> None:
        self.ws.close()


@contextlib.contextmanager
def chromium(tmp_path: Path) -> Iterator[DevTools]:
    """A headless Chromium with its own profile in ``tmp_path``, on one blank page; stopped
    when the block ends."""
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    log = (tmp_path / "chromium.log").open("wb")  # closed when the browser stops
    proc = subprocess.Popen(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--window-size=1200,1600",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    "chromium did not start:\n" + (tmp_path / "chromium.log").read_text()
                )
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
        page = next(t for t in targets if t["type"] == "page")
        tools = DevTools(page["webSocketDebuggerUrl"])
        try:
            yield tools
        finally:
            tools.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(profile, ignore_errors=True)
