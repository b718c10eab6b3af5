"""Run in each process of tests/multiprocess/test_pretrained_sharded.py: a sharded load.

Every array of the checkpoint's GPT-2 is split over the 4 devices of 2 processes (along its
first axis of a size divisible by 4), so each process should read about half of the tensor
bytes. The reader's own byte count (`Checkpoint.bytes_read`) is returned with every array
gathered whole, for the test to compare with a load on one process.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import treemod as tm
from treemod.models import _pretrained_load, from_pretrained
from treemod.models._files import Checkpoint

readers: list[Checkpoint] = []


class _CountedCheckpoint(Checkpoint):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        readers.append(self)


def load_sharded(directory: str) -> dict[str, Any]:
    """Load `directory` split over every device; the bytes read and the gathered arrays."""
    mesh = Mesh(np.array(jax.devices()), ("x",))
    n = mesh.size

    def where(path: str, shape: tuple[int, ...], dtype: Any) -> jax.sharding.Sharding:
        axes: list[str | None] = [None] * len(shape)
        for i, size in enumerate(shape):
            if size % n == 0:
                axes[i] = "x"
                break
        return NamedSharding(mesh, PartitionSpec(*axes))

    _pretrained_load.Checkpoint = _CountedCheckpoint  # type: ignore[misc]
    model = from_pretrained(directory, sharding=where)
    (reader,) = readers
    out: dict[str, Any] = {
        "bytes_read": np.int64(reader.bytes_read),
        "total_bytes": np.int64(reader.total_bytes),
        "process_index": np.int64(jax.process_index()),
    }
    spans = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tm.filter(model, tm.is_array))[0]:
        name = jax.tree_util.keystr(path, simple=True, separator=".")
        spans.append(not leaf.is_fully_addressable)
        out[name] = np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    out["all_span_processes"] = np.bool_(all(spans))
    return out
