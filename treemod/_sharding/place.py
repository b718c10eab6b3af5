"""`shard` and `model_shardings`: a model's arrays placed by the rule table."""

from __future__ import annotations

from typing import Any

import jax
import jax.tree_util as jtu
from jax.sharding import Mesh, NamedSharding

from treemod._sharding.axes import is_shaped, named_leaves
from treemod._sharding.rules import Rules, check_rules, spec_for

__all__ = ["model_shardings", "shard"]


def model_shardings(model: Any, mesh: Mesh, rules: Rules) -> Any:
    """The `NamedSharding` the rule table gives each array of `model`, in its structure.

    Arguments:
        model: a model (arrays or `jax.ShapeDtypeStruct`s, e.g. `filter_eval_shape`'s result).
        mesh: the device mesh.
        rules: the rule table (`fsdp_rules()`, `tensor_parallel_rules()`, your own; see
            `treemod.shard`).

    Returns:
        `model` with each array replaced by its sharding and every other leaf by `None`.

    Example:
        >>> import jax, numpy as np, treemod as tm
        >>> mesh = jax.make_mesh((8,), ("data",))
        >>> emb = tm.nn.Embedding(16, 8, key=jax.random.key(0))
        >>> tm.model_shardings(emb, mesh, tm.fsdp_rules()).weight.spec
        P('data',)
    """
    check_rules(rules, mesh)
    leaves, treedef = named_leaves(model)
    return jtu.tree_unflatten(
        treedef,
        [
            NamedSharding(mesh, spec_for(path, tuple(leaf.shape), names, mesh, rules))
            if is_shaped(leaf)
            else None
            for path, leaf, names in leaves
        ],
    )


def shard(model: Any, mesh: Mesh, rules: Rules) -> Any:
    """Place each array of `model` on `mesh` as the rule table says (`jax.device_put`).

    Layers declare logical axis names for their weights (`treemod.axis_names`; see
    `treemod.logical_axes`); `rules` maps names to mesh axes, in order, and may also map
    array paths (regular expressions) to `PartitionSpec`s.

    Arguments:
        model: a model, or any pytree of arrays.
        mesh: the device mesh.
        rules: `(logical name, mesh axes)` and `(path regex, PartitionSpec)` pairs; presets:
            `fsdp_rules()`, `tensor_parallel_rules()`, `fsdp_tp_rules()`.

    Returns:
        `model` with its arrays as `NamedSharding`-placed arrays; other leaves unchanged.

    Raises:
        ShardingError: an array the rules cannot place; the message names its path, its
            axis name and the rule.

    Example:
        >>> import jax, treemod as tm
        >>> mesh = jax.make_mesh((2, 4), ("data", "model"))
        >>> mlp = tm.nn.MLP(8, 8, width_size=16, depth=1, key=jax.random.key(0))
        >>> mlp = tm.shard(mlp, mesh, tm.fsdp_tp_rules())
        >>> mlp.layers[0].weight.sharding.spec
        P('model', 'data')
    """
    shardings = model_shardings(model, mesh, rules)
    return jtu.tree_map(
        lambda s, x: x if s is None else jax.device_put(x, s),
        shardings,
        model,
        is_leaf=lambda s: s is None or isinstance(s, NamedSharding),
    )
