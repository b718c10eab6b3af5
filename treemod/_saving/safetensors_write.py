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
    treemod.keys            JSON {name: {"dtype", "impl"}} for PRNG key arrays (stored as key data)
    treemod.sha256          JSON {name: sha256 hex digest of the tensor's bytes}
    treemod.header_sha256   sha256 of the rest of the header (names, dtypes, shapes, offsets,
                            metadata), so a flipped digit in a shape or value is caught too

Reading is in `safetensors_read.py`; the error both raise is in `errors.py`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import struct
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import ml_dtypes
import numpy as np
from numpy.typing import DTypeLike

from treemod._saving.atomic_file import replace_atomically
from treemod._saving.file_objects import check_file_object, file_label
from treemod._saving.safetensors_header import MAX_HEADER_BYTES, MAX_TENSORS

__all__ = ["DTYPES", "TensorInfo", "write_checkpoint"]

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
CODE_TO_NAME = {code: name for name, code in _STANDARD.items()}

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


def dtype_name(dtype_like: DTypeLike) -> str:
    """The name under which `dtype_like` is stored; raises `TypeError` for unsupported dtypes."""
    dtype = np.dtype(dtype_like)
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


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def header_digest(table: dict[str, Any], metadata: dict[str, str]) -> str:
    meta = {
        k: v for k, v in metadata.items() if k not in ("treemod.sha256", "treemod.header_sha256")
    }
    return hashlib.sha256(canonical({"tensors": table, "metadata": meta}).encode()).hexdigest()


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


def _sha256(data: memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def _hash_all(entries: Sequence[tuple[Any, ...]], digests: dict[str, str]) -> None:
    """Fill `digests` by fetching and hashing each array once, before anything is written."""
    for name, array, *_ in entries:
        digests[name] = _sha256(_fetch(name, array))


def _fetch(name: str, array: Any) -> memoryview:
    try:
        return _host_bytes(array)
    except Exception as e:
        raise RuntimeError(
            f"save: could not fetch the array at {name} ({type(e).__name__}: {e})"
        ) from e


def _write(
    f: IO[bytes],
    tensors: Sequence[tuple[str, Any]],
    metadata: dict[str, str],
    *,
    rewrite_header: bool = True,
) -> None:
    """Write a checkpoint to the binary file `f`, streaming one tensor at a time.

    With `rewrite_header`, each array is hashed while it is written and the checksums go into
    the header last (one seek back: a plain file or `io.BytesIO`). Without, every array is
    hashed first and the file is written front to back, so any stream works (append mode,
    `gzip.open`, pipes), at the cost of fetching each array twice."""
    if len(tensors) > MAX_TENSORS:
        raise ValueError(
            f"save: the tree has {len(tensors):,} arrays, more than the {MAX_TENSORS:,} a "
            "checkpoint may hold. Stack many small arrays into fewer large ones."
        )
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
    meta["treemod.dtypes"] = canonical({e[0]: e[2] for e in entries if e[2] not in _STANDARD})
    meta.update(metadata)
    meta["treemod.header_sha256"] = header_digest(table, meta)
    digests = {name: "0" * 64 for name in table}
    if not rewrite_header:
        _hash_all(entries, digests)
    meta["treemod.sha256"] = canonical(digests)
    header = _encode_header(table, meta)
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(
            f"save: the checkpoint's header would be {len(header):,} bytes, more than the "
            f"{MAX_HEADER_BYTES:,} bytes safetensors readers accept (very long str leaves or key "
            "paths?). Store large data as arrays."
        )

    start = f.tell() if rewrite_header else 0
    f.write(struct.pack("<Q", len(header)))
    f.write(header)
    # Hash each array in a second thread while this one writes it (both release the GIL).
    with ThreadPoolExecutor(1) as hasher:
        for i, (name, array, *_) in enumerate(entries):
            if i + 1 < len(entries) and hasattr(entries[i + 1][1], "copy_to_host_async"):
                try:
                    entries[i + 1][1].copy_to_host_async()  # overlap the next transfer too
                except Exception:  # reported, with its name, when that array is fetched
                    pass
            data = _fetch(name, array)
            if rewrite_header:
                digest = hasher.submit(_sha256, data)
                f.write(data)
                digests[name] = digest.result()
            else:
                f.write(data)
            del data
    if not rewrite_header:
        return
    end = f.tell()
    meta["treemod.sha256"] = canonical(digests)
    final = _encode_header(table, meta)
    assert len(final) == len(header)
    f.seek(start + 8)
    f.write(final)
    f.seek(end)


def _can_rewrite_header(f: Any) -> bool:
    """Whether writing at an earlier offset of `f` lands there: an `io.BytesIO`, or a plain
    file not in append mode. Compressing writers (`gzip.open`) say they are seekable but seek
    only forwards, and append mode sends every write to the end."""
    if isinstance(f, io.BytesIO):
        return True
    if not isinstance(f, io.BufferedWriter | io.BufferedRandom | io.FileIO):
        return False
    mode = getattr(f, "mode", "")
    try:
        return "a" not in mode and f.seekable()
    except (OSError, ValueError):
        return False


def check_writable(target: Any, caller: str) -> None:
    """Refuse, naming the file, a file object a checkpoint cannot be written to: text mode,
    closed, or not open for writing."""
    check_file_object(target, file_label(target), caller, "write")


def write_checkpoint(
    target: str | os.PathLike[str] | IO[bytes],
    tensors: Sequence[tuple[str, Any]],
    metadata: dict[str, str],
) -> None:
    """Write a checkpoint to a path (atomically) or to an open binary file or stream."""
    if not isinstance(target, str | os.PathLike):
        if not hasattr(target, "write"):
            raise TypeError(
                f"save: expected a path or a binary file opened for writing, got "
                f"{type(target).__name__}."
            )
        check_writable(target, "save")
        _write(target, tensors, metadata, rewrite_header=_can_rewrite_header(target))
        return
    replace_atomically(os.fspath(target), lambda f: _write(f, tensors, metadata))
