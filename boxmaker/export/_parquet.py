"""``boxmaker export parquet``: every frame as a Parquet file, through pyarrow."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

__all__ = ["write_parquet"]


def write_parquet(source: Any, out: str | Path, *, engine: str = "pandas") -> dict[str, Path]:
    """Write the six frames of ``source`` (:mod:`boxmaker.frames`) as ``<out>/<frame>.parquet``.

    The columns, names, dtypes and units are the frames' own (:data:`boxmaker.frames.COLUMNS`):
    each Parquet field carries ``unit`` and ``doc`` in its metadata, and the file's metadata
    names the frame. Categories are dictionary-encoded, times ``timestamp[ns, tz=UTC]``.

    Args:
        source: as for :func:`boxmaker.frames.load` (a log, a directory, a list).
        out: the directory to write (made if missing; files of the same names are replaced).
        engine: ``"pandas"`` or ``"duckdb"`` (:func:`boxmaker.frames.load`'s engine).

    Returns:
        The path of each frame's file, by frame name.

    Raises:
        SessionError: a path of ``source`` names no log.
        ExportError: pyarrow is not installed (``pip install 'boxmaker[parquet]'``).

    Warns:
        LogReadWarning: as the frames (a log left out, a torn line dropped, ...).
    """
    from .. import frames
    from ._errors import ExportError

    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise ExportError("Parquet export needs pyarrow: pip install 'boxmaker[parquet]'") from exc
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    loaded = frames.load(source, engine=engine)  # type: ignore[arg-type]
    written: dict[str, Path] = {}
    for name in frames.Frames._fields:
        df = getattr(loaded, name)
        with warnings.catch_warnings():  # pyarrow reads a UTC column through Series.values,
            # which pandas 3.1 deprecates for tz-aware data (the values are UTC either way)
            warnings.filterwarnings("ignore", "Series.values returning an ndarray that drops")
            table = pa.Table.from_pandas(df, preserve_index=False)
        specs = {c.name: c for c in frames.COLUMNS[name]}
        fields = [
            f.with_metadata({"unit": specs[f.name].unit, "doc": specs[f.name].doc})
            for f in table.schema
        ]
        meta = dict(table.schema.metadata or {})
        meta[b"boxmaker.frame"] = name.encode()
        meta[b"boxmaker.units"] = json.dumps({c: s.unit for c, s in specs.items()}).encode()
        table = table.cast(pa.schema(fields, metadata=meta))
        path = folder / f"{name}.parquet"
        pq.write_table(table, path)
        written[name] = path
    return written
