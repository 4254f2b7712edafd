"""Kill ``boxmaker tap`` under load, again and again, and count what its logs lost.

Each round starts a stand-in llama-server (a socket server in this process answering every
chat request with a short llama.cpp stream, :class:`boxmaker.testing.Reply`) and a tap in a
process of its own (``python -m boxmaker.cli tap --upstream ... --port 0 --no-forensics``),
then ``--agents`` agent threads that each hold a conversation through the tap (a new user
message a request, the replies sent back, a new conversation every ``--turns`` requests),
noting when each answer was whole in their hands. After a random 1.5-4 s the tap gets the
round's signal (``--kills`` rounds of SIGKILL, then one round for each of ``--signals``):

- ``SIGKILL``: every exchange answered more than ``--bound`` seconds before the kill must be
  in the logs (the tap's promise, :data:`boxmaker.tap.LOG_WITHIN_S`); what the logs hold must
  be whole (each logged request's user message with its answer and turn end: no group in
  part);
- ``SIGTERM``, ``SIGHUP``, ``SIGINT``: the tap flushes before it exits; every exchange
  answered before the signal must be in the logs, and the tap must exit 0.

The logs are read as boxmaker reads them (:class:`boxmaker.session.Session`, a torn last
group dropped). The last line printed is::

    answered N logged M lost L partial P oldest_unlogged_s X slowest_written_s Y

``lost``: answered more than the bound before a kill (or before a catchable signal at all)
and not logged; ``oldest_unlogged_s``: the age, at the kill, of the oldest answered exchange
missing from the logs (0 when none: the measured bound, from outside);
``slowest_written_s``: the tap's own figure, printed when a catchable signal stopped it: the
longest time from an answer's end to its exchange's fsync (0 when every round was a
SIGKILL). Exit status 1 when anything was lost or a group was read in part.

    python scripts/tap_kill_test.py              # 30 SIGKILLs, then SIGTERM, SIGHUP, SIGINT
    python scripts/tap_kill_test.py --kills 2 --signals SIGTERM,SIGHUP   # the quick suite's
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from boxmaker.records import Assistant, TurnEnd, User
from boxmaker.session import Session
from boxmaker.testing import Reply, Stall

CHAT = "/v1/chat/completions"


class Upstream:
    """The stand-in llama-server: each request on a connection of its own, answered with a
    short stream (``Connection: close``), a thread per connection."""

    def __init__(self) -> None:
        steps = Reply(content="Sunny, 21 C.").steps()
        self.answer = b"".join(s for s in steps if not isinstance(s, Stall))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    piece = conn.recv(65536)
                    if not piece:
                        return
                    data += piece
                head, _, body = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(body) < length:
                    piece = conn.recv(65536)
                    if not piece:
                        return
                    body += piece
                conn.sendall(self.answer)
            except OSError:
                return

    def close(self) -> None:
        """Stop accepting."""
        self.listener.close()


@dataclass
class Round:
    """What one round's agents saw: each request's user text and when its answer was whole
    (``time.monotonic()``)."""

    answered: dict[str, float] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


def agent(url: str, name: str, turns: int, state: Round) -> None:
    """Hold conversations through the tap until it goes away or the round stops."""
    system: dict[str, object] = {"role": "system", "content": "You are terse."}
    with httpx.Client(base_url=url, timeout=30) as client:
        conversation = 0
        while not state.stop.is_set():
            messages: list[dict[str, object]] = [system]
            conversation += 1
            for turn in range(turns):
                text = f"{name}-c{conversation}-t{turn}"
                messages.append({"role": "user", "content": text})
                body = {"messages": messages, "stream": True}
                try:
                    answer = client.post(CHAT, json=body)
                except httpx.HTTPError:
                    return  # the tap is gone
                if answer.status_code != 200 or b"data: [DONE]" not in answer.content:
                    return
                with state.lock:
                    state.answered[text] = time.monotonic()
                messages.append({"role": "assistant", "content": "Sunny, 21 C."})
                if state.stop.is_set():
                    return


def start_tap(upstream: str, folder: Path) -> tuple[subprocess.Popen[str], str]:
    """``boxmaker tap`` in a process of its own; its URL from its first line."""
    command = [sys.executable, "-m", "boxmaker.cli", "tap", "--upstream", upstream,
               "--port", "0", "--dir", str(folder), "--no-forensics"]  # fmt: skip
    tap = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert tap.stdout is not None
    head = tap.stdout.readline()
    if not head.startswith("boxmaker tap: listening on "):
        tap.kill()
        raise SystemExit(f"the tap did not start: {head!r} {tap.communicate()[1]}")
    return tap, head.split()[4]


def read_logs(folder: Path) -> tuple[set[str], int]:
    """The user texts the logs hold, and how many logged requests are not whole (a user
    message without its answer and turn end)."""
    found: set[str] = set()
    partial = 0
    for path in sorted(folder.glob("*.jsonl")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a torn last group is dropped, as every reader does
            session = Session.open(path, read_only=True)
        records = session.records
        starts = [i for i, r in enumerate(records) if isinstance(r, User)]
        for i, end in zip(starts, [*starts[1:], len(records)][: len(starts)], strict=True):
            user = records[i]
            assert isinstance(user, User)
            found.add(user.content)
            group = records[i + 1 : end]
            whole = bool(group) and isinstance(group[0], Assistant)
            partial += not (whole and isinstance(group[-1], TurnEnd))
    return found, partial


def main(argv: list[str] | None = None) -> int:
    """Run the rounds; print one line per round and the summary line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=30, help="rounds (default 30)")
    parser.add_argument("--agents", type=int, default=8, help="agents at once (default 8)")
    parser.add_argument("--turns", type=int, default=12, help="requests a conversation")
    parser.add_argument("--bound", type=float, default=1.0, help="seconds (default 1.0)")
    parser.add_argument(
        "--signals",
        default="SIGTERM,SIGHUP,SIGINT",
        help="catchable signals, one round each after the kills (default SIGTERM,SIGHUP,SIGINT;"
        " '' for none)",
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    then = [signal.Signals[name.strip()] for name in args.signals.split(",") if name.strip()]
    rounds = [signal.SIGKILL] * args.kills + then
    answered = logged = lost = partial = 0
    oldest = slowest = 0.0
    upstream = Upstream()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for round_, sig in enumerate(rounds):
                folder = Path(tmp) / f"round-{round_}"
                tap, url = start_tap(upstream.url, folder)
                state = Round()
                agents = [
                    threading.Thread(target=agent, args=(url, f"r{round_}a{i}", args.turns, state))
                    for i in range(args.agents)
                ]
                for thread in agents:
                    thread.start()
                time.sleep(rng.uniform(1.5, 4.0))
                with state.lock:
                    at = time.monotonic()
                    os.kill(tap.pid, sig)
                    before = dict(state.answered)
                if sig != signal.SIGKILL:
                    state.stop.set()
                out, err = tap.communicate(timeout=120)
                said = [line for line in out.splitlines() if " exchange(s) written, " in line]
                if said:  # the tap's own figure: its slowest exchange, answer to fsync
                    slowest = max(slowest, float(said[-1].split()[5]))
                state.stop.set()
                for thread in agents:
                    thread.join(timeout=60)
                if sig != signal.SIGKILL and tap.returncode != 0:
                    raise SystemExit(f"round {round_}: the tap exited {tap.returncode}: {err}")
                found, broken = read_logs(folder)
                missing = {t: at - when for t, when in before.items() if t not in found}
                bound = args.bound if sig == signal.SIGKILL else 0.0
                round_lost = sum(age > bound for age in missing.values())
                round_oldest = max(missing.values(), default=0.0)
                answered += len(before)
                logged += len(found)
                lost += round_lost
                partial += broken
                oldest = max(oldest, round_oldest)
                print(
                    f"round {round_ + 1} {sig.name}: answered {len(before)} logged {len(found)} "
                    f"unlogged {len(missing)} (oldest {round_oldest:.3f} s) lost {round_lost} "
                    f"partial {broken}",
                    flush=True,
                )
    finally:
        upstream.close()
    print(
        f"answered {answered} logged {logged} lost {lost} partial {partial} "
        f"oldest_unlogged_s {oldest:.3f} slowest_written_s {slowest:.3f}"
    )
    return 1 if lost or partial else 0


if __name__ == "__main__":
    raise SystemExit(main())
