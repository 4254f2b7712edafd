"""A hand-written MCP server over stdio that breaks the protocol on ``tools/call`` (issue 23).

Run as ``python mcp_raw_server.py FAULT``: it answers ``initialize`` and ``tools/list`` (a tool
``echo``, described as ``pid N`` with its process id, and one whose name no registry takes,
``bad name!``), then on a call writes, by ``FAULT``: ``not_json`` a line that is not JSON,
``wrong_id`` a well-formed answer to a request never sent, ``half_line`` the first half of an
answer's line, ``huge_line`` an answer of one 64 MB line (anything else: nothing); then it
says nothing for a minute. ``half_exit``
writes half a line and exits; ``half_start`` writes half of its answer to ``initialize`` and
says nothing. Two faults answer the call: ``slow_steady`` writes the answer (text ``slow``)
one byte every 30 ms, and ``stubborn`` answers at once but ignores SIGTERM and the end of its
stdin, as does a child it starts (the description says ``pid N child M``): only SIGKILL to
the group ends them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

FAULT = sys.argv[1]
DRIBBLE_S = 0.03
"""Seconds between two bytes of ``slow_steady``'s answer."""
HUGE_MB = 64
"""Megabytes of the text in ``huge_line``'s answer (one line)."""

description = f"pid {os.getpid()}"
if FAULT == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(  # a grandchild of the client, in the server's process group
        [sys.executable, "-c", "import signal, time; signal.signal(15, 1); time.sleep(60)"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    description += f" child {child.pid}"


def send(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    msg = json.loads(line)
    method, mid = msg.get("method"), msg.get("id")
    if mid is None:
        continue
    if method == "initialize" and FAULT == "half_start":
        sys.stdout.write('{"jsonrpc": "2.0", "id": ')
        sys.stdout.flush()
        time.sleep(60)
    if method == "initialize":
        version = msg["params"]["protocolVersion"]
        info = {"name": "raw", "version": "1"}
        result = {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info}
    elif method == "tools/list":
        schema = {"type": "object"}
        tools = [
            {"name": "echo", "description": description, "inputSchema": schema},
            {"name": "bad name!", "inputSchema": schema},
        ]
        result = {"tools": tools}
    elif method == "tools/call":
        answer = {"jsonrpc": "2.0", "id": mid, "result": {"content": []}}
        if FAULT in ("slow_steady", "stubborn"):
            text = [{"type": "text", "text": "slow" if FAULT == "slow_steady" else "done"}]
            line = json.dumps({**answer, "result": {"content": text}}) + "\n"
            for char in line if FAULT == "slow_steady" else [line]:
                sys.stdout.write(char)
                sys.stdout.flush()
                time.sleep(DRIBBLE_S if FAULT == "slow_steady" else 0)
            continue
        if FAULT == "not_json":
            sys.stdout.write("this is not json\n")
        elif FAULT == "wrong_id":
            send({**answer, "id": mid + 1000})
        elif FAULT == "huge_line":  # an answer line of HUGE_MB MB, written in 1 MB pieces
            line = json.dumps({**answer, "result": {"content": [{"type": "text", "text": ""}]}})
            sys.stdout.write(line[:-4])
            for _ in range(HUGE_MB):
                sys.stdout.write("x" * (1 << 20))
            sys.stdout.write(line[-4:] + "\n")
        elif FAULT in ("half_line", "half_exit"):
            line = json.dumps(answer)
            sys.stdout.write(line[: len(line) // 2])
            if FAULT == "half_exit":
                sys.stdout.flush()
                os._exit(0)
        sys.stdout.flush()
        time.sleep(60)
        continue
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no such method"}})
        continue
    send({"jsonrpc": "2.0", "id": mid, "result": result})
if FAULT == "stubborn":  # stdin has ended: stay anyway
    time.sleep(60)
