"""boxmaker export parquet: every frame as Parquet, the frames' names, dtypes and units."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from extras import ENGINES, need
from pandas.testing import assert_frame_equal

from boxmaker import frames
from boxmaker.cli import main
from boxmaker.export import write_parquet

pq = need("pyarrow.parquet")
DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize("engine", ENGINES)
def test_every_frame_reads_back_equal_with_units(tmp_path: Path, engine: str) -> None:
    written = write_parquet(DATA, tmp_path / "out", engine=engine)
    assert set(written) == set(frames.Frames._fields)
    loaded = frames.load(DATA)
    for name, path in written.items():
        table = pq.read_table(path)
        want = getattr(loaded, name)
        got = table.to_pandas()
        assert list(got.columns) == [c.name for c in frames.COLUMNS[name]]
        # an empty category set reads back with object categories: dtypes compared by name
        assert [str(d) for d in got.dtypes] == [str(d) for d in want.dtypes]
        assert_frame_equal(
            got, want, check_exact=False, rtol=1e-9, check_dtype=False, check_categorical=False
        )
        field = table.schema.field(want.columns[-1])
        spec = frames.COLUMNS[name][-1]
        assert field.metadata[b"unit"].decode() == spec.unit
        assert field.metadata[b"doc"].decode() == spec.doc
        units = json.loads(table.schema.metadata[b"boxmaker.units"])
        assert units == {c.name: c.unit for c in frames.COLUMNS[name]}
    requests = pq.read_table(written["requests"]).to_pandas()
    assert requests.cached_tokens.dtype == pd.Int64Dtype()
    assert str(requests.time.dtype) == "datetime64[ns, UTC]"


def test_the_command_writes_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "parquet", str(DATA), "--out", str(tmp_path / "pq")]) == 0
    assert sorted(p.name for p in (tmp_path / "pq").iterdir()) == sorted(
        f"{n}.parquet" for n in frames.Frames._fields
    )
    assert "summary.parquet" in capsys.readouterr().out
