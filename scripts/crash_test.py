"""Kill an appending process at random, again and again, and count what the log lost.

Each round starts a child process that reopens one session log (taking the writer's lock) and
appends ``User`` records as fast as it can, one alone and then a group of two
(``extend([a, b])``, as the loop ends a turn) in turn, printing ``ack N`` after each append
returned. The parent lets it run for a random 0-60 ms, SIGKILLs it, and reopens the log: every
acknowledged record must be there (an append that returned was fsynced), the log must open (a
torn last line or group is dropped and set aside), and no group may be there in part (``a``
without ``b``). The last line printed is ``acked N lost M partial P``; exit status 1 when
anything acknowledged was lost or a group was read in part.

    python scripts/crash_test.py              # 200 kills
    python scripts/crash_test.py --kills 10   # the short version CI runs
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import warnings

from boxmaker.records import User
from boxmaker.session import Session

CHILD = """
import sys
from boxmaker.records import User
from boxmaker.session import Session

round_ = sys.argv[2]
with Session.open(sys.argv[1]) as session:
    print("open", flush=True)
    i = 0
    while True:
        if i % 2:
            session.extend([User(content=f"{round_}-{i}a"), User(content=f"{round_}-{i}b")])
        else:
            session.append(User(content=f"{round_}-{i}"))
        print(f"ack {round_}-{i}", flush=True)
        i += 1
"""


def main(argv: list[str] | None = None) -> int:
    """Run the kills; print one line per 20 rounds and the ``acked N lost M`` line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=200, help="rounds (default 200)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    acked: set[str] = set()
    lost: set[str] = set()
    partial: set[str] = set()
    with tempfile.TemporaryDirectory() as folder:
        with Session.create(folder) as session:
            path = session.path
        for round_ in range(args.kills):
            child = subprocess.Popen(
                [sys.executable, "-c", CHILD, str(path), str(round_)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert child.stdout is not None
            if child.stdout.readline().strip() != "open":  # the child holds the lock now
                print(child.stderr.read() if child.stderr else "", file=sys.stderr)
                raise SystemExit(f"round {round_}: the child could not open the log")
            time.sleep(rng.uniform(0, 0.06))
            os.kill(child.pid, signal.SIGKILL)
            out, _ = child.communicate()
            acked.update(line[4:] for line in out.splitlines() if line.startswith("ack "))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a torn last line is expected now and then
                reopened = Session.open(path, read_only=True)
            contents = [r.content for r in reopened.records if isinstance(r, User)]
            found = {c[:-1] if c[-1] in "ab" else c for c in contents}
            halves = {c[:-1] for c in contents if c[-1] in "ab"}
            partial |= {g for g in halves if contents.count(g + "a") != contents.count(g + "b")}
            lost |= acked - found
            if (round_ + 1) % 20 == 0:
                print(
                    f"round {round_ + 1}: acked {len(acked)} lost {len(lost)} "
                    f"partial {len(partial)}",
                    flush=True,
                )
    print(f"acked {len(acked)} lost {len(lost)} partial {len(partial)}")
    return 1 if lost or partial else 0


if __name__ == "__main__":
    raise SystemExit(main())
