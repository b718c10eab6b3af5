"""Equinox's `MLP`: treemod's, with `scan=` (hidden layers stacked and run by `lax.scan`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax

from treemod import field, filter_vmap, if_array, is_array
from treemod._compat_api import identity, require_key
from treemod.nn import MLP as _MLP

from ._init import placeholder
from ._linear import Linear

__all__ = ["MLP"]


# Applies an activation (with its per-neuron parameters, if any) to each neuron: the last axis.
_per_neuron = filter_vmap(lambda act, x: act(x), in_axes=(if_array(0), -1), out_axes=-1)


# `check_descendants=False`: with scan=True the hidden Linear's arrays carry a leading layer
# axis, so `tree_at` does not check modules rebuilt below an MLP against their annotations.
class MLP(_MLP, check_descendants=False, shapecheck=False):
    """Equinox's `nn.MLP`: `depth` hidden `Linear` layers of `width_size`, then an output layer.

    The same key splits and initialisation as Equinox (and `treemod.nn.MLP`). With
    `scan=True` the `depth - 1` hidden-to-hidden layers are held as one `Linear` whose arrays
    have a leading axis of length `depth - 1` (`layers == (input, hidden_stack, output)`) and are
    applied with `jax.lax.scan`, which compiles one layer instead of `depth - 1`.

    As in Equinox, `activation` holds one copy per hidden neuron (arrays of shape
    `(depth, width_size, ...)` for a learnt activation such as `PReLU`) and `final_activation`
    one per output, each applied to its own neuron.

    Arguments:
        in_size: input size, or `"scalar"`.
        out_size: output size, or `"scalar"`.
        width_size: hidden width.
        depth: number of hidden layers.
        activation: applied after each hidden layer.
        final_activation: applied to the output.
        use_bias: bias on the hidden layers.
        use_final_bias: bias on the output layer.
        dtype: parameter dtype.
        scan: stack the hidden layers and run them with `lax.scan`.
        key: the PRNG key.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> mlp = eqx.nn.MLP(2, 3, 8, depth=4, scan=True, key=jax.random.key(0))
        >>> mlp.layers[1].weight.shape
        (3, 8, 8)
        >>> mlp(jnp.ones(2)).shape
        (3,)
    """

    # Pytree nodes, as in Equinox: one copy of the activation per neuron (see the docstring).
    activation: Callable[..., Any]
    final_activation: Callable[..., Any]
    use_bias: bool = field(static=True)
    use_final_bias: bool = field(static=True)
    scan: bool = field(static=True)

    def __init__(
        self,
        in_size: int | Literal["scalar"],
        out_size: int | Literal["scalar"],
        width_size: int,
        depth: int,
        activation: Callable[..., Any] = jax.nn.relu,
        final_activation: Callable[..., Any] = identity,
        use_bias: bool = True,
        use_final_bias: bool = True,
        dtype: Any = None,
        *,
        scan: bool = False,
        key: Any,
    ) -> None:
        if not scan or depth == 0:
            super().__init__(
                in_size,
                out_size,
                width_size,
                depth,
                activation,
                final_activation,
                use_bias,
                use_final_bias,
                dtype,
                weight_init=placeholder,
                bias_init=placeholder,
                key=key,
            )
            # Equinox's draws (in the parameter dtype), and the compat `Linear` class.
            keys = jax.random.split(key, depth + 1)
            self.layers = tuple(
                Linear(old.in_features, old.out_features, old.use_bias, old.weight.dtype, key=k)
                for old, k in zip(self.layers, keys, strict=True)
            )
        else:
            require_key("MLP", key)
            if not isinstance(width_size, int):
                raise ValueError(
                    f"MLP(scan=True) stacks identical hidden layers, so width_size must be one "
                    f"int; got {width_size!r}."
                )
            keys = jax.random.split(key, depth + 1)
            hidden = jax.vmap(lambda k: Linear(width_size, width_size, use_bias, dtype, key=k))(
                keys[1:depth]
            )
            self.layers = (
                Linear(in_size, width_size, use_bias, dtype, key=keys[0]),
                hidden,
                Linear(width_size, out_size, use_final_bias, dtype, key=keys[-1]),
            )
            self.activation = activation
            self.final_activation = final_activation
            self.in_size = in_size
            self.out_size = out_size
            self.width_size = width_size
            self.depth = depth
        self.use_bias = use_bias
        self.use_final_bias = use_final_bias
        self.scan = scan
        if isinstance(width_size, int):
            # Equinox keeps one copy per neuron, so a learnt activation (a PReLU) learns one
            # slope per neuron: arrays of shape (depth, width_size) and (out_size,).
            self.activation = filter_vmap(
                filter_vmap(lambda: activation, axis_size=width_size), axis_size=depth
            )()
            if out_size != "scalar":
                self.final_activation = filter_vmap(lambda: final_activation, axis_size=out_size)()

    def _hidden_activation(self, i: Any, x: Any) -> Any:
        if not isinstance(self.width_size, int):
            return self.activation(x)
        return _per_neuron(jtu.tree_map(lambda v: v[i] if is_array(v) else v, self.activation), x)

    def _final(self, x: Any) -> Any:
        if not isinstance(self.width_size, int) or self.out_size == "scalar":
            return self.final_activation(x)
        return _per_neuron(self.final_activation, x)

    def __call__(self, x: Any, *, key: Any = None) -> Any:
        """Apply the MLP to `(in_size,)` (or `()` for a scalar input; batch axes also work)."""
        if self.depth == 0:
            return self._final(self.layers[0](x))
        if not self.scan:
            for i, layer in enumerate(self.layers[:-1]):
                x = self._hidden_activation(i, layer(x))
            return self._final(self.layers[-1](x))
        first, hidden, last = self.layers

        def step(h: Any, index_and_layer: tuple[Any, Any]) -> tuple[Any, None]:
            i, layer = index_and_layer
            return self._hidden_activation(i, layer(h)), None

        x = self._hidden_activation(0, first(x))
        x, _ = lax.scan(step, x, (jnp.arange(1, self.depth), hidden))
        return self._final(last(x))
