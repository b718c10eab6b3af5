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

import numpy as np

from treemod._saving.atomic_file import replace_atomically
from treemod._saving.file_objects import check_file_object, file_label
from treemod._saving.safetensors_dtypes import DTYPES, STANDARD, dtype_name, storage
from treemod._saving.safetensors_header import MAX_HEADER_BYTES, MAX_TENSORS

__all__ = [
    "TensorInfo",
    "check_header_size",
    "encode_header",
    "fetch_bytes",
    "host_bytes",
    "plain_layout",
    "write_checkpoint",
    "write_tensors",
]

FORMAT = "treemod"
VERSION = 1


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


def encode_header(table: dict[str, Any], metadata: dict[str, str]) -> bytes:
    header = dict(table)
    header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    return raw + b" " * (-len(raw) % 8)


def host_bytes(array: Any) -> memoryview:
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
        digests[name] = _sha256(fetch_bytes(name, array))


def fetch_bytes(name: str, array: Any, caller: str = "save") -> memoryview:
    try:
        return host_bytes(array)
    except Exception as e:
        raise RuntimeError(
            f"{caller}: could not fetch the array at {name} ({type(e).__name__}: {e})"
        ) from e


def check_header_size(header: bytes, caller: str) -> None:
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(
            f"{caller}: the checkpoint's header would be {len(header):,} bytes, more than the "
            f"{MAX_HEADER_BYTES:,} bytes safetensors readers accept (very long str leaves or key "
            "paths?). Store large data as arrays."
        )


Entry = tuple[str, Any, str, str, list[int], int]  # name, array, dtype, code, shape, bytes


def _layout(
    tensors: Sequence[tuple[str, Any]], treemod_format: bool, caller: str
) -> tuple[list[Entry], dict[str, Any]]:
    """The tensors in file order and the header's table (each tensor's dtype, shape, offsets)."""
    entries: list[Entry] = []
    for name, array in tensors:
        dname = dtype_name(array.dtype)
        if not treemod_format and dname not in STANDARD:
            raise TypeError(
                f"{caller}: tensor {name!r} is {dname}, which a safetensors file cannot hold "
                f"(it holds {', '.join(STANDARD)}); cast it first."
            )
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
    return entries, table


def plain_layout(
    tensors: Sequence[tuple[str, Any]], metadata: dict[str, str], caller: str
) -> tuple[bytes, list[tuple[str, Any, int]]]:
    """The header of the plain safetensors file `write_tensors` writes for `tensors`, and each
    tensor with its offset in the file: what a writer needs to put the bytes anywhere in any
    order (the shards of a model split across processes) and get the same file.

    Arguments:
        tensors: `(name, array)` pairs (anything with `dtype` and `shape`).
        metadata: the header's `__metadata__`.
        caller: the function named in errors.

    Returns:
        The file's first bytes (length and header) and `(name, array, file offset)` per tensor.
    """
    entries, table = _layout(tensors, False, caller)
    header = encode_header(table, dict(metadata))
    check_header_size(header, caller)
    start = 8 + len(header)
    placed = [(name, array, start + table[name]["data_offsets"][0]) for name, array, *_ in entries]
    return struct.pack("<Q", len(header)) + header, placed


def _write(
    f: IO[bytes],
    tensors: Sequence[tuple[str, Any]],
    metadata: dict[str, str],
    *,
    rewrite_header: bool = True,
    treemod_format: bool = True,
    caller: str = "save",
) -> None:
    """Write a checkpoint to the binary file `f`, streaming one tensor at a time.

    With `rewrite_header`, each array is hashed while it is written and the checksums go into
    the header last (one seek back: a plain file or `io.BytesIO`). Without, every array is
    hashed first and the file is written front to back, so any stream works (append mode,
    `gzip.open`, pipes), at the cost of fetching each array twice. Without `treemod_format`,
    the file is plain safetensors (`metadata` only, no checksums; safetensors' dtypes only)."""
    if len(tensors) > MAX_TENSORS:
        raise ValueError(
            f"{caller}: the tree has {len(tensors):,} arrays, more than the {MAX_TENSORS:,} a "
            "checkpoint may hold. Stack many small arrays into fewer large ones."
        )
    entries, table = _layout(tensors, treemod_format, caller)
    if not treemod_format:
        header = encode_header(table, dict(metadata))
        check_header_size(header, caller)
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for name, array, *_ in entries:
            f.write(fetch_bytes(name, array, caller))
        return
    meta = {"treemod.format": FORMAT, "treemod.version": str(VERSION)}
    meta["treemod.dtypes"] = canonical({e[0]: e[2] for e in entries if e[2] not in STANDARD})
    meta.update(metadata)
    meta["treemod.header_sha256"] = header_digest(table, meta)
    digests = {name: "0" * 64 for name in table}
    if not rewrite_header:
        _hash_all(entries, digests)
    meta["treemod.sha256"] = canonical(digests)
    header = encode_header(table, meta)
    check_header_size(header, caller)

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
            data = fetch_bytes(name, array, caller)
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
    final = encode_header(table, meta)
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


def write_tensors(
    path: str | os.PathLike[str],
    tensors: Sequence[tuple[str, Any]],
    metadata: dict[str, str],
    caller: str,
) -> None:
    """Write named arrays to `path` as a plain safetensors file (what `safetensors` and PyTorch
    read), one tensor at a time (each fetched from its device once).

    Arguments:
        path: the file (`save_pretrained` and `save_adapter` write a temporary file, fsync and
            rename it: see `atomic_file.py`).
        tensors: `(name, array)` pairs, arrays of safetensors' dtypes.
        metadata: the header's `__metadata__` (`{"format": "pt"}` for `transformers`).
        caller: the function named in errors (an array that cannot be fetched, e.g. donated,
            is named with its tensor).
    """
    with open(path, "wb") as f:
        _write(f, tensors, metadata, rewrite_header=False, treemod_format=False, caller=caller)
