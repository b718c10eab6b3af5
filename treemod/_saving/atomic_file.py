"""Replacing a file atomically: a temporary beside it, fsynced, then renamed over it.

The temporary is named `.<name>.tmp-<pid>-<host>-<random>` (`<host>`: 8 hex digits of a hash of
the machine's name), in the directory of the file, so that a later save can recognise the
temporaries that earlier saves to the same path left when they were killed, and remove them:
those of a process of this machine that no longer runs, and any untouched for a day (a process
on another machine sharing the directory). Nothing else is ever removed.

Saving to a symbolic link writes the file it points to (the link stays), and re-saving over an
existing file keeps its permission bits (a private 0600 checkpoint stays private; a new file
gets the umask's). The temporary is created private (0600) when the file exists, so the data is
never readable by more users than the file it replaces.

Only a regular file is ever replaced: a device, FIFO or socket at the path (or at the end of a
symbolic link) is refused, since renaming over `/dev/null` would replace the machine's device
with a file. A file the user may not write (a checkpoint made read-only to keep it) is refused
as `open(path, "wb")` refuses it; root may write it, as with `open`. A name too long for the
temporary's decorations gets a temporary named from a shortened stem plus a hash of the full
name, so any name that fits the file system can be saved.

Files that belong together (an adapter's config and weights) are written with
`replace_set_atomically`: every temporary is written and fsynced before the first rename, and
the old files are kept as hard links until the last rename succeeded (put back if one fails),
so an interrupted save leaves the old set whole.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
import stat
import time
from collections.abc import Callable, Sequence
from typing import IO

from treemod._saving.errors import CheckpointError

__all__ = [
    "STALE_AFTER_S",
    "replace_atomically",
    "replace_set_atomically",
    "special_file_kind",
    "temporary_name",
]

STALE_AFTER_S = 24 * 3600  # a temporary untouched this long is stale whatever wrote it
_HOST = hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


# What a temporary adds to its stem: "." + ".tmp-" + pid (<= 10) + "-" + host + "-" + 12 hex.
_DECORATION = 1 + 5 + 10 + 1 + 8 + 1 + 12
_NAME_MAX = 255  # every common file system's limit on one name, in bytes


def _stem(base: str) -> str:
    """The part of a temporary's name that stands for `base`: `base` itself when it fits,
    otherwise a prefix of it and a hash of the whole name (unique per base, fits NAME_MAX)."""
    encoded = base.encode("utf-8", "surrogateescape")
    if len(encoded) + _DECORATION <= _NAME_MAX:
        return base
    digest = hashlib.sha256(encoded).hexdigest()[:16]
    room = _NAME_MAX - _DECORATION - len(digest) - 1
    prefix = encoded[:room].decode("utf-8", "ignore")  # never split a character
    return f"{prefix}~{digest}"


def temporary_name(base: str) -> str:
    """A fresh temporary's name for the file `base` (its basename)."""
    return f".{_stem(base)}.tmp-{os.getpid()}-{_HOST}-{secrets.token_hex(6)}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # it exists (another user's), or cannot be told: keep its file
    return True


def _remove_stale(directory: str, base: str) -> None:
    """Remove the temporaries that killed saves to `base` left (see the module docstring)."""
    stem = _stem(base)
    pattern = re.compile(rf"\.{re.escape(stem)}\.tmp-(\d{{1,10}})-([0-9a-f]{{8}})-[0-9a-f]{{12}}")
    prefix = f".{stem}.tmp-"
    now = time.time()
    try:
        with os.scandir(directory) as entries:
            names = [e.name for e in entries if e.name.startswith(prefix)]
    except OSError:
        return
    for name in names:
        match = pattern.fullmatch(name)
        if match is None:
            continue
        pid, host = int(match.group(1)), match.group(2)
        full = os.path.join(directory, name)
        try:
            info = os.lstat(full)
            if not stat.S_ISREG(info.st_mode):
                continue
            dead = host == _HOST and pid != os.getpid() and not _alive(pid)
            if dead or now - info.st_mtime > STALE_AFTER_S:
                os.unlink(full)
        except OSError:
            continue  # removed meanwhile, or not ours to remove


def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows, where directories cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def special_file_kind(mode: int) -> str:
    """What a file that is not regular is, for messages ('character device', ...)."""
    for test, name in (
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def _check_replaceable(path: str, target: str, info: os.stat_result, caller: str) -> None:
    """Refuse to replace anything but a regular file the user may write."""
    via = "" if target == os.path.abspath(path) else f" (through the link to '{target}')"
    if not stat.S_ISREG(info.st_mode):
        kind = special_file_kind(info.st_mode)
        raise CheckpointError(
            f"{caller}: refusing to write '{path}'{via}: it is a {kind}, not a regular file, "
            "and saving replaces the file at the path. Save to a regular file "
            "(or pass an open binary file object to write into a stream)."
        )
    effective = os.access in os.supports_effective_ids
    if not os.access(target, os.W_OK, effective_ids=effective):
        raise PermissionError(
            f"{caller}: cannot write '{path}'{via}: the file is read-only for this user "
            f"(mode {stat.filemode(info.st_mode)}). Make it writable (chmod u+w) to replace it "
            "on purpose, or save to another path."
        )


def _create_temporary(path: str, caller: str) -> tuple[str, str, int, int | None]:
    """Check that `path` may be replaced and create its temporary beside it (see the module
    docstring). Returns `(target, temporary, fd, mode)`: the file the path names (links
    followed), the temporary's path, its open descriptor, and the old file's permission bits
    (`None` for a new file)."""
    target = os.path.realpath(path)  # write through symbolic links
    directory, base = os.path.split(target)
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"{caller}: cannot write '{path}': the directory '{directory}' does not exist. "
            "Create it first (os.makedirs(directory, exist_ok=True))."
        )
    if os.path.isdir(target):
        raise IsADirectoryError(f"{caller}: cannot write '{path}': it is a directory.")
    try:
        info: os.stat_result | None = os.stat(target)
    except OSError:
        info = None  # a new file: the umask decides (open with 0o666)
    mode = None if info is None else stat.S_IMODE(info.st_mode)
    if info is not None:
        _check_replaceable(path, target, info, caller)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = os.path.join(directory, temporary_name(base))
        try:
            fd = os.open(tmp, flags, 0o666 if mode is None else 0o600)
            break
        except FileExistsError:
            continue
    if mode is not None and hasattr(os, "fchmod"):
        try:
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
    return target, tmp, fd, mode


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def replace_atomically(path: str, write: Callable[[IO[bytes]], None], caller: str = "save") -> None:
    """Write a file with `write(f)` and put it at `path` in one rename.

    Arguments:
        path: where the file goes; a symbolic link is followed to the file it names.
        write: writes the contents to a binary file (seekable).
        caller: the public function that saves, named in the errors.
    """
    target, tmp, fd, _ = _create_temporary(path, caller)
    directory, base = os.path.split(target)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    _fsync_directory(directory)
    _remove_stale(directory, base)


def replace_set_atomically(
    files: Sequence[tuple[str, Callable[[str], object]]], caller: str = "save"
) -> None:
    """Write several files that belong together (a config and its weights) so that a failure
    at any point leaves the old set whole: every new file is written to its temporary and
    fsynced first (`write(temporary_path)` writes one: a writer that takes a path, such as
    `safetensors.numpy.save_file`); only then are they renamed into place, the old files kept
    as hard links until all renames succeeded and put back if one fails.

    Arguments:
        files: `(path, write)` pairs, written and renamed in this order.
        caller: the public function that saves, named in the errors.
    """
    made: list[tuple[str, str]] = []  # (target, temporary)
    try:
        for path, write in files:
            target, tmp, fd, _ = _create_temporary(path, caller)
            os.close(fd)
            made.append((target, tmp))
            write(tmp)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except BaseException:
        for _, tmp in made:
            _unlink_quietly(tmp)
        raise
    backups: dict[str, str | None] = {}  # target -> a hard link to its old file, if any
    done: list[str] = []
    try:
        for target, _ in made:
            backup: str | None = None
            if os.path.exists(target):
                directory, base = os.path.split(target)
                backup = os.path.join(directory, temporary_name(base))
                try:
                    os.link(target, backup)
                except OSError:
                    backup = None  # no hard links here: the old file cannot be put back
            backups[target] = backup
        for target, tmp in made:
            os.replace(tmp, target)
            done.append(target)
    except BaseException:
        for target in reversed(done):  # put the old set back
            old = backups.get(target)
            try:
                if old is not None:
                    os.rename(old, target)
                else:
                    os.unlink(target)
            except OSError:
                pass
        for _, tmp in made:
            _unlink_quietly(tmp)
        for old in backups.values():
            if old is not None:
                _unlink_quietly(old)
        raise
    for old in backups.values():
        if old is not None:
            _unlink_quietly(old)
    for directory in {os.path.dirname(target) for target, _ in made}:
        _fsync_directory(directory)
    for target, _ in made:
        _remove_stale(*os.path.split(target))
