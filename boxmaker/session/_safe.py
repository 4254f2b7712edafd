"""Opening the files boxmaker writes without following links planted by someone else.

A sessions or batch folder may be shared (a shared temporary folder, the shared file system
Ray needs): anyone who can write into it could plant ``<log>.writer``, ``<log>.upgrade``,
``<log>.torn``, ``manifest.ndjson`` or a log as a symbolic link to a file of the user, and
a writer that follows it would overwrite or append to that file. So every file boxmaker writes
is opened here:

- :func:`open_owned`: an existing or new file, opened with ``O_NOFOLLOW`` (a link at the path
  is refused, ``ELOOP``), then checked with ``fstat`` on the open descriptor (no race with the
  path): a regular file owned by this user (the effective uid).
- :func:`open_fresh`: a new file only (``O_CREAT | O_EXCL | O_NOFOLLOW``), after removing
  whatever is at the path (``unlink`` removes a link, never its target): for the side files
  only the log's writer makes (``.writer``, ``.upgrade``).
- :func:`check_folder`: a folder boxmaker writes into is created when missing; one that is a
  link owned by another user (not root) is refused, as is a path that is not a folder.

Errors are :class:`~boxmaker.errors.SessionError` naming the path and what was found.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from ..errors import SessionError

__all__ = ["check_folder", "open_fresh", "open_owned"]


def open_owned(path: Path, flags: int, *, what: str = "file") -> int:
    """``os.open(path, flags | O_NOFOLLOW | O_CLOEXEC, 0o644)``, refusing a link, a file that
    is not regular or one owned by another user.

    Args:
        path: the file.
        flags: the ``os.O_*`` flags (``O_CREAT``, ``O_EXCL``, ``O_APPEND``... as needed).
        what: names the file in error messages ("session log", "batch manifest").

    Returns:
        The open descriptor (the caller closes it).

    Raises:
        SessionError: the path is a symbolic link, not a regular file, or owned by another
            uid. Other ``OSError`` of ``os.open`` (``FileExistsError``, ``FileNotFoundError``,
            ``PermissionError``) propagate as they are, for the caller to word.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SessionError(
                f"{path}: the {what} is a symbolic link; boxmaker does not write through links "
                "(someone may have planted it in a shared folder)"
            ) from exc
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SessionError(f"{path}: the {what} is not a regular file")
        if info.st_uid != os.geteuid():
            raise SessionError(
                f"{path}: the {what} is owned by uid {info.st_uid}, not by this user "
                f"(uid {os.geteuid()}); boxmaker writes only its user's files"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_fresh(path: Path, *, what: str = "file") -> int:
    """A new, empty file at ``path`` for writing: whatever is there is removed first (a link is
    removed, not followed), then ``O_CREAT | O_EXCL | O_NOFOLLOW``.

    Only for side files the caller alone may make (it holds the log's lock), so what it finds
    there is stale or planted.

    Raises:
        SessionError: as :func:`open_owned`.
        OSError: the file cannot be removed or made (``FileExistsError`` when another process
            made one in between).
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return open_owned(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, what=what)


def check_folder(folder: Path, *, what: str = "folder") -> None:
    """Make ``folder`` (and its parents) when missing; refuse it when it is a symbolic link
    owned by another user (not root) or not a folder.

    Raises:
        SessionError: it cannot be made, it is a link of another user, or not a folder.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        info = folder.lstat()
    except OSError as exc:
        raise SessionError(f"{folder}: cannot create the {what}: {exc}") from exc
    if stat.S_ISLNK(info.st_mode) and info.st_uid not in (os.geteuid(), 0):
        raise SessionError(
            f"{folder}: the {what} is a symbolic link owned by uid {info.st_uid}, not by this "
            "user; boxmaker does not write through another user's links"
        )
    if not folder.is_dir():
        raise SessionError(f"{folder}: the {what} is not a folder")
