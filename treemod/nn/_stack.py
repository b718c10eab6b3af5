"""`Stack`: N layers of identical structure, arrays stacked on a leading axis, run by `lax.scan`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jaxtyping import PRNGKeyArray

from treemod._format.describe import describe_value
from treemod._module.module import Module, field
from treemod._module.state import State, collect_state_updates, is_state, update_state
from treemod._sharding.axes import axis_names
from treemod._sharding.constrain import active_axis_rules, constrain_hidden
from treemod._transforms.remat import RematPolicy, checkpoint_policy
from treemod._tree.filters import combine, is_array, partition

from ._utils import accepts_key, check_size, require_key

__all__ = ["Stack"]


def _states(tree: Any) -> list[State]:
    return [x for x in jtu.tree_leaves(tree, is_leaf=is_state) if isinstance(x, State)]


# `check_descendants=False`: the arrays below carry the extra layer axis, so `tree_at` does not
# check the modules it rebuilds below a Stack against their (one-layer) annotations.
@axis_names(leading=("layers",))
class Stack(Module, check_descendants=False):
    """`num_layers` layers of identical structure, applied in sequence with one `lax.scan`.

    The layers' arrays are stacked on a new leading axis, so the scan body is traced and
    compiled once, whatever the depth: compile time stays flat as the model deepens, where an
    unrolled Python loop grows linearly. Build it from a function of a key; the key is split
    once into `num_layers` keys, one per layer, and the function is traced once under
    `jax.vmap` (so building is as cheap as building one layer):

        stack = Stack(lambda k: Block(..., key=k), 48, key=key)

    `stack[i]` is layer `i` as an ordinary module, `len(stack)` the depth, and
    `Stack.from_layers([...])` stacks existing layers. Calls pass extra arguments to every
    layer; a call `key` is split once into one key per layer (for dropout). Layers that record
    state (`treemod.update_state`, e.g. BatchNorm) work under `treemod.stateful`: each layer's
    new state is collected inside the scan and written back to the stacked `State` nodes.

    Each layer must return an output of the structure, shapes and dtypes of its input (it is
    the scan carry). Non-array leaves (activation functions, flags) are shared by all layers.

    Arguments:
        make_layer: a function from a PRNG key to one layer.
        num_layers: the depth.
        key: the PRNG key.
        unroll: passed to `lax.scan`: layers per loop iteration (a positive int), or `True` for all.
        remat: rematerialise each layer in the backward pass (`jax.checkpoint` on the scan
            body): `False` (default: every intermediate is kept), `True` (only each layer's
            input is kept), or what else to keep, as `treemod.filter_checkpoint`'s `policy`:
            `"nothing"`, `"dots"`, `"everything"`, a list of `checkpoint_name` names, or a
            `jax.checkpoint_policies` function.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> stack = nn.Stack(lambda k: nn.Linear(8, 8, key=k), 6, key=jax.random.key(0))
        >>> stack.layers.weight.shape
        (6, 8, 8)
        >>> stack(jnp.ones((2, 8))).shape
        (2, 8)
        >>> len(stack), stack[0].weight.shape
        (6, (8, 8))
    """

    layers: Any
    num_layers: int = field(static=True)
    unroll: int = field(static=True, default=1)
    remat: bool | RematPolicy = field(static=True, default=False)

    def __init__(
        self,
        make_layer: Callable[[PRNGKeyArray], Any],
        num_layers: int,
        *,
        key: PRNGKeyArray,
        unroll: int = 1,
        remat: bool | RematPolicy = False,
    ) -> None:
        require_key("Stack", key)
        check_size("Stack", "num_layers", num_layers)
        _check_unroll("Stack", unroll)
        _check_remat("Stack", remat)
        static_box: list[Any] = []

        def make_arrays(k: PRNGKeyArray) -> Any:
            arrays, static = partition(make_layer(k), is_array)
            static_box.append(static)
            return arrays

        keys = jax.random.split(key, num_layers)
        arrays = jax.vmap(make_arrays)(keys)
        self.layers = combine(arrays, static_box[0])
        self.num_layers = num_layers
        self.unroll = unroll
        self.remat = remat

    def with_remat(self, remat: bool | RematPolicy) -> Stack:
        """This stack with another rematerialisation policy (`remat` as `Stack`'s).

        Arguments:
            remat: `False`, `True`, or a policy (`"dots"`, names, a `jax.checkpoint_policies`
                function).

        Returns:
            A new `Stack` holding the same layers.

        Example:
            >>> import jax, treemod as tm
            >>> stack = tm.nn.Stack(lambda k: tm.nn.Linear(3, 3, key=k), 2, key=jax.random.key(0))
            >>> stack.with_remat("dots").remat
            'dots'
        """
        _check_remat("Stack.with_remat", remat)
        return _template(type(self), self.layers, self.num_layers, self.unroll, remat)

    @classmethod
    def from_layers(
        cls, layers: Sequence[Any], *, unroll: int = 1, remat: bool | RematPolicy = False
    ) -> Stack:
        """Stack existing layers of identical structure (same tree structure, shapes, dtypes).

        Arguments:
            layers: the layers, at least one.
            unroll: passed to `lax.scan`.
            remat: as `Stack`'s.

        Returns:
            A `Stack`.

        Example:
            >>> import jax, treemod.nn as nn
            >>> k1, k2 = jax.random.split(jax.random.key(0))
            >>> stack = nn.Stack.from_layers([nn.Linear(4, 4, key=k1), nn.Linear(4, 4, key=k2)])
            >>> stack.layers.weight.shape
            (2, 4, 4)
        """
        _check_unroll("Stack.from_layers", unroll)
        _check_remat("Stack.from_layers", remat)
        layers = list(layers)
        if not layers:
            raise ValueError("Stack.from_layers needs at least one layer.")
        parts = [partition(layer, is_array) for layer in layers]
        first_arrays, static = parts[0]
        struct = jtu.tree_structure(layers[0])
        for i, (arrays, st) in enumerate(parts[1:], start=1):
            # jaxlib's PyTreeDef stub declares no comparison; PyTreeDefs compare by structure.
            if jtu.tree_structure(layers[i]) != struct:  # type: ignore[operator]
                raise ValueError(
                    f"Stack.from_layers: layer {i} does not have the tree structure of layer 0; "
                    "all layers must be of the same type and configuration."
                )
            reference = jtu.tree_leaves(first_arrays)
            for a, (path, b) in zip(reference, jtu.tree_leaves_with_path(arrays), strict=True):
                if a.shape != b.shape or a.dtype != b.dtype:
                    raise ValueError(
                        f"Stack.from_layers: layer {i} has {describe_value(b)} at "
                        f"{jtu.keystr(path)} where layer 0 has {describe_value(a)}."
                    )
            if jtu.tree_leaves(st) != jtu.tree_leaves(static):
                raise ValueError(
                    f"Stack.from_layers: layer {i} has non-array values (flags, floats) that "
                    "differ from layer 0's; they must be equal, as the layers share them."
                )
        stacked = jtu.tree_map(lambda *xs: jnp.stack(xs), *[p[0] for p in parts])
        return _template(cls, combine(stacked, static), len(layers), unroll, remat)

    def __len__(self) -> int:
        return self.num_layers

    def __getitem__(self, i: int) -> Any:
        if not isinstance(i, int):
            raise TypeError(f"Stack indices must be ints; got {type(i).__name__}.")
        if not -self.num_layers <= i < self.num_layers:
            raise IndexError(f"Stack index {i} out of range for {self.num_layers} layers.")
        arrays, static = partition(self.layers, is_array)
        return combine(jtu.tree_map(lambda a: a[i], arrays), static)

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(self.num_layers))

    def __call__(self, x: Any, *args: Any, key: PRNGKeyArray | None = None, **kwargs: Any) -> Any:
        """Apply the layers in order: `x = layer_i(x, *args, key=key_i, **kwargs)`.

        Arguments:
            x: the input of the first layer (the scan carry).
            *args: passed unchanged to every layer.
            key: optional PRNG key, split once into one key per layer.
            **kwargs: passed unchanged to every layer.

        Returns:
            The output of the last layer.
        """
        arrays, static = partition(self.layers, is_array)
        takes_key = accepts_key(self.layers)
        keys = None if key is None else jax.random.split(key, self.num_layers)
        updated: list[int] = []
        # Read once per trace: without `tm.axis_rules` the body traces nothing more.
        constrained = active_axis_rules() is not None

        def body(carry: Any, xs: Any) -> tuple[Any, Any]:
            layer_arrays, k = xs
            if constrained:  # the hidden state between layers, split as the rules say
                carry = constrain_hidden(carry)
            layer = combine(layer_arrays, static)
            if takes_key:
                call = lambda: layer(carry, *args, key=k, **kwargs)  # noqa: E731
            else:
                call = lambda: layer(carry, *args, **kwargs)  # noqa: E731
            out, updates = collect_state_updates(call)
            states = _states(layer)
            ids = {id(s): i for i, s in enumerate(states)}
            for sid in updates:
                if sid not in ids:
                    raise ValueError(
                        "Stack: a layer updated a State that is not its own; inside a Stack a "
                        "layer may only update its own State fields."
                    )
            updated[:] = sorted(ids[sid] for sid in updates)
            new_values = tuple(updates[id(states[i])][1] for i in updated)
            _check_carry(carry, out)
            return out, new_values

        if self.remat is not False:
            # Under `scan`, CSE cannot merge the recomputation into the forward pass anyway.
            policy = None if self.remat is True else checkpoint_policy(self.remat)
            body = jax.checkpoint(body, prevent_cse=False, policy=policy)
        out, new_values = lax.scan(body, x, (arrays, keys), unroll=self.unroll)
        if updated:
            outer = _states(self.layers)
            for i, value in zip(updated, new_values, strict=True):
                update_state(outer[i], value)
        return out


def _check_carry(x: Any, out: Any) -> None:
    sx = jtu.tree_structure(x)
    so = jtu.tree_structure(out)
    # jaxlib's PyTreeDef stub declares no comparison; PyTreeDefs compare by structure.
    same = sx == so and all(  # type: ignore[operator]
        np.shape(a) == np.shape(b) and jnp.result_type(a) == jnp.result_type(b)
        for a, b in zip(jtu.tree_leaves(x), jtu.tree_leaves(out), strict=True)
    )
    if not same:

        def describe(t: Any) -> str:
            return str(jtu.tree_map(lambda a: f"{jnp.result_type(a)}{list(np.shape(a))}", t))

        raise ValueError(
            "Stack: each layer must return an output with the structure, shape and dtype of "
            f"its input (it is the scan carry); the layer maps {describe(x)} to "
            f"{describe(out)}."
        )


def _check_unroll(owner: str, unroll: Any) -> None:
    """`lax.scan`'s `unroll`: a positive int (layers per loop iteration), or a bool (all, or 1)."""
    if not isinstance(unroll, bool):
        check_size(owner, "unroll", unroll)


def _check_remat(owner: str, remat: Any) -> None:
    if not isinstance(remat, bool):
        checkpoint_policy(remat, f"{owner}: `remat`")


def _template(
    cls: type[Stack], layers: Any, num_layers: int, unroll: int, remat: bool | RematPolicy
) -> Stack:
    obj = object.__new__(cls)
    obj.__dict__.update(layers=layers, num_layers=num_layers, unroll=unroll, remat=remat)
    return obj
