"""Reading plain safetensors files one tensor, or one slice, at a time: `TensorFiles`.

The one reader of weights written by other tools (`from_pretrained`, `load_state_dict` of a
path, LoRA adapters). Each file's header is parsed and validated once by treemod's own parser
(`safetensors_header.py`, the reference implementation's rules), dtypes come from the one table
(`safetensors_dtypes.py`), and tensors are read by offset with `os.preadv` into the caller's
buffer, in blocks of whole rows of at most `CHUNK_BYTES` (one copy, from the page cache, and no
memory map held open: pages of a long-lived mapping count as resident memory, so a load would
end holding a second copy of the weights). `bytes_read` counts the tensor bytes read (the
multi-process test checks that each process reads only its shards).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from treemod._saving.errors import CheckpointError
from treemod._saving.safetensors_read import CheckpointNotFoundError, open_checkpoint

__all__ = ["CHUNK_BYTES", "FileTensor", "TensorFiles", "aligned_empty"]

# Large tensors are read in row blocks of about this size.
CHUNK_BYTES = 8 << 20
# Arrays at least this large are allocated as populated memory maps (see `aligned_empty`).
_MAPPED_BYTES = 1 << 20


@dataclass(frozen=True)
class FileTensor:
    """Where a tensor is and what it holds, from its file's header."""

    name: str
    file: Path
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    offset: int  # where its bytes start in the file

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def header_problem(file: Path) -> str | None:
    """Why a file's header is damaged, in words (naming the tensors cut off when the file is
    truncated); None when nothing specific is found."""
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"it is {size} bytes long, shorter than a safetensors header"
            (n,) = struct.unpack("<Q", head)
            if 8 + n > size:
                return f"its header says {n} bytes but the file has {size - 8} after the length"
            header = json.loads(f.read(n))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        return f"its header is not valid JSON ({e})"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    cut = []
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        offsets = entry.get("data_offsets")
        if isinstance(offsets, list) and len(offsets) == 2 and 8 + n + offsets[1] > size:
            cut.append(name)
    if cut:
        shown = ", ".join(repr(c) for c in sorted(cut)[:8]) + (" ..." if len(cut) > 8 else "")
        return f"it is truncated ({size} bytes): tensors {shown} end past the end of the file"
    return None


class TensorFiles:
    """The tensors of a set of safetensors files, known from their headers, read on demand.

    Arguments:
        files: the files (a checkpoint's shards); a tensor name may be in one only.
        caller: the function named at the start of each error (`"load_state_dict"`), or "".

    Example:
        >>> import numpy as np, tempfile, os
        >>> from safetensors.numpy import save_file
        >>> from treemod._saving.safetensors_files import TensorFiles
        >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
        >>> save_file({"w": np.arange(6, dtype=np.float32).reshape(3, 2)}, path)
        >>> files = TensorFiles([path])
        >>> files.tensors["w"].shape, files.read("w", (slice(1, 3), slice(0, 1))).tolist()
        ((3, 2), [[2.0], [4.0]])
    """

    def __init__(self, files: Sequence[str | os.PathLike[str]], caller: str = "") -> None:
        self.prefix = f"{caller}: " if caller else ""
        self.bytes_read = 0
        self._lock = threading.Lock()
        self.tensors: dict[str, FileTensor] = {}
        self.metadata: dict[str, dict[str, str]] = {}
        for file in files:
            self._read_header(Path(file))

    def _read_header(self, file: Path) -> None:
        try:
            with open_checkpoint(file, allow_foreign=True) as reader:
                infos, start, metadata = reader.tensors, reader.data_start, reader.metadata
        except CheckpointNotFoundError:
            raise CheckpointError(f"{self.prefix}{file} is not a file.") from None
        except CheckpointError as e:
            problem = header_problem(file) if file.is_file() else None
            detail = str(e).removeprefix(str(file)).removeprefix("load: ").strip()
            raise CheckpointError(
                f"{self.prefix}{file} is damaged: {problem or detail} (it is not a readable "
                f"safetensors file)."
            ) from None
        self.metadata[file.name] = dict(metadata)
        for name, info in infos.items():
            known = self.tensors.get(name)
            if known is not None:
                raise CheckpointError(
                    f"{self.prefix}tensor {name!r} is in both {known.file} and {file}."
                )
            self.tensors[name] = FileTensor(name, file, info.dtype, info.shape, start + info.begin)

    @property
    def total_bytes(self) -> int:
        """The bytes of every tensor."""
        return sum(t.nbytes for t in self.tensors.values())

    def read(self, name: str, index: Sequence[slice] | None = None) -> np.ndarray:
        """Tensor `name`, or its slice `index` (a `slice(start, stop)` for each leading axis,
        the others whole; `None` for all of it), as a new NumPy array."""
        info = self.tensors[name]
        index = _full(info.shape) if index is None else _bounded(index, info.shape)
        out = np.empty(tuple(s.stop - s.start for s in index), info.dtype)
        self.read_into(name, index, out)
        return out

    def read_into(self, name: str, index: Sequence[slice], out: np.ndarray) -> None:
        """Tensor `name` at `index` (one `slice(start, stop)` per axis) into `out`, cast to
        `out`'s dtype.

        A block of whole rows (every axis but the first in full) is one range of the file: it
        is read with `os.preadv` straight into `out` (measured on a 1.4 GB file: 0.5 s, against
        2.7 s for safetensors' `load_file`, whose arrays are views of a memory map paid for
        page by page). Other slices read whole rows in blocks of at most `CHUNK_BYTES` and keep
        the part asked for.
        """
        info = self.tensors[name]
        if not info.shape:
            block = np.empty((), info.dtype)
            self._pread(info, info.offset, block)
            out[...] = block
            return
        first, rest = index[0], tuple(index[1:])
        per_row = info.nbytes // max(info.shape[0], 1)
        step = max(1, CHUNK_BYTES // max(per_row, 1))
        whole = all(s.start == 0 and s.stop == n for s, n in zip(rest, info.shape[1:], strict=True))
        for row in range(first.start, first.stop, step):
            end = min(first.stop, row + step)
            target = out[row - first.start : end - first.start]
            direct = whole and target.dtype == info.dtype and target.flags.c_contiguous
            block = target if direct else np.empty((end - row, *info.shape[1:]), info.dtype)
            self._pread(info, info.offset + row * per_row, block)
            if not direct:
                target[...] = block[(slice(None), *rest)]

    def _pread(self, info: FileTensor, position: int, block: np.ndarray) -> None:
        view = memoryview(block.reshape(-1).view(np.uint8))  # type: ignore[arg-type,unused-ignore]
        fd = os.open(info.file, os.O_RDONLY)
        try:
            done = 0
            while done < len(view):
                got = os.preadv(fd, [view[done:]], position + done)
                if got <= 0:
                    raise CheckpointError(
                        f"{self.prefix}{info.file}: reading tensor {info.name!r} stopped at "
                        f"byte {position + done}: the file is shorter than its header says "
                        f"(truncated or rewritten since it was opened)."
                    )
                done += got
        finally:
            os.close(fd)
        with self._lock:
            self.bytes_read += len(view)


def _full(shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(0, n) for n in shape)


def _bounded(index: Sequence[slice], shape: tuple[int, ...]) -> tuple[slice, ...]:
    """`index` with bounds in range, and the axes it leaves out in full."""
    given = tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape, strict=False))
    return given + _full(shape[len(given) :])


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised array whose data starts on a 64-byte boundary, for a tensor to be read.

    `jax.device_put` of such an array on the CPU keeps its memory instead of copying it (checked
    for JAX 0.10), so a tensor read into it is never held twice. Large arrays are anonymous
    memory maps populated up front (`MAP_POPULATE`, Linux): every byte is about to be
    written, and one system call that maps all pages costs far less than a fault per page
    (measured in a virtual machine: 1.4 GB in 2.3 s populated, 5.3 s faulted page by page,
    13.8 s with NumPy's huge-page advice).
    """
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    populate = getattr(mmap, "MAP_POPULATE", None)
    if nbytes >= _MAPPED_BYTES and populate is not None:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate
        mapped: np.ndarray = np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), dtype, count)
        return mapped.reshape(shape)
    raw = np.empty(nbytes + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    out: np.ndarray = raw[start : start + nbytes].view(dtype).reshape(shape)
    return out
