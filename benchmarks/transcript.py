"""Benchmark: the cost of folding one streamed token into the widgets' transcript, as it grows.

Feeds :class:`boxmaker.view.Transcript` one long turn of ``--tokens`` streamed fragments
(``--chars`` characters each; reasoning first, then content, half and half) and prints the
milliseconds spent per 1,000 fragments in each tenth of the stream. The cost of one fragment
must not grow with the text already streamed: the last tenth should cost about what the first
does. Then folds ``--turns`` short finished turns and times one refresh of the live panel's
transcript box (only the turn that changes is re-rendered, however many came before).

The last line printed is ``growth X.XX`` (ms per 1,000 fragments in the last tenth / in the
first tenth; about 1 means flat).

Run: ``python benchmarks/transcript.py`` (``--tokens N``, ``--chars C``, ``--turns T``).
"""

from __future__ import annotations

import argparse
import time

from boxmaker.events import Content, Reasoning
from boxmaker.records import Assistant, User
from boxmaker.view import Transcript
from boxmaker.widgets._draw import TranscriptBox


def fold_stream(tokens: int, chars: int) -> list[float]:
    """Milliseconds per 1,000 fragments in each tenth of a ``tokens``-fragment stream."""
    transcript = Transcript(clock=lambda: 0.0)
    transcript.apply(User(content="write a long essay"))
    piece = "x" * (chars - 1) + " "
    tenth = tokens // 10
    out = []
    for part in range(10):
        kind = Reasoning if part < 5 else Content
        events = [kind(piece) for _ in range(tenth)]
        started = time.perf_counter()
        for event in events:
            transcript.apply(event, 0.0)
        out.append((time.perf_counter() - started) * 1000 / tenth * 1000)
    assert len(transcript.turns[0].answer()) == tenth * 5 * chars
    return out


def refresh_ms(turns: int) -> float:
    """Milliseconds for one refresh of the panel's transcript box after ``turns`` turns."""
    transcript = Transcript(clock=lambda: 0.0)
    box = TranscriptBox()
    for i in range(turns):
        transcript.extend([User(content=f"q{i}"), Assistant(content=f"**answer** {i} " * 50)])
        box.show(transcript, live=True)
    transcript.apply(Content("one more token"), 0.0)
    started = time.perf_counter()
    box.show(transcript, live=True)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    """Parse the arguments, run both measurements, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--chars", type=int, default=4)
    parser.add_argument("--turns", type=int, default=200)
    args = parser.parse_args()
    per_tenth = fold_stream(args.tokens, args.chars)
    for i, ms in enumerate(per_tenth):
        print(f"fragments {i * args.tokens // 10:>8}-: {ms:7.3f} ms per 1,000")
    print(f"refresh after {args.turns} turns: {refresh_ms(args.turns):.1f} ms")
    print(f"growth {per_tenth[-1] / per_tenth[0]:.2f}")


if __name__ == "__main__":
    main()
