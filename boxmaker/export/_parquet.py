"""``boxmaker export parquet``: the logs as a dataset folder that the Hugging Face Hub and
``datasets.load_dataset`` read: every frame as a Parquet file (pyarrow), the conversations in
``messages.parquet``, and a dataset card (``README.md``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from ..session import LogReadWarning, read_logs
from ._card import ServersSeen, dataset_card
from ._logs import boxmaker_version
from ._messages import MessagesWriter, message_row

__all__ = ["write_parquet"]


def write_parquet(source: Any, out: str | Path, *, engine: str = "pandas") -> dict[str, Path]:
    """Write ``source``'s logs as a dataset folder: ``<out>/<frame>.parquet`` for the six
    frames of :mod:`boxmaker.frames`, ``<out>/messages.parquet`` (one row per session: its
    conversation in the OpenAI chat shape, each message flagged ``from_parent`` where a fork
    copied it; :mod:`boxmaker.export._messages`) and ``<out>/README.md``, the dataset card
    (each table a config in its YAML front matter, as the Hugging Face Hub reads it; the
    tables' features with units, the servers and models the sessions ran on, the null counts
    of what is unknown, how forks are counted).

    The frames' columns, names, dtypes and units are their own (:data:`boxmaker.frames.COLUMNS`):
    each Parquet field carries ``unit`` and ``doc`` in its metadata, and the file's metadata
    names the frame. Categories are dictionary-encoded, times ``timestamp[ns, tz=UTC]``.
    ``datasets.load_dataset("parquet", data_files=...)`` loads any of the files, and
    ``datasets.load_dataset(out, "turns")`` a table by its config.

    Args:
        source: as for :func:`boxmaker.frames.load` (a log, a directory, a list).
        out: the directory to write (made if missing; files of the same names are replaced).
        engine: ``"pandas"`` or ``"duckdb"`` (:func:`boxmaker.frames.load`'s engine).

    Returns:
        The path of each table's file, by table name, then ``"README"``: the card.

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
    servers = ServersSeen()
    path = folder / "messages.parquet"
    with warnings.catch_warnings(), MessagesWriter(path) as messages:
        # the same source, read again a log at a time: what it leaves out the frames said
        warnings.simplefilter("ignore", LogReadWarning)
        for log in read_logs(source):
            messages.add(message_row(log))
            servers.add(log.records)
    written["messages"] = path
    card = dataset_card(
        loaded,
        servers,
        sessions=messages.written,
        version=boxmaker_version(),
        tables=["messages", *frames.Frames._fields],
    )
    written["README"] = folder / "README.md"
    written["README"].write_text(card, encoding="utf-8")
    return written
