"""Recurrent cells: `GRUCell`, `LSTMCell`."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Num, PRNGKeyArray

from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from . import init as _init
from ._batching import Core, batch_apply
from ._utils import check_size, default_dtype, lead, matmul_t, promote_input, require_key

__all__ = ["GRUCell", "LSTMCell"]

# The gates' stacked hidden axis is split like an MLP's hidden axis.
_RNN_AXES = {
    "weight_ih": ("mlp", "embed"),
    "weight_hh": ("mlp", None),
    "bias": ("mlp",),
    "bias_n": ("mlp",),
}


def _params(
    owner: str,
    gates: int,
    input_size: int,
    hidden_size: int,
    use_bias: bool,
    dtype: Any,
    weight_init: Any,
    bias_init: Any,
    key: Any,
    extra_bias: bool,
) -> tuple[Array, Array, Array | None, Array | None]:
    require_key(owner, key)
    check_size(owner, "input_size", input_size)
    check_size(owner, "hidden_size", hidden_size)
    dtype = default_dtype(owner, dtype)
    bound = 1 / math.sqrt(hidden_size) if hidden_size > 0 else 0.0
    default = _init.uniform(-bound, bound)
    weight_init = default if weight_init is None else weight_init
    bias_init = default if bias_init is None else bias_init
    ikey, hkey, bkey, nkey = jax.random.split(key, 4)
    weight_ih = weight_init(ikey, (gates * hidden_size, input_size), dtype)
    weight_hh = weight_init(hkey, (gates * hidden_size, hidden_size), dtype)
    bias = bias_init(bkey, (gates * hidden_size,), dtype) if use_bias else None
    bias_n = bias_init(nkey, (hidden_size,), dtype) if use_bias and extra_bias else None
    return weight_ih, weight_hh, bias, bias_n


@axis_names(_RNN_AXES)
class GRUCell(Module):
    """One step of a gated recurrent unit (PyTorch's `nn.GRUCell`, Equinox's `nn.GRUCell`).

    With gates `r, z, n` (in that order along the first axis of the weights):
    `r = σ(W_ir x + W_hr h + b_r)`, `z = σ(W_iz x + W_hz h + b_z)`,
    `n = tanh(W_in x + b_n + r * (W_hn h + bias_n))`, `h' = (1 - z) * n + z * h`.
    `bias` holds PyTorch's `b_ih + b_hh` for `r, z` and `b_ih` for `n`; `bias_n` is the
    `b_hh` of `n`. All parameters start U(±1/sqrt(hidden_size)) as in PyTorch. The key is
    split once into four (`weight_ih`, `weight_hh`, `bias`, `bias_n`).

    Arguments:
        input_size: input features.
        hidden_size: hidden features.
        use_bias: whether to use biases.
        dtype: parameter dtype.
        weight_init: initialiser of both weights.
        bias_init: initialiser of the biases.
        key: the PRNG key.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> cell = nn.GRUCell(3, 8, key=jax.random.key(0))
        >>> cell(jnp.ones((5, 3)), jnp.zeros((5, 8))).shape
        (5, 8)
    """

    weight_ih: Float[Array, "three_hidden input_size"]
    weight_hh: Float[Array, "three_hidden hidden_size"]
    bias: Float[Array, " three_hidden"] | None
    bias_n: Float[Array, " hidden_size"] | None
    input_size: int = field(static=True)
    hidden_size: int = field(static=True)
    use_bias: bool = field(static=True)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        use_bias: bool = True,
        dtype: Any = None,
        *,
        weight_init: _init.Initializer | None = None,
        bias_init: _init.Initializer | None = None,
        key: PRNGKeyArray,
    ) -> None:
        self.weight_ih, self.weight_hh, self.bias, self.bias_n = _params(
            "GRUCell",
            3,
            input_size,
            hidden_size,
            use_bias,
            dtype,
            weight_init,
            bias_init,
            key,
            extra_bias=True,
        )
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.use_bias = use_bias

    def __call__(
        self,
        input: Num[Array, "*batch input_size"],
        hidden: Float[Array, "*#batch hidden_size"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "*batch hidden_size"]:
        """One step.

        Arguments:
            input: `(*batch, input_size)`.
            hidden: `(*batch, hidden_size)` (or `(hidden_size,)`, broadcast).
            key: ignored.

        Returns:
            The new hidden state, `(*batch, hidden_size)`.
        """
        input = promote_input(input, self.weight_ih.dtype)
        inputs = [
            Core("input", input, (("input_size", self.input_size),)),
            Core("hidden", hidden, (("hidden_size", self.hidden_size),)),
        ]
        return batch_apply("GRUCell", self._flat, inputs)

    def _flat(self, x: Array, h: Array) -> Array:
        gi = matmul_t(x, self.weight_ih)
        gh = matmul_t(h, self.weight_hh)
        if self.bias is not None:
            gi = gi + lead(self.bias, gi.ndim)
        ir, iz, i_n = jnp.split(gi, 3, axis=-1)
        hr, hz, hn = jnp.split(gh, 3, axis=-1)
        if self.bias_n is not None:
            hn = hn + lead(self.bias_n, hn.ndim)
        r = jax.nn.sigmoid(ir + hr)
        z = jax.nn.sigmoid(iz + hz)
        n = jnp.tanh(i_n + r * hn)
        return (1 - z) * n + z * h


@axis_names(_RNN_AXES)
class LSTMCell(Module):
    """One step of a long short-term memory cell (PyTorch's `nn.LSTMCell`).

    Gates `i, f, g, o` in PyTorch's order: `c' = σ(f) c + σ(i) tanh(g)`, `h' = σ(o) tanh(c')`.
    `bias` is PyTorch's `b_ih + b_hh`. Parameters start U(±1/sqrt(hidden_size)). The key is
    split once into four (`weight_ih`, `weight_hh`, `bias`, and one unused).

    Arguments:
        input_size: input features.
        hidden_size: hidden features.
        use_bias: whether to use a bias.
        dtype: parameter dtype.
        weight_init: initialiser of both weights.
        bias_init: initialiser of the bias.
        key: the PRNG key.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> cell = nn.LSTMCell(3, 8, key=jax.random.key(0))
        >>> h, c = cell(jnp.ones(3), (jnp.zeros(8), jnp.zeros(8)))
        >>> h.shape, c.shape
        ((8,), (8,))
    """

    weight_ih: Float[Array, "four_hidden input_size"]
    weight_hh: Float[Array, "four_hidden hidden_size"]
    bias: Float[Array, " four_hidden"] | None
    input_size: int = field(static=True)
    hidden_size: int = field(static=True)
    use_bias: bool = field(static=True)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        use_bias: bool = True,
        dtype: Any = None,
        *,
        weight_init: _init.Initializer | None = None,
        bias_init: _init.Initializer | None = None,
        key: PRNGKeyArray,
    ) -> None:
        self.weight_ih, self.weight_hh, self.bias, _ = _params(
            "LSTMCell",
            4,
            input_size,
            hidden_size,
            use_bias,
            dtype,
            weight_init,
            bias_init,
            key,
            extra_bias=False,
        )
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.use_bias = use_bias

    def __call__(
        self,
        input: Num[Array, "*batch input_size"],
        hidden: tuple[Float[Array, "*#batch hidden_size"], Float[Array, "*#batch hidden_size"]],
        *,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Float[Array, "*batch hidden_size"], Float[Array, "*batch hidden_size"]]:
        """One step.

        Arguments:
            input: `(*batch, input_size)`.
            hidden: `(h, c)`, each `(*batch, hidden_size)` (or unbatched, broadcast).
            key: ignored.

        Returns:
            The new `(h, c)`.
        """
        if not isinstance(hidden, tuple | list) or len(hidden) != 2:
            raise TypeError(
                "LSTMCell: `hidden` must be a pair (h, c) of arrays of shape (*batch, "
                f"hidden_size); got {type(hidden).__name__}."
            )
        input = promote_input(input, self.weight_ih.dtype)
        h, c = hidden
        dims = (("hidden_size", self.hidden_size),)
        inputs = [
            Core("input", input, (("input_size", self.input_size),)),
            Core("hidden[0]", h, dims),
            Core("hidden[1]", c, dims),
        ]
        return batch_apply("LSTMCell", self._flat, inputs)

    def _flat(self, x: Array, h: Array, c: Array) -> tuple[Array, Array]:
        gates = matmul_t(x, self.weight_ih) + matmul_t(h, self.weight_hh)
        if self.bias is not None:
            gates = gates + lead(self.bias, gates.ndim)
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return h, c
