"""Exporters: boxmaker's logs in the formats other tools read (``boxmaker export``).

- :func:`write_parquet`: every frame of :mod:`boxmaker.frames` as a Parquet file (pyarrow;
  the ``parquet`` extra), the frames' column names, dtypes and units (in field metadata).
- :func:`export_otel`: OpenTelemetry spans of the GenAI semantic conventions (version
  :data:`SEMCONV`) over OTLP/HTTP or as an OTLP JSON file (the ``otel`` extra).
- :func:`export_inspect`: an Inspect AI eval log, one sample per run (the ``inspect`` extra).
- :func:`export_atif`: one ATIF trajectory (:data:`ATIF_VERSION`) per session log, a step per
  completion, tokens as llama.cpp counted them and, given a server, the prompts' token ids;
  :func:`import_atif` turns a trajectory (another harness's too) into a session log.

Each reads the logs through :func:`boxmaker.session.read_log` (a log the session refuses is
left out with a :class:`~boxmaker.session.LogReadWarning`); the heavy libraries are imported
when an exporter runs.
"""

from .._public import publish
from ._atif import ATIF_VERSION, atif_trajectory, export_atif
from ._atif_import import AtifImport, atif_log, import_atif
from ._errors import ExportError
from ._inspect import export_inspect
from ._otel import SEMCONV, export_otel, session_spans
from ._parquet import write_parquet

__all__ = [
    "ATIF_VERSION",
    "SEMCONV",
    "AtifImport",
    "ExportError",
    "atif_log",
    "atif_trajectory",
    "export_atif",
    "export_inspect",
    "export_otel",
    "import_atif",
    "session_spans",
    "write_parquet",
]

publish(globals(), __all__)
