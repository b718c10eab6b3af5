"""`MLP`: a stack of `Linear` layers with activations."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
from jaxtyping import Array, Float, Num, PRNGKeyArray

from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from . import init as _init
from ._linear import Linear
from ._utils import check_size, require_key

__all__ = ["MLP", "identity"]


def _mlp_axes(n: int) -> dict[str, tuple[str | None, ...]]:
    """Axis names of an MLP of `n` Linears: input `embed`, hidden `mlp`, output `embed`."""
    if n == 1:
        return {}  # a lone Linear keeps its own names
    names: dict[str, tuple[str | None, ...]] = {}
    for i in range(n):
        out = "embed" if i == n - 1 else "mlp"
        names[f"layers.{i}.weight"] = (out, "embed" if i == 0 else "mlp")
        names[f"layers.{i}.bias"] = (out,)
    return names


def identity(x: Any) -> Any:
    """`x` itself: `MLP`'s default `final_activation` (a named function, so models pickle)."""
    return x


_identity = identity  # the name that pickles of MLPs with the default activation refer to


@axis_names(lambda mlp: _mlp_axes(len(mlp.layers)))
class MLP(Module):
    """A multi-layer perceptron: `depth` hidden layers of `width_size`, then an output layer.

    The key is split once into `depth + 1` keys, one per `Linear` (in order).

    Arguments:
        in_size: input size, or `"scalar"`.
        out_size: output size, or `"scalar"`.
        width_size: hidden width (an int, or one int per hidden layer).
        depth: number of hidden layers (`depth=0` is a single `Linear`).
        activation: applied after each hidden layer (default `jax.nn.relu`).
        final_activation: applied to the output (default identity).
        use_bias: bias on the hidden layers.
        use_final_bias: bias on the output layer.
        dtype: parameter dtype.
        weight_init: weight initialiser of every `Linear`.
        bias_init: bias initialiser of every `Linear`.
        key: the PRNG key.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> mlp = nn.MLP(2, 3, width_size=16, depth=2, key=jax.random.key(0))
        >>> mlp(jnp.ones((10, 2))).shape
        (10, 3)
    """

    layers: tuple[Linear, ...]
    activation: Callable[[Array], Array] = field(static=True)
    final_activation: Callable[[Array], Array] = field(static=True)
    in_size: int | Literal["scalar"] = field(static=True)
    out_size: int | Literal["scalar"] = field(static=True)
    width_size: int | tuple[int, ...] = field(static=True)
    depth: int = field(static=True)

    def __init__(
        self,
        in_size: int | Literal["scalar"],
        out_size: int | Literal["scalar"],
        width_size: int | Sequence[int],
        depth: int,
        activation: Callable[[Array], Array] = jax.nn.relu,
        final_activation: Callable[[Array], Array] = identity,
        use_bias: bool = True,
        use_final_bias: bool = True,
        dtype: Any = None,
        *,
        weight_init: _init.Initializer | None = None,
        bias_init: _init.Initializer | None = None,
        key: PRNGKeyArray,
    ) -> None:
        require_key("MLP", key)
        for name, v in (("in_size", in_size), ("out_size", out_size)):
            if not (isinstance(v, str) and v == "scalar"):
                check_size("MLP", name, v)
        check_size("MLP", "depth", depth, minimum=0)
        if isinstance(width_size, str) or not hasattr(width_size, "__iter__"):
            check_size("MLP", "width_size", width_size)
        elif isinstance(width_size, list | tuple):
            for i, w in enumerate(width_size):
                check_size("MLP", f"width_size[{i}]", w)
        if not isinstance(width_size, int):
            width_size = tuple(width_size)
            if len(width_size) != depth:
                raise ValueError(
                    f"MLP: `width_size` has {len(width_size)} entries but depth={depth}; give one "
                    "width per hidden layer, or a single int."
                )
            widths: tuple[int, ...] = width_size
        else:
            widths = (width_size,) * depth
        sizes: list[Any] = [in_size, *widths, out_size]
        keys = jax.random.split(key, depth + 1)
        kw = dict(dtype=dtype, weight_init=weight_init, bias_init=bias_init)
        self.layers = tuple(
            Linear(
                sizes[i], sizes[i + 1], use_bias if i < depth else use_final_bias, key=keys[i], **kw
            )
            for i in range(depth + 1)
        )
        self.activation = activation
        self.final_activation = final_activation
        self.in_size = in_size
        self.out_size = out_size
        self.width_size = width_size
        self.depth = depth

    def __call__(
        self, x: Num[Array, "*batch in_size"] | Num[Array, "*batch"], *, key: Any = None
    ) -> Float[Array, "*batch out_size"] | Float[Array, "*batch"]:
        """Apply the MLP to `(*batch, in_size)` (`(*batch,)` for a scalar input).

        Arguments:
            x: the input.
            key: ignored.

        Returns:
            `(*batch, out_size)` (`(*batch,)` for a scalar output).
        """
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        return self.final_activation(self.layers[-1](x))
