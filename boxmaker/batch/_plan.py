"""What a batch is made of, and what is left of it: tasks, runs, the manifest, a log's progress.

Pure bookkeeping for :mod:`boxmaker.batch` (no network, no threads):

- :class:`Task`: one scripted session (an id, one or more user messages, an optional system
  prompt, tool names and config overrides); :func:`load_tasks` reads them from Python objects,
  a pandas DataFrame or a JSON Lines file.
- :func:`expand`: tasks times a config grid (``{"loop.thinking_tokens": [16, 64], ...}``) ->
  :class:`RunSpec`, one per (task, settings); :meth:`RunSpec.config` applies the overrides.
- :func:`log_state`: how far a run's session log got (turns done, finished or not), read
  from the log itself, so a rerun knows what to skip and what to continue.
- :class:`Manifest`: the batch's ``manifest.ndjson``, one JSON line per run state change,
  appended by the one runner of the batch (it holds the file's lock);
  :func:`read_manifest` folds it into one entry per run.
- :class:`BatchProgress`: the counters a progress display shows.

Config keys are dotted ``section.key`` names of :class:`~boxmaker.config.Config`
(``loop.tool_result_cap``, ``loop.thinking_tokens``...); nested mappings shaped like the TOML
file (``{"loop": {"tool_result_cap": 200}}``) are accepted too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
import tomllib
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._secrets import hide_in_json, searchable
from ..config import Config
from ..errors import ConfigError, LogBusy, SessionError
from ..records import utc_now
from ..score import Target, parse_target
from ..session import LogWriter, check_folder, dumps_line, read_log

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "MANIFEST",
    "RETRIED_OUTCOMES",
    "BatchProgress",
    "LogState",
    "Manifest",
    "RunSpec",
    "Task",
    "expand",
    "flatten_settings",
    "load_grid",
    "load_tasks",
    "log_state",
    "manifest",
    "read_manifest",
]

MANIFEST = "manifest.ndjson"
"""The manifest's file name in the batch directory. Not ``.jsonl``: the frames and
``boxmaker report`` search a directory for ``*.jsonl`` session logs, and it is not one."""

RETRIED_OUTCOMES = frozenset({"cancelled", "infer_error", "process_died"})
"""``TurnEnd`` outcomes of a turn that did not happen: its message is sent again on a rerun
(the log keeps both attempts). ``process_died`` closes a turn the runner was killed in, when
the log is reopened. Every other outcome is a finished turn, never re-sent."""

_TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,110}")


@dataclass(frozen=True, kw_only=True)
class Task:
    """One scripted session of a batch.

    Attributes:
        id: names the task; letters, digits, ``.``, ``_``, ``-`` (at most 111 characters),
            since run ids and log file names derive from it.
        messages: the user messages, one turn each, in order (at least one).
        system: the system prompt ("" for none).
        tools: names of the registry's tools offered to the model; ``None``: all of them.
        config: overrides of the batch's config for this task (dotted keys, see the module
            docstring); a grid setting of the same key wins.
        target: what a right run looks like (:func:`boxmaker.score.parse_target`: the answer
            and the tool calls), as its JSON object; ``None``: the task is not scored by a
            target (other scorers still can). Kept in the manifest, so a batch folder can be
            scored later without the tasks file.

    Raises:
        ConfigError: an unsafe id, no messages, a message that is not a string, a malformed
            target (the message names the task).
    """

    id: str
    messages: tuple[str, ...]
    system: str = ""
    tools: tuple[str, ...] | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    target: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _TASK_ID.fullmatch(self.id):
            raise ConfigError(f"task id {self.id!r} is not safe as a file name")
        if isinstance(self.messages, str) or not self.messages:
            raise ConfigError(f"task {self.id}: messages must be a non-empty list of strings")
        object.__setattr__(self, "messages", tuple(self.messages))
        if not all(isinstance(m, str) for m in self.messages):
            raise ConfigError(f"task {self.id}: every message must be a string")
        if self.tools is not None:
            object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "config", flatten_settings(self.config, f"task {self.id}"))
        if self.target is not None:
            parse_target(self.target, f"task {self.id}")

    def scoring_target(self) -> Target | None:
        """The parsed :attr:`target` (``None`` without one)."""
        return None if self.target is None else parse_target(self.target, f"task {self.id}")


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One run of a batch: a task under one setting of the grid.

    Attributes:
        id: ``<task id>`` without settings, else ``<task id>.<8 hex digits>`` (sha256 of the
            settings as canonical JSON): stable across reruns, safe as a file name.
        task: the task.
        settings: the grid values of this run (dotted keys), ``{}`` without a grid.
    """

    id: str
    task: Task
    settings: Mapping[str, Any]

    def config(self, base: Config) -> Config:
        """``base`` with the task's overrides, then the run's settings, applied.

        Raises:
            ConfigError: an unknown key or a value of the wrong type or range.
        """
        data = base.changed()  # rebuilt by from_dict below, the overrides laid on top
        sections = {f.name for f in dataclasses.fields(base)}
        for key, value in {**self.task.config, **self.settings}.items():
            section, _, name = key.partition(".")
            if section not in sections or not name:
                raise ConfigError(f"run {self.id}: unknown config key {key!r}")
            data.setdefault(section, {})[name] = value
        return Config.from_dict(data, source=f"run {self.id}")


def flatten_settings(values: Mapping[str, Any], where: str = "config") -> dict[str, Any]:
    """Nested ``{"loop": {"tool_result_cap": 200}}`` and dotted ``{"loop.tool_result_cap":
    200}`` alike as dotted keys.

    Raises:
        ConfigError: ``values`` is not a mapping, or a key is not ``section.key``.
    """
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: config overrides must be a mapping")
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        elif isinstance(key, str) and "." in key:
            out[key] = value
        else:
            raise ConfigError(f"{where}: {key!r} is not a section.key config name")
    return out


def load_tasks(source: Any) -> list[Task]:
    """Tasks from a JSON Lines file, a pandas DataFrame, or an iterable of tasks or mappings.

    A mapping (a JSON line, a DataFrame row) has ``id`` and ``messages`` (a list of strings)
    or ``message`` (one string), and optionally ``system``, ``tools``, ``config``, ``target``.

    Raises:
        ConfigError: the file cannot be read, a line is not a JSON object, a task is
            malformed, or two tasks share an id (the message names file and line or task).
    """
    rows: Iterable[Any]
    where = "tasks"
    if isinstance(source, str | os.PathLike):
        where = str(source)
        try:
            text = Path(source).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read the tasks: {exc}") from exc
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise ConfigError(f"{where}:{number}: not JSON: {exc}") from exc
    elif hasattr(source, "to_dict") and hasattr(source, "columns"):  # a pandas DataFrame
        rows = source.to_dict("records")
    else:
        rows = source
    tasks: list[Task] = []
    for number, row in enumerate(rows, 1):
        task = row if isinstance(row, Task) else _task_of(row, f"{where}:{number}")
        tasks.append(task)
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise ConfigError(f"{where}: two tasks have the id {task.id!r}")
        seen.add(task.id)
    return tasks


def _task_of(row: Any, where: str) -> Task:
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: a task must be an object, not {type(row).__name__}")
    known = {"id", "messages", "message", "system", "tools", "config", "target"}
    unknown = set(row) - known
    if unknown:
        raise ConfigError(f"{where}: unknown task fields {sorted(unknown)}")
    messages = row.get("messages")
    if messages is None and isinstance(row.get("message"), str):
        messages = (row["message"],)
    tools = row.get("tools")
    try:
        return Task(
            id=row.get("id"),  # type: ignore[arg-type]  # checked by Task
            messages=tuple(messages) if isinstance(messages, Sequence) else (),
            system=str(row.get("system") or ""),
            tools=None if tools is None else tuple(tools),
            config=row.get("config") or {},
            target=row.get("target"),
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def load_grid(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A config grid from a JSON file (an object) or, for ``*.toml``, a TOML file::

        {"loop.thinking_tokens": [16, 64], "loop.tool_result_cap": [40, 4000]}

        [loop]
        thinking_tokens = [16, 64]

    Raises:
        ConfigError: the file cannot be read or parsed, or is not an object of lists.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        data = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{p}: cannot read the grid: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a grid is an object of config keys to lists of values")
    return flatten_settings(data, str(p))


def expand(tasks: Sequence[Task], grid: Mapping[str, Sequence[Any]] | None = None) -> list[RunSpec]:
    """Every task under every combination of the grid's values, task by task.

    Args:
        tasks: the tasks.
        grid: dotted config keys to lists of values (or nested, see :func:`flatten_settings`);
            ``None`` or ``{}``: one run per task.

    Returns:
        ``len(tasks) * prod(len(values))`` runs, ids as :class:`RunSpec` says.

    Raises:
        ConfigError: a grid entry that is not a non-empty list, or a run whose config is
            invalid (checked here, before anything runs).
    """
    flat = flatten_settings(grid or {}, "grid")
    for key, values in flat.items():
        if isinstance(values, str) or not isinstance(values, Sequence) or not values:
            raise ConfigError(f"grid: {key} must be a non-empty list of values")
    keys = sorted(flat)
    runs: list[RunSpec] = []
    for task in tasks:
        for combo in itertools.product(*(flat[k] for k in keys)):
            settings = dict(zip(keys, combo, strict=True))
            run_id = task.id
            if settings:
                canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"))
                run_id += "." + hashlib.sha256(canonical.encode()).hexdigest()[:8]
            spec = RunSpec(id=run_id, task=task, settings=settings)
            spec.config(Config())
            runs.append(spec)
    return runs


@dataclass(frozen=True)
class LogState:
    """How far a run's log got.

    Attributes:
        turns_done: finished turns (a ``User`` whose ``TurnEnd``, before the next ``User``,
            has an outcome not in :data:`RETRIED_OUTCOMES`); the run goes on with message
            ``turns_done``.
        last_outcome: the outcome of the last ``TurnEnd`` (``None``: none yet).
        full: a turn ended ``session_full``: nothing more fits, the run is over.
    """

    turns_done: int
    last_outcome: str | None
    full: bool

    def finished(self, messages: int) -> bool:
        """Whether a run of ``messages`` user messages has nothing left to send."""
        return self.full or self.turns_done >= messages


def log_state(path: Path) -> LogState:
    """Read ``path`` (read-only, no lock) and count its finished turns; a missing or empty
    log has none. A torn last line is ignored (the writer repairs it on open).

    Raises:
        SessionError: the log exists but cannot be read (see :func:`read_log`).
    """
    if not path.exists() or path.stat().st_size == 0:
        return LogState(0, None, False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = read_log(path)
    done, open_turn, last, full = 0, False, None, False
    for item in data.records:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "user":
            open_turn = True
        elif kind == "turn_end":
            last = item.get("outcome")
            if open_turn and last not in RETRIED_OUTCOMES:
                done += 1
                full = full or last == "session_full"
            open_turn = False
    return LogState(done, last, full)


class Manifest:
    """The batch's manifest, open for appending by the batch's one runner.

    ``<batch_dir>/manifest.ndjson`` holds one JSON object per line, each a run's state change:
    ``{"time", "run", "state", ...}``. States: ``planned`` (with ``task``, ``settings``,
    ``messages``, and ``target`` when the task has one), ``running`` (``server``, ``slot``,
    ``attempt``), ``retry`` (``reason``), ``done`` (``turns``, ``outcome``), ``failed``
    (``reason``: also a run whose log cannot be read, which the others do not wait for),
    ``interrupted``; a
    ``server_down`` line names a server (``server``, ``reason``) instead of a run. Lines are
    only appended, each one fsynced (:class:`~boxmaker.session.LogWriter`); a torn last line
    left by a kill is cut off when the manifest is opened again.

    Args:
        batch_dir: the batch's directory (made when missing).
        secrets: credentials to write as ``<API_KEY>`` (the batch's ``ClientConfig.api_key``).

    Raises:
        SessionError: another runner holds the batch (:class:`~boxmaker.errors.LogBusy`, the
            message names its pid), the file cannot be written, or it or the directory is a
            link planted by someone else.
    """

    def __init__(self, batch_dir: Path, secrets: Sequence[str | None] = ()) -> None:
        self.path = batch_dir / MANIFEST
        self._secrets = searchable(secrets)
        check_folder(batch_dir, what="batch directory")
        try:  # made when missing, in one step: two runners starting at once race on the lock
            self._writer = LogWriter(self.path, create=None, what="batch manifest")
        except LogBusy as exc:
            raise LogBusy(
                f"{batch_dir}: another batch runner holds this batch directory "
                f"({exc.holder}); one runner per batch at a time",
                exc.holder,
            ) from exc
        raw = self.path.read_bytes()
        if raw and not raw.endswith(b"\n"):
            self._writer.truncate(raw.rfind(b"\n") + 1)

    def write(self, run: str | None, state: str, **fields: Any) -> None:
        """Append one state change (``run`` ``None`` for a line about the batch).

        Secrets are hidden by the cassettes' rule (:mod:`boxmaker.cassettes`): the string of a
        credential-like setting (``client.api_key``, a ``token``) becomes ``<SECRET>``, and each
        of the manifest's ``secrets`` becomes ``<API_KEY>`` wherever it appears (a reason
        quoting a server's answer)."""
        line: dict[str, Any] = {"time": utc_now().isoformat(), "state": state}
        if run is not None:
            line["run"] = run
        self._writer.append(dumps_line(hide_in_json({**line, **fields}, self._secrets)))

    def close(self) -> None:
        """Release the file and its lock (idempotent)."""
        self._writer.close()


def read_manifest(batch_dir: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The manifest folded to one entry per run, in the order runs were planned.

    Each entry holds the last value of every field written for the run (``state`` the last
    state), plus ``attempts`` (its ``running`` lines). A torn last line is skipped.

    Raises:
        SessionError: the manifest is missing (the folder is not a batch's) or unreadable, or a
            line before the last is not a JSON object.
    """
    path = Path(batch_dir) / MANIFEST
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        why = f"no {MANIFEST}; boxmaker batch --dir {batch_dir} makes one"
        raise SessionError(f"{batch_dir}: not a batch folder ({why})") from None
    except OSError as exc:
        raise SessionError(f"{path}: cannot read the batch manifest: {exc}") from exc
    runs: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            if number == len(lines):
                break  # a torn last line
            raise SessionError(f"{path}:{number}: not a JSON line: {exc}") from exc
        if not isinstance(item, dict):
            raise SessionError(f"{path}:{number}: not a JSON object")
        run = item.get("run")
        if isinstance(run, str):
            entry = runs.setdefault(run, {"attempts": 0})
            entry["attempts"] += item.get("state") == "running"
            entry.update(item)
    return runs


def manifest(batch_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per run of a batch, from its manifest: ``run``, ``task``, one column per grid
    setting (named by its dotted key), ``state``, ``server``, ``slot``, ``attempts``,
    ``turns``, ``outcome``, ``reason``.

    Raises:
        SessionError: the manifest is missing or unreadable.
    """
    import pandas as pd  # only for this frame

    rows = []
    for run, entry in read_manifest(batch_dir).items():
        row = {"run": run, "task": entry.get("task"), **(entry.get("settings") or {})}
        for key in ("state", "server", "slot", "attempts", "turns", "outcome", "reason"):
            row[key] = entry.get(key)
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True, kw_only=True)
class BatchProgress:
    """A snapshot of a running batch, given to progress displays.

    Attributes:
        total: runs in the batch.
        done: runs finished (in this call or before it).
        skipped: of ``done``, those already finished before this call.
        failed: runs given up on (the reasons in ``failures``).
        running: runs in flight.
        slots: slots in use by the batch, over every server still up.
        servers_down: servers given up on in this call.
        tokens: tokens generated in this call (``predicted_n`` of every completion).
        elapsed_s: seconds since the call started.
        failures: ``(run, reason)`` of each failed run, in order.
        stopped: the call was stopped (Ctrl-C or its ``cancel`` event): in-flight turns were
            cancelled; a rerun picks up.
        finished: the batch call is over (this is the last snapshot).
    """

    total: int
    done: int = 0
    skipped: int = 0
    failed: int = 0
    running: int = 0
    slots: int = 0
    servers_down: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    failures: tuple[tuple[str, str], ...] = ()
    stopped: bool = False
    finished: bool = False

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second over the call so far."""
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0
