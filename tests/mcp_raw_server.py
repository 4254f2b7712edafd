"""A hand-written MCP server over stdio that breaks the protocol on ``tools/call`` (issue 23).

Run as ``python mcp_raw_server.py FAULT``: it answers ``initialize`` and ``tools/list`` (a tool
``echo`` and one whose name no registry takes, ``bad name!``), then on a call writes, by
``FAULT``: ``not_json`` a line that is not JSON, ``wrong_id`` a well-formed answer to a request
never sent, ``half_line`` the first half of an answer's line (anything else: nothing); then it
says nothing for a minute.
"""

from __future__ import annotations

import json
import sys
import time

FAULT = sys.argv[1]


def send(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    msg = json.loads(line)
    method, mid = msg.get("method"), msg.get("id")
    if mid is None:
        continue
    if method == "initialize":
        version = msg["params"]["protocolVersion"]
        info = {"name": "raw", "version": "1"}
        result = {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info}
    elif method == "tools/list":
        schema = {"type": "object"}
        tools = [
            {"name": "echo", "inputSchema": schema},
            {"name": "bad name!", "inputSchema": schema},
        ]
        result = {"tools": tools}
    elif method == "tools/call":
        answer = {"jsonrpc": "2.0", "id": mid, "result": {"content": []}}
        if FAULT == "not_json":
            sys.stdout.write("this is not json\n")
        elif FAULT == "wrong_id":
            send({**answer, "id": mid + 1000})
        elif FAULT == "half_line":
            line = json.dumps(answer)
            sys.stdout.write(line[: len(line) // 2])
        sys.stdout.flush()
        time.sleep(60)
        continue
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no such method"}})
        continue
    send({"jsonrpc": "2.0", "id": mid, "result": result})
