"""`LoRALinear` and `LoRAConv`: a frozen base layer plus a trainable low-rank update."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, PRNGKeyArray

from treemod._module.module import Module, field
from treemod.nn import Conv, Dropout, Linear
from treemod.nn import init as _init

__all__ = ["LoRALayer", "LoRAConv", "LoRALinear"]


class LoRALayer(Module):
    """The common part of `LoRALinear` and `LoRAConv`: `base(x) + scaling * B(A(dropout(x)))`.

    The attribute names are PEFT's (`base_layer`, `lora_A`, `lora_B`, `lora_dropout`), so the
    state-dict names of a model with adapters are PEFT's too (without its adapter name,
    `default`, which PEFT's adapter files leave out as well).

    Arguments:
        base_layer: the frozen layer.
        lora_A: the down projection (`r` outputs).
        lora_B: the up projection (zero at creation, so the output starts unchanged).
        lora_dropout: dropout applied to the input of `lora_A` (PEFT's `lora_dropout`).
        r: the rank.
        lora_alpha: PEFT's `lora_alpha`.
        use_rslora: scale by `alpha / sqrt(r)` (rank-stabilised LoRA) instead of `alpha / r`.
        merged: whether `base_layer`'s weight already holds the update (then the call skips
            the adapter branch; `treemod.lora.unmerge` takes it out again).
        path: the layer's key path in the model `add_lora` wrapped (`""` when built
            directly), for messages.
    """

    base_layer: Any
    lora_A: Any
    lora_B: Any
    lora_dropout: Dropout
    r: int = field(static=True)
    lora_alpha: float = field(static=True)
    use_rslora: bool = field(static=True, default=False)
    merged: bool = field(static=True, default=False)
    path: str = field(static=True, default="")

    def __check_init__(self) -> None:
        owner = type(self).__name__
        r, alpha = self.r, self.lora_alpha
        if isinstance(r, bool | np.bool_) or not isinstance(r, int | np.integer) or r < 1:
            raise ValueError(f"{owner}: `r` (the rank) must be a positive int; got {r!r}.")
        number = isinstance(alpha, int | float | np.integer | np.floating) and not isinstance(
            alpha, bool | np.bool_
        )
        if not (number and 0 < float(alpha) < math.inf):
            raise ValueError(
                f"{owner}: `lora_alpha` must be a finite positive number; got {alpha!r} (the "
                "update is scaled by lora_alpha / r)."
            )
        if not isinstance(self.use_rslora, bool | np.bool_):
            raise ValueError(f"{owner}: `use_rslora` must be a bool; got {self.use_rslora!r}.")

    def at_path(self, path: str) -> LoRALayer:
        """This layer with `path` set (built as unflattening builds modules, so a layer of a
        `Stack`, whose arrays have the layer axis, is taken as it is)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__["path"] = path
        return new

    @property
    def scaling(self) -> float:
        """`lora_alpha / r`, or `lora_alpha / sqrt(r)` with `use_rslora` (PEFT's rule)."""
        return self.lora_alpha / (self.r**0.5 if self.use_rslora else self.r)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`base_layer(x) + scaling * lora_B(lora_A(lora_dropout(x)))` (PEFT's order).

        Arguments:
            x: the base layer's input.
            key: the dropout key; needed in training mode when `lora_dropout.p > 0`.

        Returns:
            The base layer's output plus the low-rank update.
        """
        y = self.base_layer(x)
        if self.merged:
            return y  # type: ignore[no-any-return]
        dropout = self.lora_dropout
        if isinstance(dropout.p, int | float) and dropout.p == 0 or dropout.inference:
            h = x
        elif key is None:
            where = f" at {self.path}" if self.path else ""
            raise ValueError(
                f"{type(self).__name__}{where}: lora_dropout={dropout.p} needs a key in training "
                "mode, and the layer was called without one. Pass `key=` to the model's call "
                "(a zoo model splits it into one key per projection), or call "
                "treemod.nn.inference_mode(model) to evaluate."
            )
        else:
            h = dropout(x, key=key)
        h = h.astype(self.lora_A.weight.dtype) if jnp.issubdtype(h.dtype, jnp.floating) else h
        return y + self.lora_B(self.lora_A(h)) * self.scaling  # type: ignore[no-any-return]

    def delta_weight(self) -> Array:
        """`scaling * B @ A` laid out as `base_layer.weight` (a layer axis kept in front)."""
        raise NotImplementedError


def _vmapped(fn: Any, extra: int) -> Any:
    for _ in range(extra):
        fn = jax.vmap(fn)
    return fn


class LoRALinear(LoRALayer):
    """LoRA on a `treemod.nn.Linear` (or on `transformers`' `Conv1D` of GPT-2, whose weight is
    stored `(in, out)`: PEFT's `fan_in_fan_out`).

    Built by `treemod.lora.add_lora`; see `LoRALayer` for the fields and the call.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn, treemod.lora as lora
        >>> layer = lora.LoRALinear.wrap(nn.Linear(4, 3, key=jax.random.key(0)), r=2,
        ...                              alpha=4, key=jax.random.key(1))
        >>> layer.lora_A.weight.shape, layer.lora_B.weight.shape, layer.scaling
        ((2, 4), (3, 2), 2.0)
    """

    fan_in_fan_out: bool = field(static=True, default=False)

    @classmethod
    def wrap(
        cls,
        base: Any,
        *,
        r: int,
        alpha: float,
        dropout: float = 0.0,
        use_rslora: bool = False,
        fan_in_fan_out: bool = False,
        key: PRNGKeyArray,
    ) -> LoRALinear:
        """Wrap one layer: A kaiming-uniform (a=sqrt(5), PEFT's default), B zero.

        Arguments:
            base: a `Linear`, a quantised linear layer of `treemod.quant` (QLoRA), or a layer
                with a 2-D `(in, out)` weight if `fan_in_fan_out`.
            r: the rank.
            alpha: `lora_alpha`.
            dropout: `lora_dropout`.
            use_rslora: rank-stabilised scaling.
            fan_in_fan_out: the base weight is stored `(in, out)`.
            key: initialises A.

        Returns:
            The wrapped layer.
        """
        w = base.weight
        if isinstance(base, Linear) or fan_in_fan_out:
            n_out, n_in = (w.shape[-1], w.shape[-2]) if fan_in_fan_out else w.shape[-2:]
            dtype = w.dtype
        else:  # a quantised layer (`treemod.quant`): its weight is packed integers
            n_out, n_in, dtype = base.out_features, base.in_features, base.dtype
        lora_a = Linear(n_in, r, use_bias=False, dtype=dtype, key=key)
        lora_b = Linear(r, n_out, use_bias=False, dtype=dtype, weight_init=_init.zeros, key=key)
        return cls(
            base_layer=base,
            lora_A=lora_a,
            lora_B=lora_b,
            lora_dropout=Dropout(dropout),
            r=r,
            lora_alpha=alpha,
            use_rslora=use_rslora,
            fan_in_fan_out=fan_in_fan_out,
        )

    def delta_weight(self) -> Array:
        """`scaling * B @ A` laid out as `base_layer.weight` (a layer axis kept in front)."""
        a, b = self.lora_A.weight, self.lora_B.weight
        delta = jnp.einsum("...or,...ri->...oi", b, a) * self.scaling
        return jnp.swapaxes(delta, -1, -2) if self.fan_in_fan_out else delta


class LoRAConv(LoRALayer):
    """LoRA on a `treemod.nn.Conv` (PEFT's LoRA convolution): `lora_A` a convolution with the
    base layer's kernel, stride, padding and dilation and `r` output channels, `lora_B` a 1x1
    convolution.

    Built by `treemod.lora.add_lora`; see `LoRALayer` for the fields and the call.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn, treemod.lora as lora
        >>> conv = nn.Conv2d(3, 8, 3, padding=1, key=jax.random.key(0))
        >>> layer = lora.LoRAConv.wrap(conv, r=2, alpha=2, key=jax.random.key(1))
        >>> layer.lora_A.weight.shape, layer.lora_B.weight.shape
        ((2, 3, 3, 3), (8, 2, 1, 1))
        >>> bool(jnp.allclose(layer(jnp.ones((1, 3, 5, 5))), conv(jnp.ones((1, 3, 5, 5)))))
        True
    """

    @classmethod
    def wrap(
        cls,
        base: Conv,
        *,
        r: int,
        alpha: float,
        dropout: float = 0.0,
        use_rslora: bool = False,
        key: PRNGKeyArray,
    ) -> LoRAConv:
        """Wrap one convolution: A kaiming-uniform (a=sqrt(5)), B zero.

        Arguments:
            base: the `Conv` (groups 1, zero padding: PEFT's LoRA convolution assumes both).
            r: the rank.
            alpha: `lora_alpha`.
            dropout: `lora_dropout`.
            use_rslora: rank-stabilised scaling.
            key: initialises A.

        Returns:
            The wrapped layer.
        """
        n, dtype, last = base.num_spatial_dims, base.weight.dtype, base.channels_last
        padding: Any = base.padding
        lora_a = Conv(
            n, base.in_channels, r, base.kernel_size, base.stride, padding, base.dilation,
            use_bias=False, dtype=dtype, key=key, channels_last=last,
        )  # fmt: skip
        lora_b = Conv(
            n, r, base.out_channels, 1, use_bias=False, dtype=dtype,
            weight_init=_init.zeros, key=key, channels_last=last,
        )  # fmt: skip
        return cls(
            base_layer=base,
            lora_A=lora_a,
            lora_B=lora_b,
            lora_dropout=Dropout(dropout),
            r=r,
            lora_alpha=alpha,
            use_rslora=use_rslora,
        )

    def delta_weight(self) -> Array:
        """`scaling * B ∘ A` laid out as `base_layer.weight` (a layer axis kept in front)."""
        last = self.base_layer.channels_last
        ndim = self.base_layer.num_spatial_dims + 2
        a, b = self.lora_A.weight, self.lora_B.weight

        def one(a: Array, b: Array) -> Array:
            if last:  # a: (*kernel, in, r), b: (1.., r, out)
                return jnp.einsum("...ir,ro->...io", a, b.reshape(b.shape[-2:]))
            return jnp.einsum("or,ri...->oi...", b.reshape(b.shape[:2]), a)

        return _vmapped(one, a.ndim - ndim)(a, b) * self.scaling  # type: ignore[no-any-return]
