"""`Linear`, `Identity`, and the `FanInFanOutLinear` contract."""

from __future__ import annotations

import math
from typing import Any, Literal

import jax
from jaxtyping import Array, Inexact, Num, PRNGKeyArray

from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from . import init as _init
from ._batching import Core, batch_apply
from ._utils import check_size, default_dtype, lead, matmul_t, promote_input, require_key

__all__ = ["FanInFanOutLinear", "Identity", "Linear"]


class FanInFanOutLinear:
    """The contract a layer declares, by inheriting this class, to compute `x @ weight + bias`
    with `weight` stored `(in_features, out_features)` (PEFT's `fan_in_fan_out`;
    `transformers`' `Conv1D`, GPT-2's projections), with fields `weight` and `bias` and built
    as `cls(weight=..., bias=...)`. `treemod.lora` adapts it with `fan_in_fan_out`, and
    `treemod.quant` quantises it as the `Linear` it computes (its weight transposed), as
    `transformers`' bitsandbytes integration does. The packages read the contract from the
    class; none imports the package that declares it.
    """

    __slots__ = ()


# On its own a Linear is an up projection (hidden `mlp` outputs); `MLP` and attention name theirs.
@axis_names({"weight": ("mlp", "embed"), "bias": ("mlp",)})
class Linear(Module):
    """An affine map `y = x @ weight.T + bias` (PyTorch's `nn.Linear`, Equinox's `nn.Linear`).

    The key is split once into two: `weight_key, bias_key = jax.random.split(key, 2)`.
    By default both weight and bias are drawn from U(-1/sqrt(in), 1/sqrt(in)), like PyTorch.

    Accepts `x` of shape `(in_features,)` or with any number of leading batch dimensions
    `(*batch, in_features)` (a single matmul). With `in_features="scalar"`, `x` has shape
    `(*batch,)`; with `out_features="scalar"`, the output drops its last dimension.

    Arguments:
        in_features: input size, or `"scalar"` for a scalar input.
        out_features: output size, or `"scalar"` for a scalar output.
        use_bias: whether to add a bias.
        dtype: parameter dtype (float32 by default; bfloat16 works; complex64 gives a complex
            layer, as in PyTorch).
        weight_init: initialiser `(key, shape, dtype) -> array` for the `(out, in)` weight
            (default: PyTorch's).
        bias_init: initialiser for the `(out,)` bias (default: PyTorch's).
        key: the PRNG key.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> linear = nn.Linear(3, 4, key=jax.random.key(0))
        >>> linear(jnp.ones(3)).shape
        (4,)
        >>> linear(jnp.ones((8, 5, 3))).shape
        (8, 5, 4)
    """

    weight: Inexact[Array, "out in"]
    bias: Inexact[Array, " out"] | None
    in_features: int | Literal["scalar"] = field(static=True)
    out_features: int | Literal["scalar"] = field(static=True)
    use_bias: bool = field(static=True)

    def __init__(
        self,
        in_features: int | Literal["scalar"],
        out_features: int | Literal["scalar"],
        use_bias: bool = True,
        dtype: Any = None,
        *,
        weight_init: _init.Initializer | None = None,
        bias_init: _init.Initializer | None = None,
        key: PRNGKeyArray,
    ) -> None:
        require_key("Linear", key)
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if not (isinstance(v, str) and v == "scalar"):
                check_size("Linear", name, v)
        dtype = default_dtype("Linear", dtype, complex_ok=True)
        n_in = 1 if in_features == "scalar" else int(in_features)
        n_out = 1 if out_features == "scalar" else int(out_features)
        wkey, bkey = jax.random.split(key, 2)
        weight_init = _init.pytorch_default if weight_init is None else weight_init
        self.weight = weight_init(wkey, (n_out, n_in), dtype)
        if use_bias:
            if bias_init is None:
                bound = 1 / math.sqrt(n_in) if n_in > 0 else 0.0
                bias_init = _init.uniform(-bound, bound)
            self.bias = bias_init(bkey, (n_out,), dtype)
        else:
            self.bias = None
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = use_bias

    def __call__(
        self,
        x: Num[Array, "*batch in"] | Num[Array, "*batch"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Inexact[Array, "*batch out"] | Inexact[Array, "*batch"]:
        """Apply the layer.

        Arguments:
            x: `(*batch, in_features)`, or `(*batch,)` when `in_features="scalar"`; integer
                inputs are promoted to the weight's dtype, as JAX promotes them.
            key: ignored (for a uniform interface with layers that need one).

        Returns:
            `(*batch, out_features)`, or `(*batch,)` when `out_features="scalar"`.
        """
        x = promote_input(x, self.weight.dtype)
        dims = () if self.in_features == "scalar" else (("in_features", self.in_features),)
        return batch_apply("Linear", self._flat, [Core("x", x, dims)])

    def _flat(self, x: Array) -> Array:
        if self.in_features == "scalar":
            x = x[..., None]
        y = matmul_t(x, self.weight)
        if self.bias is not None:
            y = y + lead(self.bias, y.ndim)
        if self.out_features == "scalar":
            y = y[..., 0]
        return y


class Identity(Module):
    """Return the input unchanged; accepts and ignores any other arguments.

    Example:
        >>> import jax.numpy as jnp, treemod.nn as nn
        >>> nn.Identity()(jnp.ones(2))
        Array([1., 1.], dtype=float32)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, x: Any, *, key: PRNGKeyArray | None = None) -> Any:
        """Return `x`.

        Arguments:
            x: anything.
            key: ignored (accepted so that containers can pass keys to every layer).

        Returns:
            `x` itself.
        """
        return x
