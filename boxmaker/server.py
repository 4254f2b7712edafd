"""An embedded llama.cpp HTTP server for offline use, on loopback only.

llama.cpp's own server (the code of ``llama-server``) runs inside this Python process through
the PyPI package ``xllamacpp``: it loads a GGUF model and answers the OpenAI-compatible
``/v1/chat/completions`` and llama.cpp's own endpoints (``/health``, ``/slots``, ``/props``,
``/apply-template``, ``/tokenize``...) on ``http://127.0.0.1:PORT``. The chat template comes
from the model file (``tokenizer.chat_template``) and is run with llama.cpp's jinja engine.

Example::

    from boxmaker.server import EmbeddedServer

    with EmbeddedServer(n_ctx=4096) as server:      # the shipped tiny model
        print(server.url)                            # http://127.0.0.1:40123
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from .errors import ServerError
from .model import default_model_path

__all__ = ["AUTO_SLOTS", "LIMITS", "REASONING_FORMATS", "EmbeddedServer", "check_param"]

_HOST = "127.0.0.1"
_QUIET_VERBOSITY = -1
_VERBOSE_VERBOSITY = 3

LIMITS: dict[str, tuple[int, int]] = {
    "n_ctx": (16, 1 << 24),
    "n_parallel": (1, 256),
    "n_threads": (1, 512),
    "port": (0, 65_535),
    "cache_ram_mib": (-1, 1 << 30),
    "ctx_checkpoints": (0, 1 << 16),
}
"""Inclusive bounds of the server's numeric parameters, checked before llama.cpp sees them:
llama.cpp aborts the whole process (an assert and a backtrace) on ``n_threads = 0`` or
``n_ctx = 1`` and hangs on ``n_parallel = 0``. 512 threads is ggml's ``GGML_MAX_N_THREADS``,
256 slots llama.cpp's ``LLAMA_MAX_SEQ``; ``n_ctx`` is in tokens (16 M is far beyond any model's
training context); ``cache_ram_mib`` in MiB (-1: no limit, 0: off); ``ctx_checkpoints`` per
slot."""

AUTO_SLOTS = 4
"""Slots llama-server makes when ``-np`` is not given (its ``-np -1``, "auto"), with a unified
KV cache (``common/arg.cpp`` of llama.cpp; its log says "n_parallel is set to auto, using
n_parallel = 4 and kv_unified = true")."""


def check_param(name: str, value: int) -> None:
    """Check one numeric server parameter against :data:`LIMITS`.

    Args:
        name: ``"n_ctx"``, ``"n_parallel"``, ``"n_threads"`` or ``"port"``.
        value: the value to check.

    Raises:
        ServerError: ``value`` is not an int (bools are refused) or is outside the bounds; the
            message names the parameter, the value and the bounds.
    """
    low, high = LIMITS[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ServerError(f"{name} = {value!r} is out of range: it must be from {low} to {high}")


# Serialises model loading: two servers loading at once in one process share llama.cpp's
# global backend state.
_import_lock = threading.Lock()


def _resolve_model(model_path: str | os.PathLike[str] | None) -> Path:
    if model_path is None:
        return default_model_path()
    return Path(model_path)


REASONING_FORMATS = {
    "none": "COMMON_REASONING_FORMAT_NONE",
    "auto": "COMMON_REASONING_FORMAT_AUTO",
    "deepseek-legacy": "COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY",
    "deepseek": "COMMON_REASONING_FORMAT_DEEPSEEK",
}
"""llama-server ``--reasoning-format`` names -> xllamacpp's ``common_reasoning_format``."""


class EmbeddedServer:
    """llama.cpp's HTTP server running in this process (``xllamacpp``), on 127.0.0.1.

    Args:
        model_path: GGUF file to serve; ``None`` serves the shipped tiny model
            (:func:`boxmaker.model.default_model_path`).
        n_ctx: context size in tokens (llama-server's ``-c``): the KV cache of all slots
            together. With a unified KV cache every slot may use up to ``n_ctx`` tokens of
            that shared pool; without, each slot gets ``n_ctx / n_parallel``.
        n_parallel: number of slots (``-np``); ``None`` is llama-server's default ("auto"):
            :data:`AUTO_SLOTS` slots with a unified KV cache.
        kv_unified: one KV pool for all slots (``--kv-unified`` / ``--no-kv-unified``);
            ``None`` is llama-server's rule: on when ``n_parallel`` is auto, off otherwise.
        cache_ram_mib: the cross-request prompt cache in RAM, in MiB (``--cache-ram``;
            llama-server's default 8192; ``0`` turns it off, ``-1`` no limit): a prompt seen
            earlier on any slot can be restored from it, so reuse may exceed what the slot held.
        swa_full: a full-size KV cache for sliding-window attention models (``--swa-full``,
            default off). Off, a sliding-window model (Gemma 3) can reuse little of a slot's
            cache and restores a context checkpoint instead (forensics cause ``checkpoint``).
        ctx_checkpoints: context checkpoints kept per slot (``--ctx-checkpoints``); ``None``
            keeps llama.cpp's default.
        reasoning_preserve: keep the reasoning of every earlier assistant turn in the prompt
            for templates that support it (``--reasoning-preserve`` /
            ``--no-reasoning-preserve``; llama-server's default on). Off, such a template drops
            earlier reasoning, which re-renders history (forensics cause
            ``history_rewritten``).
        n_threads: CPU threads for generation and prompt processing; ``None`` lets llama.cpp
            choose (all cores).
        port: TCP port on 127.0.0.1; ``0`` picks a free one (read it from :attr:`url`).
        startup_timeout_s: seconds :meth:`start` waits for ``GET /health`` to answer
            ``{"status": "ok"}``.
        verbose: keep llama.cpp's log on stderr; when ``False`` only errors are logged.
        reasoning_format: llama-server's ``--reasoning-format``: ``"deepseek"`` (reasoning
            in ``delta.reasoning_content``), ``"none"`` (``<think>...</think>`` left in
            ``content``), ``"auto"``, ``"deepseek-legacy"``; ``None`` keeps the default.
        api_key: llama-server's ``--api-key`` (requests without it get HTTP 401); ``None``:
            none needed.
        cache_idle_slots: llama-server's ``--cache-idle-slots`` (its default on, with
            ``--cache-ram``): when a slot starts a task, every idle slot is saved to the RAM
            prompt cache and, with a unified KV cache, cleared; a request pinned to the
            cleared slot (boxmaker pins every request to its session's slot) is then not
            reloaded from the RAM cache. Off here: measured on the embedded server's defaults
            (4 slots, unified KV), two and four concurrent sessions lost their whole prompt at
            every turn but the first with it on (0 of 544, then 0 of 605 reused), none with it
            off. llama.cpp still clears an idle slot when the pool needs the room.
        slot_save_path: a folder for saved slots (llama-server's ``--slot-save-path``): with
            it, ``POST /slots/{id}?action=save|restore`` saves a slot's prompt cache to a file
            there and brings it back (:class:`boxmaker.cache.SlotStore`); ``None``: the server
            answers those actions HTTP 501. Created when missing.

    Raises:
        ServerError: ``n_ctx``, ``n_parallel``, ``n_threads`` or ``port`` is outside
            :data:`LIMITS` (checked here, before llama.cpp could abort the process), or
            ``reasoning_format`` is none of the names above.

    Attributes:
        url: ``"http://127.0.0.1:PORT"``, set by :meth:`start` (``""`` before and after).
        model_path: the resolved model path.
        n_parallel, kv_unified: the slots and KV layout as resolved (``4`` and ``True`` for
            the defaults).

    The server stops when :meth:`stop` is called or the object leaves its ``with`` block.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 4096,
        n_parallel: int | None = None,
        n_threads: int | None = None,
        port: int = 0,
        startup_timeout_s: float = 60.0,
        verbose: bool = False,
        reasoning_format: str | None = None,
        api_key: str | None = None,
        kv_unified: bool | None = None,
        cache_ram_mib: int = 8192,
        swa_full: bool = False,
        ctx_checkpoints: int | None = None,
        reasoning_preserve: bool = True,
        slot_save_path: str | os.PathLike[str] | None = None,
        cache_idle_slots: bool = False,
    ) -> None:
        if reasoning_format is not None and reasoning_format not in REASONING_FORMATS:
            raise ServerError(
                f"reasoning_format = {reasoning_format!r} is none of {sorted(REASONING_FORMATS)}"
            )
        self.reasoning_format = reasoning_format
        self.api_key = api_key
        slots = AUTO_SLOTS if n_parallel is None else n_parallel
        checked = {
            "n_ctx": n_ctx,
            "n_parallel": slots,
            "port": port,
            "cache_ram_mib": cache_ram_mib,
        }
        optional = {"n_threads": n_threads, "ctx_checkpoints": ctx_checkpoints}
        checked.update({k: v for k, v in optional.items() if v is not None})
        for name, value in checked.items():
            check_param(name, value)
        self.model_path: Path = _resolve_model(model_path)
        self.n_ctx = n_ctx
        self.n_parallel: int = slots
        self.kv_unified: bool = n_parallel is None if kv_unified is None else kv_unified
        self.cache_ram_mib = cache_ram_mib
        self.swa_full = swa_full
        self.ctx_checkpoints = ctx_checkpoints
        self.reasoning_preserve = reasoning_preserve
        self.cache_idle_slots = cache_idle_slots
        self.slot_save_path = None if slot_save_path is None else Path(slot_save_path)
        self.n_threads = n_threads
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.verbose = verbose
        self.url: str = ""
        self._server: Any = None

    @property
    def running(self) -> bool:
        """Whether the server has been started and not stopped."""
        return self._server is not None

    def _params(self) -> Any:
        import xllamacpp

        params = xllamacpp.CommonParams()
        params.model.path = str(self.model_path)
        params.model_alias = {self.model_path.stem}  # responses name the model, not its path
        params.n_ctx = self.n_ctx
        params.n_parallel = self.n_parallel
        params.kv_unified = self.kv_unified
        params.cache_ram_mib = self.cache_ram_mib
        params.swa_full = self.swa_full
        params.cache_idle_slots = self.cache_idle_slots
        if self.ctx_checkpoints is not None:
            params.n_ctx_checkpoints = self.ctx_checkpoints
        # llama-server's --[no-]reasoning-preserve lands in the template's default kwargs
        # (measured: only this kwarg, not preserve_reasoning_specified, keeps earlier reasoning)
        preserve = "true" if self.reasoning_preserve else "false"
        params.default_template_kwargs = {"preserve_reasoning": preserve}
        params.preserve_reasoning_specified = True
        params.use_jinja = True
        params.hostnames = [_HOST]
        params.port = self.port
        params.verbosity = _VERBOSE_VERBOSITY if self.verbose else _QUIET_VERBOSITY
        if self.reasoning_format is not None:
            member = REASONING_FORMATS[self.reasoning_format]
            params.reasoning_format = getattr(xllamacpp.common_reasoning_format, member)
        if self.api_key is not None:
            params.api_keys = [self.api_key]
        if self.slot_save_path is not None:
            self.slot_save_path.mkdir(parents=True, exist_ok=True)
            # llama-server adds the separator when it parses --slot-save-path; xllamacpp does not
            params.slot_save_path = str(self.slot_save_path) + os.sep
        if self.n_threads is not None:
            params.cpuparams.n_threads = self.n_threads
            params.cpuparams_batch.n_threads = self.n_threads
        return params

    def start(self) -> EmbeddedServer:
        """Load the model, start serving, and wait until ``GET /health`` answers ok.

        Returns:
            ``self``, with :attr:`url` set.

        Raises:
            ServerError: the model file is missing or not a GGUF file, the port is in use
                (each checked before loading, the message naming the path or the port),
                llama.cpp could not load the model or bind the port, or ``/health`` did not
                answer ``{"status": "ok"}`` within ``startup_timeout_s``.
        """
        if self._server is not None:
            return self
        if not self.model_path.is_file():
            raise ServerError(f"model file not found: {self.model_path}")
        _check_gguf(self.model_path)
        if self.port:
            _check_port_free(self.port)
        with _import_lock:
            try:
                import xllamacpp

                server = xllamacpp.Server(self._params())
            except Exception as exc:  # xllamacpp raises plain RuntimeError/ValueError
                port = f"port {self.port}" if self.port else "a free port"
                raise ServerError(
                    f"llama.cpp server failed to start on 127.0.0.1, {port}, with "
                    f"{self.model_path} (a port in use, or a file llama.cpp cannot load): {exc}"
                ) from exc
        address = str(server.listening_address).rstrip("/")
        if not address.startswith("http"):
            address = f"http://{address}"
        self._server = server
        self.url = address
        try:
            self._wait_healthy()
        except BaseException:  # ServerError, or Ctrl-C while waiting: no server left running
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        last = "no answer"
        import httpx  # here, not at the top: the command line reads LIMITS for its --help

        with httpx.Client(timeout=5.0) as client:
            while True:
                try:
                    response = client.get(f"{self.url}/health")
                    if response.status_code == 200 and response.json().get("status") == "ok":
                        return
                    last = f"HTTP {response.status_code}: {response.text[:200]}"
                except (httpx.HTTPError, ValueError) as exc:
                    last = repr(exc)
                if time.monotonic() >= deadline:
                    raise ServerError(
                        f"llama.cpp server at {self.url} not healthy after "
                        f"{self.startup_timeout_s} s (last: {last})"
                    )
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop serving and free the model; idempotent.

        Afterwards the port refuses connections and :attr:`url` is ``""``. xllamacpp stops
        the server when its last reference is dropped, which this does.
        """
        server, self._server = self._server, None
        self.url = ""
        if server is not None:
            del server

    def __enter__(self) -> EmbeddedServer:
        """Start the server (see :meth:`start`) and return it."""
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server (see :meth:`stop`)."""
        self.stop()

    def __repr__(self) -> str:
        state = self.url or "stopped"
        return f"EmbeddedServer({str(self.model_path)!r}, {state})"


def _check_gguf(path: Path) -> None:
    """Raise :class:`ServerError` unless ``path`` starts with GGUF's magic (``b"GGUF"``, the
    format of llama.cpp's ``gguf`` spec): a wrong file fails here with its name, not as a
    start-up error that could as well be a busy port."""
    try:
        with path.open("rb") as file:
            magic = file.read(4)
    except OSError as exc:
        raise ServerError(f"cannot read the model file {path}: {exc}") from exc
    if magic != b"GGUF":
        raise ServerError(
            f"{path} is not a GGUF model file (it starts with {magic!r}, not b'GGUF'): "
            "llama.cpp loads GGUF files only (convert a Hugging Face model with llama.cpp's "
            "convert_hf_to_gguf.py)"
        )


def _check_port_free(port: int) -> None:
    """Raise :class:`ServerError` when ``port`` on 127.0.0.1 is taken (a bind test; the port
    is released at once, so a server started in between can still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as llama-server binds
        try:
            probe.bind((_HOST, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ServerError(
                    f"port {port} on {_HOST} is in use (another server, or an earlier one "
                    "still running): stop it, or pick another port (0 picks a free one)"
                ) from exc
            raise ServerError(f"cannot listen on {_HOST}:{port}: {exc}") from exc
