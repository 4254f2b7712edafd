"""``boxmaker export parquet|otel|inspect|atif`` and ``boxmaker import atif``: logs in the
formats other tools read, and another harness's ATIF trajectory as a session log
(:mod:`boxmaker.export`; its libraries are imported when a command runs, so ``boxmaker
--help`` stays fast)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..config import Config, HistoryConfig
from ..view import terminal_safe

__all__ = ["add_export_commands"]


def _export(args: argparse.Namespace) -> int:
    """``export``: one line per file written (``otel``: the spans' count); exit 2 for an
    ``otel`` export without exactly one receiver."""
    from .. import export  # pyarrow, OpenTelemetry, inspect_ai: inside the exporters

    if args.format == "parquet":
        written = export.write_parquet(args.paths, args.out, engine=args.engine)
        for path in written.values():
            print(path)
    elif args.format == "otel":
        if (args.endpoint is None) == (args.file is None):
            print("boxmaker export otel: give --endpoint URL or --file PATH", file=sys.stderr)
            return 2
        n = export.export_otel(
            args.paths,
            endpoint=args.endpoint,
            file=args.file,
            content=args.content,
            server=args.server,
            headers=dict(h.split("=", 1) for h in args.header),
        )
        print(f"{n} spans to {args.endpoint or args.file}")
    elif args.format == "atif":
        kwargs = Config(history=HistoryConfig(reasoning=args.reasoning)).template_kwargs()
        export.export_atif(
            args.paths,
            args.out,
            url=args.url,
            api_key=args.api_key,
            template_kwargs=kwargs,
            on_file=print,
        )
    else:
        export.export_inspect(args.paths, args.out, task=args.task, on_file=print)
    return 0


def _import(args: argparse.Namespace) -> int:
    """``import atif``: the log written, and what was left out (stderr); exit 2 for
    ``--session-id`` with several files."""
    from ..export import import_atif

    if args.session_id is not None and len(args.files) > 1:
        print("boxmaker import atif: --session-id names one file's log", file=sys.stderr)
        return 2
    for file in args.files:
        done = import_atif(file, args.dir, session_id=args.session_id)
        print(done.path)
        for what, n in sorted(done.left_out.items()):
            print(terminal_safe(f"boxmaker import: {file}: left out {n} {what}"), file=sys.stderr)
    return 0


def add_export_commands(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add ``export`` (``parquet``, ``otel``, ``inspect``, ``atif``) and ``import``
    (``atif``) to the ``boxmaker`` parser's subcommands ``sub``, each with ``formatter``."""
    exporting = sub.add_parser(
        "export", help="logs as Parquet, OpenTelemetry spans, Inspect logs, ATIF trajectories"
    )
    formats = exporting.add_subparsers(dest="format", required=True)
    parquet = formats.add_parser("parquet", help="every frame as a Parquet file (pyarrow)")
    parquet.add_argument("paths", nargs="+", help="session logs or directories (recursive)")
    parquet.add_argument("--out", required=True, help="the directory to write")
    parquet.add_argument(
        "--engine",
        choices=("pandas", "duckdb"),
        default="pandas",
        help="how the frames are computed (duckdb: past memory; the duckdb extra)",
    )
    otel = formats.add_parser("otel", help="OpenTelemetry GenAI spans over OTLP/HTTP or a file")
    otel.add_argument("paths", nargs="+", help="session logs or directories (recursive)")
    otel.add_argument("--endpoint", help="OTLP/HTTP traces URL (http://host:4318/v1/traces)")
    otel.add_argument("--file", help="write OTLP JSON here instead (one request per log)")
    otel.add_argument("--content", action="store_true", help="include message texts (private)")
    otel.add_argument("--server", help="the llama-server URL, for server.address/server.port")
    otel.add_argument(
        "--header", action="append", default=[], metavar="KEY=VALUE", help="an HTTP header"
    )
    inspect = formats.add_parser(
        "inspect", help="Inspect AI eval logs: a sample per run, a log per grid setting"
    )
    inspect.add_argument("paths", nargs="+", help="a batch folder, logs or directories")
    inspect.add_argument(
        "--out",
        required=True,
        help="a folder (one .eval per grid setting inside it), or one .eval/.json file",
    )
    inspect.add_argument("--task", default="boxmaker", help="the eval's task name")
    atif = formats.add_parser(
        "atif", help="ATIF trajectories (Harbor's format): one per log, a step per completion"
    )
    atif.add_argument("paths", nargs="+", help="session logs, directories or a batch folder")
    atif.add_argument("--out", required=True, help="the directory to write (<session>.json)")
    atif.add_argument(
        "--url",
        default=None,
        help="a llama-server with the sessions' model: write each prompt's token ids, as its "
        "template and tokenizer make them (two requests per completion)",
    )
    atif.add_argument("--api-key", default=None, help="its API key (--api-key), if any")
    atif.add_argument(
        "--reasoning",
        choices=("drop", "keep"),
        default="drop",
        help="the sessions' history.reasoning, for the prompts' rendering (with --url)",
    )
    for command in (parquet, otel, inspect, atif):
        command.set_defaults(run=_export)
        command.formatter_class = formatter

    importing = sub.add_parser("import", help="another harness's run as a session log")
    kinds = importing.add_subparsers(dest="format", required=True)
    text = "an ATIF trajectory (JSON) as a session log: frames, report, replay, cache explain"
    one = kinds.add_parser("atif", help=text, description=text)
    one.add_argument("files", nargs="+", help="ATIF trajectory files (.json)")
    one.add_argument("--dir", default="sessions", help="where the logs go (./sessions)")
    one.add_argument(
        "--session-id",
        default=None,
        help="the log's session id (one file only; default: the trajectory's session_id)",
    )
    one.set_defaults(run=_import)
    one.formatter_class = formatter
