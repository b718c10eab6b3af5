"""Reading checkpoints: parse and validate the header, then read tensors by offset.

Nothing here unpickles or evaluates file contents: the header is JSON, and tensors are raw bytes
interpreted with dtypes from a fixed allow-list (`DTYPES`), never looked up by name elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import numpy as np

from treemod._saving.errors import CheckpointError
from treemod._saving.safetensors_write import (
    CODE_TO_NAME,
    DTYPES,
    FORMAT,
    VERSION,
    TensorInfo,
    header_digest,
    storage,
)

__all__ = ["Reader", "open_checkpoint"]


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
            " It is NumPy .npy data (Equinox's tree_serialise_leaves writes this); load it with "
            "Equinox and save it again with treemod.save."
        )
    return ""


class Reader:
    """An open checkpoint: the parsed, validated header, and tensor reads by offset."""

    def __init__(self, f: IO[bytes], label: str, whole_file: bool, allow_foreign: bool):
        self.f = f
        self.label = label
        start = f.tell()
        first = f.read(8)
        if len(first) < 8:
            raise CheckpointError(
                f"{label} is not a treemod checkpoint: it is {len(first)} bytes long, too short "
                "for a header (the file is empty or truncated)."
            )
        f.seek(0, os.SEEK_END)
        size = f.tell() - start
        (n,) = struct.unpack("<Q", first)
        if n > size - 8 or n < 2:
            raise CheckpointError(
                f"{label} is not a treemod checkpoint: its first 8 bytes say the header is {n} "
                f"bytes long, but the file has {size} bytes (the file is truncated or is not a "
                f"checkpoint).{_sniff(first)}"
            )
        f.seek(start + 8)
        raw = f.read(n)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise CheckpointError(
                f"{label} is corrupted or not a treemod checkpoint: its header is not valid "
                f"JSON ({e})."
            ) from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{label} is corrupted: its header is not a JSON object.")
        self.data_start = start + 8 + n
        self.data_size = size - 8 - n
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
        ):
            raise CheckpointError(
                f"{label} is corrupted: '__metadata__' must map strings to strings."
            )
        self.metadata: dict[str, str] = meta
        self.foreign = meta.get("treemod.format") != FORMAT
        if self.foreign and not allow_foreign:
            raise CheckpointError(
                f"{label} is a safetensors file but not a treemod checkpoint (its metadata has "
                "no 'treemod.format' marker), so it has no checksums. To load weights written "
                "by another tool (e.g. safetensors.torch.save_file), pass allow_foreign=True."
            )
        if not self.foreign:
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
            if meta.get("treemod.header_sha256") != header_digest(header, meta):
                raise CheckpointError(
                    f"{label} is corrupted: the header checksum does not match (tensor names, "
                    "shapes, offsets or saved values were altered)."
                )
        dtypes = self.json_metadata("treemod.dtypes", {})
        self.digests: dict[str, str] = self.json_metadata("treemod.sha256", {})
        self.tensors = {name: self._parse(name, entry, dtypes) for name, entry in header.items()}
        end = max((t.end for t in self.tensors.values()), default=0)
        if whole_file and not self.foreign and end != self.data_size:
            raise CheckpointError(
                f"{label} is corrupted: its tensors take {end} bytes but the file holds "
                f"{self.data_size} bytes of data (bytes were appended to the file)."
            )

    def json_metadata(self, key: str, default: Any) -> Any:
        """A JSON-encoded `__metadata__` entry, checked to be an object of strings."""
        if key not in self.metadata:
            if self.foreign:
                return default
            raise CheckpointError(f"{self.label} is corrupted: its metadata lacks {key!r}.")
        try:
            value = json.loads(self.metadata[key])
        except (json.JSONDecodeError, RecursionError) as e:
            raise CheckpointError(
                f"{self.label} is corrupted: metadata {key!r} is not valid JSON ({e})."
            ) from None
        if not isinstance(value, dict):
            raise CheckpointError(f"{self.label} is corrupted: metadata {key!r} is not an object.")
        return value

    def _parse(self, name: str, entry: Any, dtypes: dict[str, Any]) -> TensorInfo:
        bad = f"{self.label} is corrupted: the header entry of tensor {name!r}"
        if not isinstance(entry, dict):
            raise CheckpointError(f"{bad} is not an object.")
        code, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if code not in CODE_TO_NAME:
            raise CheckpointError(f"{bad} has an unknown dtype {code!r}.")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise CheckpointError(f"{bad} has an invalid shape {shape!r}.")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise CheckpointError(f"{bad} has invalid data_offsets {offsets!r}.")
        stored = np.dtype(DTYPES[CODE_TO_NAME[code]])
        if offsets[1] - offsets[0] != math.prod(shape) * stored.itemsize:
            raise CheckpointError(
                f"{bad} says data_offsets {offsets} ({offsets[1] - offsets[0]} bytes), but "
                f"{code}{shape} takes {math.prod(shape) * stored.itemsize} bytes."
            )
        if offsets[1] > self.data_size:
            raise CheckpointError(
                f"{self.label} is truncated: tensor {name!r} ends at byte {offsets[1]} of the "
                f"data, but the file holds only {self.data_size} bytes of data."
            )
        real = dtypes.get(name, CODE_TO_NAME[code])
        if real not in DTYPES:
            raise CheckpointError(f"{bad} names an unknown dtype {real!r}.")
        real_shape = tuple(shape)
        if real != CODE_TO_NAME[code]:
            candidates = (tuple(shape), tuple(shape[:-1]))
            fits = [c for c in candidates if storage(real, c) == (code, shape)]
            if not fits:
                raise CheckpointError(f"{bad} stores {code}{shape}, which cannot hold {real} data.")
            real_shape = fits[0]
        if not self.foreign and not isinstance(self.digests.get(name), str):
            raise CheckpointError(f"{self.label} is corrupted: tensor {name!r} has no checksum.")
        return TensorInfo(name, DTYPES[real], real_shape, offsets[0], offsets[1])

    def read_bytes(self, info: TensorInfo) -> np.ndarray:
        """Read one tensor's bytes into a new host buffer (not yet checked: see `check`)."""
        buf = np.empty(info.end - info.begin, np.uint8)
        self.f.seek(self.data_start + info.begin)
        got = self.f.readinto(buf.data)  # type: ignore[attr-defined]
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


@contextmanager
def open_checkpoint(source: str | os.PathLike | IO[bytes], allow_foreign: bool) -> Iterator[Reader]:
    """Open and validate a checkpoint (a path, or a binary file positioned at its start)."""
    label = _label(source)
    if isinstance(source, str | os.PathLike):
        try:
            f: IO[bytes] = open(source, "rb")
        except FileNotFoundError:
            raise FileNotFoundError(f"load: there is no checkpoint file {label}.") from None
        with f:
            yield Reader(f, label, whole_file=True, allow_foreign=allow_foreign)
    else:
        if not (hasattr(source, "read") and hasattr(source, "seek")):
            raise TypeError(
                f"load: expected a path or a binary file opened for reading, got "
                f"{type(source).__name__}."
            )
        reader = Reader(source, label, whole_file=False, allow_foreign=allow_foreign)
        yield reader
        # Leave the file just after the checkpoint, so that several can be read in turn.
        end = max((t.end for t in reader.tensors.values()), default=0)
        source.seek(reader.data_start + end)
