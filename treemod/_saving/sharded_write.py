"""A plain safetensors file written shard by shard, by every process that holds a part.

safetensors stores each tensor whole, row-major, at an offset the header gives. A shard of a
tensor split over devices is a box of it, so its bytes land in equally spaced runs of the
file: the run is the shard's extent along the last dimension it does not hold whole, times
everything after. So no process needs a whole tensor: process 0 writes the header and sizes the
file, then every process writes the shards it holds (one copy of each: `replica_id == 0`) with
`os.pwrite` at their offsets, and the file is the same, byte for byte, as the one `write_tensors`
writes from whole arrays. Within one process, one shard is on the host at a time.

Across processes the file must be on a disk all of them see; they meet twice
(`multihost_utils.sync_global_devices`): after the file is sized, after every shard is written.
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from treemod._saving.safetensors_write import fetch_bytes, plain_layout

__all__ = [
    "is_split",
    "shard_runs",
    "shared_tag",
    "spans_processes",
    "sync_processes",
    "write_tensors_sharded",
]


# Below this many bytes per run, one process writing alone copies through a mapping (measured:
# a 4096 x 4096 float32 split by columns 8 ways, 2 KiB runs, 4.4x slower through pwrite).
SHORT_RUN = 1 << 16


def spans_processes(arrays: Iterable[Any]) -> bool:
    """Whether any of `arrays` is a `jax.Array` of which other processes hold parts."""
    return any(isinstance(a, jax.Array) and not a.is_fully_addressable for a in arrays)


def is_split(array: Any) -> bool:
    """Whether `array` is a `jax.Array` split over several devices (not one whole copy each)."""
    return (
        isinstance(array, jax.Array)
        and len(array.sharding.device_set) > 1
        and not array.is_fully_replicated
    )


def shared_tag() -> int:
    """A number every process agrees on (process 0's id): names temporary files they share."""
    tag = np.int32(os.getpid())
    if jax.process_count() == 1:
        return int(tag)
    return int(multihost_utils.broadcast_one_to_all(tag))


def sync_processes(name: str) -> None:
    """Wait until every process reaches the point called `name` (the same on all)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def shard_runs(
    shape: tuple[int, ...], index: tuple[slice, ...], itemsize: int
) -> tuple[np.ndarray, int]:
    """Where the box `index` of a row-major array of `shape` lies in its bytes.

    Arguments:
        shape: the whole array's shape.
        index: the box, one unit-step slice per dimension (a shard's `index`).
        itemsize: bytes per element.

    Returns:
        The byte offset of each run (from the array's first byte, in the box's row-major order)
        and the bytes per run; the box's bytes, in order, fill the runs.

    Example:
        >>> offsets, run = shard_runs((4, 6), (slice(0, 2), slice(3, 6)), 1)
        >>> offsets.tolist(), run
        ([3, 9], 3)
    """
    starts, sizes = [], []
    for s, n in zip(index, shape, strict=True):
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError(f"shard_runs: the box {index} has a step; shards have none.")
        starts.append(start)
        sizes.append(max(stop - start, 0))
    # Dimensions from `whole` on are held entirely: one run covers them and the one before.
    whole = len(shape)
    while whole > 0 and sizes[whole - 1] == shape[whole - 1]:
        whole -= 1
    strides = [itemsize * math.prod(shape[i + 1 :]) for i in range(len(shape))]
    base = sum(s * t for s, t in zip(starts, strides, strict=True))
    if whole == 0:
        return np.array([base], dtype=np.int64), itemsize * math.prod(shape)
    last = whole - 1
    run = sizes[last] * strides[last]
    offsets = np.array(base, dtype=np.int64)
    for i in range(last):
        offsets = (offsets[..., None] + np.arange(sizes[i], dtype=np.int64) * strides[i]).copy()
    return offsets.reshape(-1), run


def _write_box(fd: int, data: memoryview, offsets: np.ndarray, run: int, at: int) -> int:
    if run == 0 or len(data) == 0:
        return 0
    if len(offsets) * run == len(data) and (len(offsets) == 1 or _contiguous(offsets, run)):
        os.pwrite(fd, data, at + int(offsets[0]))
        return len(data)
    for i, offset in enumerate(offsets.tolist()):
        os.pwrite(fd, data[i * run : (i + 1) * run], at + offset)
    return len(data)


class _Mapped:
    """One tensor's bytes in the file as a writable uint8 array `(..., last * itemsize)`, through
    a shared mapping; boxes of many short runs are copied in by one strided NumPy assignment
    instead of a write call per run (a column block of a matrix). Only one process writes
    through it: pages written by two hosts' mappings of a network disk would clobber each
    other, where `pwrite`'s byte ranges do not."""

    def __init__(self, fd: int, shape: tuple[int, ...], itemsize: int, at: int) -> None:
        nbytes = math.prod(shape) * itemsize
        start = at - at % mmap.ALLOCATIONGRANULARITY
        self._map = mmap.mmap(fd, at - start + nbytes, offset=start)
        view = np.frombuffer(self._map, np.uint8, nbytes, at - start)
        self._bytes: np.ndarray | None = view.reshape(*shape[:-1], shape[-1] * itemsize)
        self._itemsize = itemsize

    def write(self, data: memoryview, index: tuple[slice, ...], last: int) -> int:
        assert self._bytes is not None
        first, stop, _ = index[-1].indices(last)
        box = (*index[:-1], slice(first * self._itemsize, stop * self._itemsize))
        target = self._bytes[box]
        target[...] = np.frombuffer(data, np.uint8).reshape(target.shape)
        return len(data)

    def close(self) -> None:
        self._bytes = None  # the mapping closes only once no array views it
        self._map.close()


def _contiguous(offsets: np.ndarray, run: int) -> bool:
    return bool(np.all(np.diff(offsets) == run))


def _write_array(
    fd: int, name: str, array: Any, at: int, leader: bool, alone: bool, caller: str
) -> int:
    """Write the parts of `array` this process owns at file offset `at`; the bytes written.
    `alone`: no other process writes to the file (a mapping may then be used)."""
    if not isinstance(array, jax.Array):
        return _write_whole(fd, name, array, at, caller) if leader else 0
    if array.is_fully_addressable and not leader:
        return 0  # a per-process array: process 0's copy is the file's
    written = 0
    shape, itemsize = tuple(array.shape), np.dtype(array.dtype).itemsize
    mapped: _Mapped | None = None
    try:
        for shard in array.addressable_shards:
            if shard.replica_id != 0:
                continue
            offsets, run = shard_runs(shape, shard.index, itemsize)
            data = fetch_bytes(name, shard.data, caller)  # this shard alone on the host
            if alone and len(offsets) > 1 and run < SHORT_RUN:
                mapped = mapped or _Mapped(fd, shape, itemsize, at)
                written += mapped.write(data, shard.index, shape[-1])
            else:
                written += _write_box(fd, data, offsets, run, at)
            del data
    finally:
        if mapped is not None:
            mapped.close()
    return written


def _write_whole(fd: int, name: str, array: Any, at: int, caller: str) -> int:
    data = fetch_bytes(name, array, caller)
    os.pwrite(fd, data, at)
    return len(data)


def write_tensors_sharded(
    path: str | os.PathLike[str],
    tensors: Sequence[tuple[str, Any]],
    metadata: dict[str, str],
    caller: str,
) -> int:
    """Write named arrays to `path` as the plain safetensors file `write_tensors` writes, each
    array's shards written where they lie in it by the process that holds them.

    When some array spans processes every process must call this with the same `path` (on a
    disk they all see) and tensors; process 0 creates the file. Otherwise one process writes it,
    a shard at a time.

    Arguments:
        path: the file (its directory exists).
        tensors: `(name, array)` pairs, arrays of safetensors' dtypes.
        metadata: the header's `__metadata__`.
        caller: the function named in errors.

    Returns:
        The tensor bytes this process wrote.

    Example:
        >>> import jax, numpy as np, tempfile, os
        >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
        >>> a = jax.device_put(np.arange(8.0, dtype=np.float32).reshape(2, 4),
        ...                    NamedSharding(mesh, P(None, "x")))
        >>> path = os.path.join(tempfile.mkdtemp(), "a.safetensors")
        >>> write_tensors_sharded(path, [("a", a)], {}, "example")
        32
        >>> from safetensors.numpy import load_file
        >>> load_file(path)["a"].tolist()
        [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    """
    for name, array in tensors:
        # Before anything is written: a process failing midway would leave the others waiting.
        if isinstance(array, jax.Array) and array.is_deleted():
            raise RuntimeError(
                f"{caller}: could not fetch the array at {name} (it was deleted: donated to a "
                f"compiled function?); save the arrays before donating them."
            )
    head, placed = plain_layout(tensors, metadata, caller)
    collective = jax.process_count() > 1 and spans_processes(a for _, a in tensors)
    leader = not collective or jax.process_index() == 0
    size = len(head) + sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for _, a, _ in placed)
    if leader:
        with open(path, "wb") as f:
            f.write(head)
            f.truncate(size)
    if collective:
        try:
            sync_processes(f"{caller}: {os.fspath(path)} sized")
        except AssertionError:  # every process gets it: the barrier compares the names
            if leader:
                os.unlink(path)
            raise ValueError(
                f"{caller}: the processes were given different paths ({os.fspath(path)!r} on "
                f"process {jax.process_index()}); the model's arrays span processes, so every "
                f"process calls {caller} with the same path, on a disk all of them see."
            ) from None
    written = 0
    fd = os.open(path, os.O_RDWR)  # read too: a shared mapping needs it
    try:
        for name, array, at in placed:
            written += _write_array(fd, name, array, at, leader, not collective, caller)
        os.fsync(fd)
    finally:
        os.close(fd)
    if collective:
        sync_processes(f"{caller}: {os.fspath(path)} written")
    return written
