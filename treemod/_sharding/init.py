"""`sharded_init`: build a model straight into its shardings (abstract build, compiled init)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import jax
import jax.tree_util as jtu
from jax.sharding import Mesh

from treemod._sharding.axes import is_shaped
from treemod._sharding.place import model_shardings
from treemod._sharding.rules import Rules
from treemod._transforms.eval_shape import filter_eval_shape

__all__ = ["merge_arrays", "sharded_init", "split_arrays"]

P = ParamSpec("P")
R = TypeVar("R")


def split_arrays(tree: Any) -> tuple[Any, Any]:
    """`(arrays, others)`: `tree` twice, with `None` in place of its other leaves, then of its
    arrays."""
    leaves, treedef = jtu.tree_flatten(tree)
    arrays = [x if is_shaped(x) else None for x in leaves]
    others = [None if is_shaped(x) else x for x in leaves]
    return jtu.tree_unflatten(treedef, arrays), jtu.tree_unflatten(treedef, others)


def merge_arrays(arrays: Any, others: Any) -> Any:
    """The inverse of `split_arrays`."""
    return jtu.tree_map(
        lambda a, o: o if a is None else a, arrays, others, is_leaf=lambda x: x is None
    )


def sharded_init(
    build: Callable[P, R], mesh: Mesh, rules: Rules, *args: P.args, **kwargs: P.kwargs
) -> R:
    """Build a model directly into its shardings: no device ever holds it whole.

    The model is first built abstractly (`filter_eval_shape`: shapes only), its shardings read
    from the rule table, then built for real by one compiled program whose outputs have those
    shardings, so each device computes and keeps only its shards.

    Arguments:
        build: a function returning the model (e.g. a layer class), called with `args`.
        mesh: the device mesh.
        rules: the rule table (see `treemod.shard`).
        *args: `build`'s positional arguments (arrays are traced, other values static).
        **kwargs: its keyword arguments.

    Returns:
        The model, its arrays placed as `shard(model, mesh, rules)` would place them.

    Example:
        >>> import jax, treemod as tm
        >>> mesh = jax.make_mesh((8,), ("data",))
        >>> emb = tm.sharded_init(tm.nn.Embedding, mesh, tm.fsdp_rules(), 64, 16,
        ...                       key=jax.random.key(0))
        >>> emb.weight.addressable_shards[0].data.shape
        (8, 16)
    """
    abstract = filter_eval_shape(build, *args, **kwargs)
    shardings = model_shardings(abstract, mesh, rules)
    inputs, static_inputs = split_arrays((args, kwargs))
    _, static_outputs = split_arrays(abstract)

    def init(inputs: Any) -> Any:
        call_args, call_kwargs = merge_arrays(inputs, static_inputs)
        return split_arrays(build(*call_args, **call_kwargs))[0]

    arrays = jax.jit(init, out_shardings=shardings)(inputs)
    return merge_arrays(arrays, static_outputs)  # type: ignore[no-any-return]
