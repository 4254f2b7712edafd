"""What a batch is made of: tasks, their runs under a config grid.

Pure bookkeeping for :mod:`boxmaker.batch` (no network, no threads):

- :class:`Task`: one scripted session (an id, one or more user messages, an optional system
  prompt, tool names and config overrides); :class:`ForkTask`: a session log forked at a turn
  (:meth:`boxmaker.session.Session.fork`) whose new turns run under each setting;
  :func:`load_tasks` reads both from Python objects, a pandas DataFrame or a JSON Lines file.
- :func:`expand`: tasks times a config grid (``{"loop.thinking_tokens": [16, 64], ...}``) ->
  :class:`RunSpec`, one per (task, settings); :meth:`RunSpec.config` applies the overrides
  (once per base config: a run's settings are resolved once, not at each use).

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

from ..config import Config
from ..errors import ConfigError, SessionError
from ..records import TurnEnd, User
from ..score import Target, parse_target
from ..session import Session

if TYPE_CHECKING:
    pass

__all__ = [
    "REPLAY_MODES",
    "RETRIED_OUTCOMES",
    "ForkTask",
    "RunSpec",
    "Task",
    "expand",
    "flatten_settings",
    "load_grid",
    "load_tasks",
]

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

    @property
    def turns(self) -> tuple[str, ...]:
        """The user messages the run sends, one turn each: :attr:`messages`."""
        return self.messages

    def scoring_target(self) -> Target | None:
        """The parsed :attr:`target` (``None`` without one)."""
        return None if self.target is None else parse_target(self.target, f"task {self.id}")


REPLAY_MODES = ("off", "on", "stop")
"""A :class:`ForkTask`'s ``replay``: tools run live (``off``); the parent's tool results while
the fork's calls are the parent's, then live (``on``, :class:`boxmaker.turn.Replay`); or the
fork's turn ends at its first call that differs, outcome ``diverged``, and the run with it
(``stop``)."""


@dataclass(frozen=True, kw_only=True)
class ForkTask:
    """A session log forked at a turn, as a task of a batch: each run (one per grid setting)
    is a fork of ``parent`` (:meth:`boxmaker.session.Session.fork`) whose new turns run live
    under the run's setting.

    Attributes:
        id: names the task (as :attr:`Task.id`).
        parent: the parent's session log (``.jsonl``); only read. A relative path is read
            from the current folder (in a tasks file: from the file's folder).
        at: the parent's turn the fork branches at (1-based).
        rerun: branch before turn ``at``'s answer: the fork's first turn is turn ``at`` again,
            with its user message; else the fork branches after turn ``at`` ended.
        replay: one of :data:`REPLAY_MODES` (default ``off``: tools run live).
        messages: the user messages of the fork's turns after turn ``at``, in order; ``None``
            (the default): the parent's own messages after turn ``at`` (its turns that were
            cut and sent again count once).
        config: overrides of the batch's config for this task, as :attr:`Task.config`.
        target: what a right run looks like, as :attr:`Task.target`; it is scored against
            the fork's own records (those after the parent's copied ones).
        turns: the messages the run sends, one turn each (turn ``at``'s first with
            ``rerun``); filled by :meth:`resolve`, ``()`` before.

    The fork keeps the parent's system prompt and tools (a task's ``system`` and ``tools``
    have no place here: another prompt would make the whole cache cold).

    Raises:
        ConfigError: an unsafe id, a turn that is not a positive number, an unknown replay
            mode, messages that are not strings, a malformed target.
    """

    id: str
    parent: str | os.PathLike[str]
    at: int
    rerun: bool = False
    replay: str = "off"
    messages: tuple[str, ...] | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    target: Mapping[str, Any] | None = None
    turns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _TASK_ID.fullmatch(self.id):
            raise ConfigError(f"task id {self.id!r} is not safe as a file name")
        if not isinstance(self.parent, str | os.PathLike) or not str(self.parent):
            raise ConfigError(f"task {self.id}: fork needs the parent's log path")
        if isinstance(self.at, bool) or not isinstance(self.at, int) or self.at < 1:
            raise ConfigError(f"task {self.id}: at must be a turn number (1, 2, ...)")
        if not isinstance(self.rerun, bool):
            raise ConfigError(f"task {self.id}: rerun must be true or false")
        if self.replay not in REPLAY_MODES:
            modes = ", ".join(REPLAY_MODES)
            raise ConfigError(f"task {self.id}: replay must be one of {modes}, not {self.replay!r}")
        if self.messages is not None:
            if isinstance(self.messages, str):
                raise ConfigError(f"task {self.id}: messages must be a list of strings")
            object.__setattr__(self, "messages", tuple(self.messages))
            if not all(isinstance(m, str) for m in self.messages):
                raise ConfigError(f"task {self.id}: every message must be a string")
        object.__setattr__(self, "turns", tuple(self.turns))
        object.__setattr__(self, "config", flatten_settings(self.config, f"task {self.id}"))
        if self.target is not None:
            parse_target(self.target, f"task {self.id}")

    def resolve(self) -> ForkTask:
        """This task with :attr:`turns` read from the parent (read-only, no lock): turn
        ``at``'s message with ``rerun``, then :attr:`messages` or the parent's own later ones.

        Raises:
            ConfigError: the parent cannot be read, has no turn ``at``, or the fork would have
                no turn to run.
        """
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with Session.open(self.parent, read_only=True) as parent:
                    records = parent.records
        except SessionError as exc:
            raise ConfigError(f"task {self.id}: cannot read the parent's log: {exc}") from exc
        users = [r for r in records if isinstance(r, User)]
        if self.at > len(users):
            raise ConfigError(
                f"task {self.id}: the parent {self.parent} has {len(users)} turn(s), no turn "
                f"{self.at}"
            )
        later = self.messages if self.messages is not None else _sent(records, self.at)
        turns = ((users[self.at - 1].content,) if self.rerun else ()) + tuple(later)
        if not turns:
            raise ConfigError(
                f"task {self.id}: nothing to run: the parent has no turn after turn {self.at}; "
                "give messages, or rerun"
            )
        return dataclasses.replace(self, turns=turns)

    def scoring_target(self) -> Target | None:
        """The parsed :attr:`target` (``None`` without one)."""
        return None if self.target is None else parse_target(self.target, f"task {self.id}")


def _sent(records: Sequence[Any], after: int) -> tuple[str, ...]:
    """The user messages of the turns after the ``after``-th ``User`` of ``records``, each
    once: a turn that did not happen (a :data:`RETRIED_OUTCOMES` ``TurnEnd``: its message was
    sent again) is left out."""
    out: list[str] = []
    seen = 0
    current: str | None = None
    for record in records:
        if isinstance(record, User):
            seen += 1
            current = record.content if seen > after else None
            if current is not None:
                out.append(current)
        elif isinstance(record, TurnEnd) and current is not None:
            if record.outcome in RETRIED_OUTCOMES:
                out.pop()
            current = None
    return tuple(out)


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
    task: Task | ForkTask
    settings: Mapping[str, Any]
    _resolved: list[tuple[Config, Config]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )  # (base, config) of the last config(): a run's settings are resolved once per base

    def config(self, base: Config) -> Config:
        """``base`` with the task's overrides, then the run's settings, applied (worked out
        once per ``base``: later calls with the same object give the same config).

        Raises:
            ConfigError: an unknown key or a value of the wrong type or range.
        """
        for known, config in self._resolved:
            if known is base:
                return config
        config = self._resolve(base)
        self._resolved[:] = [(base, config)]
        return config

    def _resolve(self, base: Config) -> Config:
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


def load_tasks(source: Any) -> list[Task | ForkTask]:
    """Tasks from a JSON Lines file, a pandas DataFrame, or an iterable of tasks or mappings.

    A mapping (a JSON line, a DataFrame row) has ``id`` and ``messages`` (a list of strings)
    or ``message`` (one string), and optionally ``system``, ``tools``, ``config``, ``target``:
    a :class:`Task`. One with ``fork`` (the parent's log) and ``at`` (its turn), and optionally
    ``rerun``, ``replay``, ``messages``, ``config``, ``target``, is a :class:`ForkTask`; in a
    file, a relative ``fork`` path is read from the file's folder.

    Raises:
        ConfigError: the file cannot be read, a line is not a JSON object, a task is
            malformed, or two tasks share an id (the message names file and line or task).
    """
    rows: Iterable[Any]
    where = "tasks"
    folder: Path | None = None
    if isinstance(source, str | os.PathLike):
        where = str(source)
        folder = Path(source).parent
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
    tasks: list[Task | ForkTask] = []
    for number, row in enumerate(rows, 1):
        task = (
            row if isinstance(row, Task | ForkTask) else _task_of(row, f"{where}:{number}", folder)
        )
        tasks.append(task)
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise ConfigError(f"{where}: two tasks have the id {task.id!r}")
        seen.add(task.id)
    return tasks


_FORK_FIELDS = {"id", "fork", "at", "rerun", "replay", "messages", "config", "target"}


def _task_of(row: Any, where: str, folder: Path | None = None) -> Task | ForkTask:
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: a task must be an object, not {type(row).__name__}")
    if "fork" in row:
        return _fork_task_of(row, where, folder)
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


def _fork_task_of(row: Mapping[str, Any], where: str, folder: Path | None) -> ForkTask:
    unknown = set(row) - _FORK_FIELDS
    if unknown:
        raise ConfigError(f"{where}: unknown fork task fields {sorted(unknown)}")
    parent = row.get("fork")
    if not isinstance(parent, str) or not parent:
        raise ConfigError(f"{where}: fork must be the parent's log path")
    if folder is not None and not Path(parent).is_absolute():
        parent = str(folder / parent)
    messages = row.get("messages")
    replay = row.get("replay", "off")
    if isinstance(replay, bool):
        replay = "on" if replay else "off"
    try:
        return ForkTask(
            id=row.get("id"),  # type: ignore[arg-type]  # checked by ForkTask
            parent=parent,
            at=row.get("at"),  # type: ignore[arg-type]  # checked by ForkTask
            rerun=row.get("rerun", False),
            replay=replay,
            messages=None if messages is None else messages,
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


def expand(
    tasks: Sequence[Task | ForkTask],
    grid: Mapping[str, Sequence[Any]] | None = None,
    base: Config | None = None,
) -> list[RunSpec]:
    """Every task under every combination of the grid's values, task by task.

    Args:
        tasks: the tasks.
        grid: dotted config keys to lists of values (or nested, see :func:`flatten_settings`);
            ``None`` or ``{}``: one run per task.
        base: the config the runs' settings go on (default ``Config()``); each run's config
            is resolved here, once (:meth:`RunSpec.config` of the same object gives it).

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
    base = base if base is not None else Config()
    runs: list[RunSpec] = []
    for task in tasks:
        for combo in itertools.product(*(flat[k] for k in keys)):
            settings = dict(zip(keys, combo, strict=True))
            run_id = task.id
            if settings:
                canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"))
                run_id += "." + hashlib.sha256(canonical.encode()).hexdigest()[:8]
            spec = RunSpec(id=run_id, task=task, settings=settings)
            spec.config(base)
            runs.append(spec)
    return runs
