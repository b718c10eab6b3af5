"""Reading checkpoints: parse and validate the header, then read tensors by offset.

Nothing here unpickles or evaluates file contents: the header is JSON, parsed by the reference
implementation's rules (`safetensors_header`), and tensors are raw bytes interpreted with dtypes
from a fixed allow-list (`DTYPES`), never looked up by name elsewhere. Every failure to read a
file is a `CheckpointError` naming the file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import numpy as np

from treemod._saving.atomic_file import special_file_kind
from treemod._saving.errors import CheckpointError
from treemod._saving.file_objects import check_file_object
from treemod._saving.safetensors_dtypes import CODE_TO_NAME, DTYPES, storage
from treemod._saving.safetensors_header import MAX_HEADER_BYTES, HeaderError, parse_header
from treemod._saving.safetensors_write import FORMAT, VERSION, TensorInfo, header_digest

__all__ = ["Reader", "check_readable", "open_checkpoint", "seekable"]

_CHUNK = 1 << 24


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """There is no checkpoint file at the path (both a `CheckpointError` and a
    `FileNotFoundError`, so either `except` finds it)."""


def _label(source: Any) -> str:
    if isinstance(source, str | os.PathLike):
        return f"'{os.fspath(source)}'"
    name = getattr(source, "name", None)
    return f"'{name}'" if isinstance(name, str) else f"<{type(source).__name__}>"


def _sniff(first: bytes) -> str:
    """A hint about what a file that is not a checkpoint is, from its first bytes."""
    if first[:1] == b"\x80" and first[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return (
            " It is a Python pickle. treemod never unpickles files: loading a pickle can run "
            "arbitrary code. Load it with the tool that wrote it, if you trust it, and save it "
            "again with treemod.save."
        )
    if first[:4] == b"PK\x03\x04":
        return (
            " It is a zip archive (a PyTorch .pt/.bin file?); these hold pickles, which treemod "
            "never loads. Convert it with safetensors.torch.save_file (see the docs page "
            "'Saving and loading')."
        )
    if first[:6] == b"\x93NUMPY":
        return (
            " It is a sequence of NumPy .npy records, the format of "
            "treemod.compat.equinox.tree_serialise_leaves: read it with "
            "treemod.compat.equinox.tree_deserialise_leaves(path, like)."
        )
    return ""


def seekable(f: Any) -> bool:
    """Whether the file object `f` can seek (a pipe or a socket cannot)."""
    try:
        return bool(f.seekable()) if hasattr(f, "seekable") else True
    except (OSError, ValueError):
        return False


class Reader:
    """An open checkpoint: the parsed, validated header, and tensor reads by offset.

    A non-seekable stream (a pipe, a socket) is read once, front to back: its tensors' bytes
    are held in memory until the checkpoint is loaded.
    """

    def __init__(self, f: IO[bytes], label: str, whole_file: bool, allow_foreign: bool):
        self.f = f
        self.label = label
        can_seek = seekable(f)
        start = f.tell() if can_seek else 0
        first = self._read(8)
        if len(first) < 8:
            raise CheckpointError(
                f"{label} is not a treemod checkpoint: it is {len(first)} bytes long, too short "
                "for a header (the file is empty or truncated)."
            )
        (n,) = struct.unpack("<Q", first)
        if can_seek:
            f.seek(0, os.SEEK_END)
            size = f.tell() - start
            f.seek(start + 8)
            if n > size - 8 or n < 2:
                raise CheckpointError(
                    f"{label} is not a treemod checkpoint: its first 8 bytes say the header is "
                    f"{n} bytes long, but the file has {size} bytes (the file is truncated or is "
                    f"not a checkpoint).{_sniff(first)}"
                )
        if n > MAX_HEADER_BYTES:
            raise CheckpointError(
                f"{label} is not a treemod checkpoint: its first 8 bytes say the header is {n:,} "
                f"bytes long, more than the {MAX_HEADER_BYTES:,} bytes safetensors allows."
                f"{_sniff(first)}"
            )
        raw = self._read(n)
        if len(raw) < n:
            raise CheckpointError(
                f"{label} is truncated: its header should be {n} bytes long, but the stream "
                f"ends after {len(raw)}."
            )
        try:
            table, meta, entries, end = parse_header(raw)
        except HeaderError as e:
            raise CheckpointError(f"{label} is corrupted or not a checkpoint: {e}.") from None
        if can_seek:
            self.data_start = start + 8 + n
            self.data_size = size - 8 - n
        else:  # read the data now, once: a pipe cannot seek back to it
            data = self._read(end)
            if len(data) < end:
                raise CheckpointError(
                    f"{label} is truncated: its tensors take {end} bytes, but the stream ends "
                    f"after {len(data)}."
                )
            self.f = io.BytesIO(data)
            self.data_start, self.data_size = 0, end
        if end > self.data_size:
            raise CheckpointError(
                f"{label} is truncated: its tensors take {end} bytes, but the file holds only "
                f"{self.data_size} bytes of data."
            )
        if whole_file and end != self.data_size:
            raise CheckpointError(
                f"{label} is corrupted: its tensors take {end} bytes but the file holds "
                f"{self.data_size} bytes of data (bytes were appended to the file)."
            )
        self.end = end
        self.entries = entries
        self.metadata: dict[str, str] = meta
        marked = sorted(k for k in meta if k.startswith("treemod."))
        self.foreign = not marked
        if self.foreign and not allow_foreign:
            raise CheckpointError(
                f"{label} is a safetensors file but not a treemod checkpoint (its metadata has "
                "no 'treemod.format' marker), so it has no checksums. To load weights written "
                "by another tool (e.g. safetensors.torch.save_file), pass allow_foreign=True."
            )
        if not self.foreign:
            self._check_treemod(table, meta, marked)
        dtypes = self.json_metadata("treemod.dtypes", {})
        self.digests: dict[str, str] = self.json_metadata("treemod.sha256", {})
        self.tensors = {name: self._info(name, entry, dtypes) for name, entry in entries.items()}

    def _read(self, n: int) -> bytes:
        """Up to `n` bytes (fewer only at the end of the file), as bytes."""
        parts = []
        while n > 0:
            part: bytes | str
            try:
                part = self.f.read(min(n, _CHUNK))
            except UnicodeDecodeError:
                part = ""
            except OSError as e:
                raise CheckpointError(f"{self.label} could not be read: {e}") from e
            if isinstance(part, str):
                raise CheckpointError(
                    f"{self.label} is opened in text mode; checkpoints are binary: open it with "
                    "open(path, 'rb')."
                )
            if not part:
                break
            parts.append(part)
            n -= len(part)
        return b"".join(parts)

    def _check_treemod(
        self, table: dict[str, Any], meta: dict[str, str], marked: list[str]
    ) -> None:
        label = self.label
        marker = meta.get("treemod.format")
        if marker != FORMAT:
            raise CheckpointError(
                f"{label} is a damaged treemod checkpoint: its metadata has treemod entries "
                f"({', '.join(marked[:4])}{', ...' if len(marked) > 4 else ''}) but its format "
                f"marker 'treemod.format' is {'missing' if marker is None else repr(marker)}. "
                "It cannot be trusted; load an earlier copy."
            )
        version = meta.get("treemod.version", "")
        if not (version.isascii() and version.isdigit() and len(version) < 10):
            raise CheckpointError(
                f"{label} is corrupted: its format version {version!r} is not a number."
            )
        if int(version) > VERSION:
            raise CheckpointError(
                f"{label} has checkpoint format version {version}, newer than this "
                f"treemod reads (version {VERSION}). Upgrade treemod to load it."
            )
        if meta.get("treemod.header_sha256") != header_digest(table, meta):
            raise CheckpointError(
                f"{label} is corrupted: the header checksum does not match (tensor names, "
                "shapes, offsets or saved values were altered)."
            )

    def json_metadata(self, key: str, default: Any) -> Any:
        """A JSON-encoded `__metadata__` entry, checked to be an object."""
        if key not in self.metadata:
            if self.foreign:
                return default
            raise CheckpointError(f"{self.label} is corrupted: its metadata lacks {key!r}.")
        try:
            value = json.loads(self.metadata[key])
        except (ValueError, RecursionError) as e:  # JSONDecodeError, or a 5000-digit integer
            raise CheckpointError(
                f"{self.label} is corrupted: metadata {key!r} is not valid JSON ({e})."
            ) from None
        if not isinstance(value, dict):
            raise CheckpointError(f"{self.label} is corrupted: metadata {key!r} is not an object.")
        return value

    def _info(self, name: str, entry: Any, dtypes: dict[str, Any]) -> TensorInfo:
        bad = f"{self.label} is corrupted: the header entry of tensor {name!r}"
        code, shape = entry.code, list(entry.shape)
        if code not in CODE_TO_NAME:
            raise CheckpointError(
                f"{self.label}: tensor {name!r} has dtype {code}, a safetensors dtype that "
                "treemod does not read (convert it to another dtype with the tool that wrote it)."
            )
        real = dtypes.get(name, CODE_TO_NAME[code])
        if not isinstance(real, str) or real not in DTYPES:
            raise CheckpointError(f"{bad} names an unknown dtype {real!r}.")
        real_shape = entry.shape
        if real != CODE_TO_NAME[code]:
            candidates = (tuple(shape), tuple(shape[:-1]))
            fits = [c for c in candidates if storage(real, c) == (code, shape)]
            if not fits:
                raise CheckpointError(f"{bad} stores {code}{shape}, which cannot hold {real} data.")
            real_shape = fits[0]
        if not self.foreign and not isinstance(self.digests.get(name), str):
            raise CheckpointError(f"{self.label} is corrupted: tensor {name!r} has no checksum.")
        return TensorInfo(name, DTYPES[real], real_shape, entry.begin, entry.end)

    def read_bytes(self, info: TensorInfo) -> np.ndarray:
        """Read one tensor's bytes into a new host buffer (not yet checked: see `check`)."""
        buf = np.empty(info.end - info.begin, np.uint8)
        try:
            self.f.seek(self.data_start + info.begin)
            # `IO` leaves out `readinto`, which binary files (buffered or raw) have.
            got = self.f.readinto(buf.data)  # type: ignore[attr-defined]
        except OSError as e:
            raise CheckpointError(
                f"{self.label} could not be read (tensor {info.name!r}): {e}"
            ) from e
        if got != buf.size:
            raise CheckpointError(
                f"{self.label} is truncated: tensor {info.name!r} is cut short while reading."
            )
        return buf

    def check(self, info: TensorInfo, buf: np.ndarray) -> None:
        """Raise if the bytes of a tensor do not match its checksum (thread-safe)."""
        if not self.foreign and hashlib.sha256(buf.data).hexdigest() != self.digests[info.name]:
            raise CheckpointError(
                f"{self.label} is corrupted: the checksum of tensor {info.name!r} does not "
                "match its data."
            )

    @staticmethod
    def as_array(info: TensorInfo, buf: np.ndarray) -> np.ndarray:
        """View a tensor's bytes as an array of its dtype and shape."""
        array = buf.view(info.dtype).reshape(info.shape)
        if sys.byteorder == "big":  # pragma: no cover
            array = array.byteswap()
        return array


def check_readable(source: Any, label: str, caller: str) -> None:
    """Refuse, naming the file, a file object that cannot be read as a binary checkpoint:
    text mode, closed, not open for reading, or not a file at all."""
    if not hasattr(source, "read"):
        hint = " (checkpoint bytes in memory: wrap them, io.BytesIO(data))" * isinstance(
            source, bytes | bytearray | memoryview
        )
        raise TypeError(
            f"{caller}: expected a path or a binary file opened for reading, got "
            f"{type(source).__name__}{hint}."
        )
    check_file_object(source, label, caller, "read")


@contextmanager
def open_checkpoint(
    source: str | os.PathLike[str] | IO[bytes], allow_foreign: bool
) -> Iterator[Reader]:
    """Open and validate a checkpoint (a path, or a binary file positioned at its start)."""
    label = _label(source)
    if isinstance(source, str | os.PathLike):
        try:
            mode = os.stat(source).st_mode
        except OSError:
            mode = stat.S_IFREG  # missing or unreadable: open() below says which
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            # Opening a FIFO would block until a writer came; a device is never a checkpoint.
            raise CheckpointError(
                f"load: {label} is a {special_file_kind(mode)}, not a checkpoint file. Load "
                "from a regular file, or open the stream yourself and pass the file object."
            )
        try:
            f: IO[bytes] = open(source, "rb")
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"load: there is no checkpoint file {label}.") from None
        except IsADirectoryError:
            raise CheckpointError(
                f"load: {label} is a directory, not a checkpoint file (a treemod checkpoint is "
                "one file; an Orbax checkpoint is a directory, for Orbax to read)."
            ) from None
        except OSError as e:
            raise CheckpointError(f"load: cannot open {label}: {e.strerror or e}.") from e
        with f:
            yield Reader(f, label, whole_file=True, allow_foreign=allow_foreign)
    else:
        check_readable(source, label, "load")
        reader = Reader(source, label, whole_file=False, allow_foreign=allow_foreign)
        yield reader
        if reader.f is source:
            # Leave the file just after the checkpoint, so that several can be read in turn.
            source.seek(reader.data_start + reader.end)
