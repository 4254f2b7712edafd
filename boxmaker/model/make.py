"""Write a small, randomly initialised (seeded) but loadable model GGUF.

Usage::

    python -m boxmaker.model.make --out PATH [--seed N]

The model is untrained (the shipped ``tiny-agent.gguf`` is the trained one; do not overwrite
it with this): it loads, serves and streams, but its text is noise. For a trained model use
``python -m boxmaker.model.train``. Needs the ``dev`` extra (``gguf``, ``numpy``, ``jinja2``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from boxmaker.model.format import ModelConfig, random_weights, write_gguf

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, write the random model and print its path and size; returns 0."""
    parser = argparse.ArgumentParser(prog="python -m boxmaker.model.make", description=__doc__)
    parser.add_argument("--out", required=True, help="output GGUF path")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    config = ModelConfig()
    path = write_gguf(
        args.out,
        config,
        random_weights(config, seed=args.seed),
        description=f"untrained, random weights (seed {args.seed})",
    )
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
