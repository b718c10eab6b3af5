"""Trees whose arrays span processes: `save` writes what this process holds whole, refuses the rest.

A `jax.Array` sharded across processes (`is_fully_addressable` false) may still have every value
on this process's devices: replicated across processes (plain data parallelism), or split only
over this process's devices and repeated on the others'. `save` reads such an array from its
local shards, as `numpy.asarray` does. An array of which other processes hold parts that this
one lacks cannot be written by one process: `save` (and the other file formats' writers, through
`spanning_error`) refuses it before writing anything. Such trees are saved with Orbax, each process
writing its own shards; docs/concepts/many-hosts.md has the recipe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from treemod._saving.errors import CheckpointError

__all__ = ["RECIPE", "check_addressable", "spanning_error"]

RECIPE = "docs/concepts/many-hosts.md (section 'Checkpoints')"


def _blocks(indices: Mapping[Any, tuple[Any, ...] | None]) -> set[tuple[Any, ...]]:
    """The distinct blocks an index map names (slices as tuples: hashable before Python 3.12)."""
    return {
        tuple((i.start, i.stop, i.step) if isinstance(i, slice) else i for i in index)
        for index in indices.values()
        if index is not None
    }


def _held_whole_here(leaf: jax.Array) -> bool:
    """Whether this process's devices hold every value of `leaf` (some copy of every block)."""
    if leaf.is_fully_replicated:
        return bool(leaf.sharding.addressable_devices)
    sharding, shape = leaf.sharding, leaf.shape
    return _blocks(sharding.addressable_devices_indices_map(shape)) == _blocks(
        sharding.devices_indices_map(shape)
    )


def spanning_error(caller: str, name: str, leaf: Any) -> str | None:
    """The refusal for `leaf` if it is an array with values only other processes hold, else `None`.

    Arrays that span processes but whose every value this process holds (replicated across
    processes, say) give `None`: a writer reads its own copy. The message names the caller, the
    key path, the array's shape and sharding, and points to the Orbax recipe (`RECIPE`) and to
    `process_allgather`.

    Arguments:
        caller: the public function that saves (`save`, or another format's writer).
        name: the leaf's key path, for the message.
        leaf: the leaf (anything; only `jax.Array`s that span processes are looked at).

    Returns:
        The message, or `None` when this process can write the leaf.

    Example:
        >>> import jax.numpy as jnp
        >>> from treemod._saving.multihost import spanning_error
        >>> spanning_error("save", ".weight", jnp.ones(3)) is None  # one process: held whole
        True
    """
    if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable or _held_whole_here(leaf):
        return None
    return (
        f"{caller}: the array at {name or '(root)'} (shape {tuple(leaf.shape)}, {leaf.sharding}) "
        f"spans {jax.process_count()} processes, and this process ({jax.process_index()}) "
        "holds only some of its values, so no one process can write it. Save trees sharded "
        f"across processes with Orbax (every process writes its own shards; see {RECIPE}), or "
        "gather the array first (jax.experimental.multihost_utils.process_allgather) and save "
        "from one process."
    )


def check_addressable(name: str, leaf: Any) -> None:
    """Raise `CheckpointError` if `leaf` is an array with values only other processes hold.

    Called by `save` for each array leaf before it writes anything, so no process leaves a
    partial file that another would read as complete (see `spanning_error`).

    Arguments:
        name: the leaf's key path, for the message.
        leaf: the leaf (anything; only `jax.Array`s that span processes are looked at).

    Example:
        >>> import jax.numpy as jnp
        >>> from treemod._saving.multihost import check_addressable
        >>> check_addressable(".weight", jnp.ones(3))  # one process: always held whole
    """
    message = spanning_error("save", name, leaf)
    if message is not None:
        raise CheckpointError(message)
