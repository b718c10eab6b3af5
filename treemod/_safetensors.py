"""The on-disk format: safetensors files with treemod metadata, written atomically and read safely.

Layout (the safetensors layout, readable by `safetensors.numpy` and `safetensors.torch`):

    8 bytes   little-endian unsigned length N of the header
    N bytes   UTF-8 JSON: {name: {"dtype", "shape", "data_offsets"}, "__metadata__": {str: str}},
              padded with spaces to a multiple of 8
    data      each tensor's raw little-endian bytes, contiguous, at its `data_offsets`

treemod's entries in `__metadata__`:

    treemod.format          "treemod" (the marker of a treemod checkpoint)
    treemod.version         format version, "1"
    treemod.dtypes          JSON {name: dtype name} for dtypes outside the safetensors set
                            (int4, float8_e4m3b11fnuz, complex128, ...)
    treemod.values          JSON {key path: [type, value]} for int/float/bool/complex/str leaves
    treemod.sha256          JSON {name: sha256 hex digest of the tensor's bytes}
    treemod.header_sha256   sha256 of the rest of the header (names, dtypes, shapes, offsets,
                            metadata), so a flipped digit in a shape or value is caught too

Nothing here unpickles or evaluates file contents: the header is JSON and tensors are raw bytes
interpreted with dtypes from a fixed allow-list.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import secrets
import struct
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

import ml_dtypes
import numpy as np

__all__ = ["CheckpointError"]

FORMAT = "treemod"
VERSION = 1

# Dtype name -> safetensors code, for the dtypes that safetensors (and PyTorch) know.
_STANDARD = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "uint16": "U16",
    "int16": "I16",
    "uint32": "U32",
    "int32": "I32",
    "uint64": "U64",
    "int64": "I64",
    "float16": "F16",
    "bfloat16": "BF16",
    "float32": "F32",
    "float64": "F64",
    "complex64": "C64",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
}
_CODE_TO_NAME = {code: name for name, code in _STANDARD.items()}

_ML_NAMES = (
    "bfloat16 float8_e3m4 float8_e4m3 float8_e4m3b11fnuz float8_e4m3fn float8_e4m3fnuz "
    "float8_e5m2 float8_e5m2fnuz float8_e8m0fnu float4_e2m1fn float6_e2m3fn float6_e3m2fn "
    "int1 int2 int4 uint1 uint2 uint4"
).split()
_NUMPY_NAMES = (
    "bool uint8 int8 uint16 int16 uint32 int32 uint64 int64 float16 float32 float64 "
    "complex64 complex128"
).split()

# The only dtypes a file may name: looked up in this table, never by getattr on file contents.
DTYPES: dict[str, np.dtype] = {n: np.dtype(n) for n in _NUMPY_NAMES}
DTYPES.update({n: np.dtype(getattr(ml_dtypes, n)) for n in _ML_NAMES if hasattr(ml_dtypes, n)})


class CheckpointError(ValueError):
    """A checkpoint file is damaged, is not a treemod checkpoint, or does not match `like`.

    The message names the file and every key path involved. Nothing is returned half-loaded.

    Example:
        >>> import io, treemod as tm
        >>> try:
        ...     tm.load(io.BytesIO(b"not a checkpoint"), like=[])
        ... except tm.CheckpointError as e:
        ...     print(str(e)[:60])
        <BytesIO> is not a treemod checkpoint: its first 8 bytes say
    """


def dtype_name(dtype: Any) -> str:
    """The name under which `dtype` is stored; raises `TypeError` for unsupported dtypes."""
    dtype = np.dtype(dtype)
    name = dtype.name
    if DTYPES.get(name) != dtype.newbyteorder("="):
        raise TypeError(
            f"dtype {dtype} cannot be saved: checkpoints hold bool, integer, floating, complex "
            "and ml_dtypes arrays."
        )
    return name


def storage(name: str, shape: tuple[int, ...]) -> tuple[str, list[int]]:
    """The safetensors dtype code and shape under which an array of dtype `name` is stored.

    Standard dtypes are stored as themselves. complex128 is stored as F64 with a trailing axis of
    2 (real, imaginary); other dtypes as their raw bytes: U8 with the same shape when they take
    one byte an element (int4, float8 variants, ...), else with a trailing axis of the item size.
    """
    if name in _STANDARD:
        return _STANDARD[name], list(shape)
    if name == "complex128":
        return "F64", [*shape, 2]
    itemsize = DTYPES[name].itemsize
    return "U8", list(shape) if itemsize == 1 else [*shape, itemsize]


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies in a file, with its real dtype and shape."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int  # offsets within the data section
    end: int


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _header_digest(table: dict[str, Any], metadata: dict[str, str]) -> str:
    meta = {
        k: v for k, v in metadata.items() if k not in ("treemod.sha256", "treemod.header_sha256")
    }
    return hashlib.sha256(_canonical({"tensors": table, "metadata": meta}).encode()).hexdigest()


def _encode_header(table: dict[str, Any], metadata: dict[str, str]) -> bytes:
    header = dict(table)
    header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    return raw + b" " * (-len(raw) % 8)


def _host_bytes(array: Any) -> memoryview:
    """The array's little-endian bytes, as a flat byte view (one host copy at most)."""
    host = np.ascontiguousarray(np.asarray(array))
    if host.dtype.byteorder == ">" or (host.dtype.byteorder == "=" and sys.byteorder == "big"):
        host = host.byteswap().view(host.dtype.newbyteorder("<"))
    return host.reshape(-1).view(np.uint8).data


def _write(f: IO[bytes], tensors: Sequence[tuple[str, Any]], metadata: dict[str, str]) -> None:
    """Write a checkpoint to the seekable binary file `f`, streaming one tensor at a time."""
    entries = []
    for name, array in tensors:
        dname = dtype_name(array.dtype)
        code, shape = storage(dname, tuple(array.shape))
        nbytes = math.prod(array.shape) * DTYPES[dname].itemsize
        entries.append((name, array, dname, code, shape, nbytes))
    # Largest items first keeps every tensor aligned to its item size, as safetensors does.
    entries.sort(key=lambda e: -DTYPES[e[2]].itemsize)
    table: dict[str, Any] = {}
    offset = 0
    for name, _, _, code, shape, nbytes in entries:
        table[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    meta = {"treemod.format": FORMAT, "treemod.version": str(VERSION)}
    meta["treemod.dtypes"] = _canonical({e[0]: e[2] for e in entries if e[2] not in _STANDARD})
    meta.update(metadata)
    meta["treemod.header_sha256"] = _header_digest(table, meta)
    digests = {name: "0" * 64 for name in table}
    meta["treemod.sha256"] = _canonical(digests)
    header = _encode_header(table, meta)

    start = f.tell()
    f.write(struct.pack("<Q", len(header)))
    f.write(header)
    for name, array, *_ in entries:
        data = _host_bytes(array)
        f.write(data)
        digests[name] = hashlib.sha256(data).hexdigest()
        del data
    end = f.tell()
    meta["treemod.sha256"] = _canonical(digests)
    final = _encode_header(table, meta)
    assert len(final) == len(header)
    f.seek(start + 8)
    f.write(final)
    f.seek(end)


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


def write_checkpoint(
    target: str | os.PathLike | IO[bytes],
    tensors: Sequence[tuple[str, Any]],
    metadata: dict[str, str],
) -> None:
    """Write a checkpoint to a path (atomically) or to an open, seekable binary file."""
    if not isinstance(target, str | os.PathLike):
        if not (hasattr(target, "write") and hasattr(target, "seek")):
            raise TypeError(
                f"save: expected a path or a binary file opened for writing, got "
                f"{type(target).__name__}."
            )
        _write(target, tensors, metadata)
        return
    path = os.fspath(target)
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    while True:
        tmp = os.path.join(directory, f".{base}.{secrets.token_hex(6)}.tmp")
        try:
            # Mode 0o666 lets the umask decide, so the checkpoint gets normal permissions.
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            _write(f, tensors, metadata)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_directory(directory)


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
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
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
            if not version.isdigit():
                raise CheckpointError(
                    f"{label} is corrupted: its format version {version!r} is not a number."
                )
            if int(version) > VERSION:
                raise CheckpointError(
                    f"{label} has checkpoint format version {version}, newer than this "
                    f"treemod reads (version {VERSION}). Upgrade treemod to load it."
                )
            if meta.get("treemod.header_sha256") != _header_digest(header, meta):
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
        except json.JSONDecodeError as e:
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
        if code not in _CODE_TO_NAME:
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
        stored = np.dtype(DTYPES[_CODE_TO_NAME[code]])
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
        real = dtypes.get(name, _CODE_TO_NAME[code])
        if real not in DTYPES:
            raise CheckpointError(f"{bad} names an unknown dtype {real!r}.")
        real_shape = tuple(shape)
        if real != _CODE_TO_NAME[code]:
            candidates = (tuple(shape), tuple(shape[:-1]))
            fits = [c for c in candidates if storage(real, c) == (code, shape)]
            if not fits:
                raise CheckpointError(f"{bad} stores {code}{shape}, which cannot hold {real} data.")
            real_shape = fits[0]
        if not self.foreign and not isinstance(self.digests.get(name), str):
            raise CheckpointError(f"{self.label} is corrupted: tensor {name!r} has no checksum.")
        return TensorInfo(name, DTYPES[real], real_shape, offsets[0], offsets[1])

    def read(self, info: TensorInfo) -> np.ndarray:
        """Read one tensor into a new host array, checking its checksum."""
        buf = np.empty(info.end - info.begin, np.uint8)
        self.f.seek(self.data_start + info.begin)
        got = self.f.readinto(buf.data)  # type: ignore[attr-defined]
        if got != buf.size:
            raise CheckpointError(
                f"{self.label} is truncated: tensor {info.name!r} is cut short while reading."
            )
        if not self.foreign and hashlib.sha256(buf.data).hexdigest() != self.digests[info.name]:
            raise CheckpointError(
                f"{self.label} is corrupted: the checksum of tensor {info.name!r} does not "
                "match its data."
            )
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
        yield Reader(source, label, whole_file=False, allow_foreign=allow_foreign)
