"""Trees whose arrays span processes: `tm.save` refuses them before writing anything.

A `jax.Array` sharded across processes (`is_fully_addressable` false) has shards this process
cannot read, so no one process can write it to one file. Such trees are saved with Orbax, each
process writing its own shards; docs/concepts/many-hosts.md has the recipe.
"""

from __future__ import annotations

from typing import Any

import jax

from treemod._saving.errors import CheckpointError

__all__ = ["check_addressable"]

RECIPE = "docs/concepts/many-hosts.md (section 'Checkpoints')"


def check_addressable(name: str, leaf: Any) -> None:
    """Raise `CheckpointError` if `leaf` is an array with shards in other processes.

    Called for each array leaf before `save` writes anything, so no process leaves a partial
    file that another would read as complete.
    """
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        raise CheckpointError(
            f"save: the array at {name or '(root)'} (shape {tuple(leaf.shape)}, {leaf.sharding}) "
            f"spans {jax.process_count()} processes, and this process ({jax.process_index()}) "
            "holds only some of its shards, so no one process can write it. Save trees sharded "
            "across processes with Orbax (every process writes its own shards; see "
            f"{RECIPE}), or gather the array first "
            "(jax.experimental.multihost_utils.process_allgather) and save from one process."
        )
