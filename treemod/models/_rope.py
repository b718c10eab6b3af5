"""Rotary position embeddings as the Llama family in `transformers` computes them.

`rope_config` reads a config's RoPE settings the way `transformers` 5 standardises them
(`rope_parameters`, or the older `rope_scaling`, with `rope_theta` and `partial_rotary_factor`
folded in); `Rope` holds the inverse frequencies, computed once at construction with NumPy
in float32 as `transformers`' `ROPE_INIT_FUNCTIONS` do, as static data (they are not
parameters: `transformers` does not save them either). Types: default, linear, dynamic (NTK,
stateless: the frequencies follow the longest position of the call, as a freshly built
`transformers` model's do), yarn, longrope (long or short factors by the call's longest
position), llama3, proportional.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import Array

from treemod._module.module import Module, field
from treemod.models._base import config_error
from treemod.models._config_values import check_value

__all__ = ["ROPE_TYPES", "Rope", "apply_rope", "rope_config"]

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
_F32 = np.float32


def rope_config(owner: str, config: Mapping[str, Any], max_positions: int) -> dict[str, Any]:
    """The standardised RoPE parameters of `config`, as `transformers`' config class makes them.

    Arguments:
        owner: the model class, for messages.
        config: the config dict.
        max_positions: the config's `max_position_embeddings`.

    Returns:
        A plain dict with `rope_type`, `rope_theta` and the type's own keys.
    """
    scaling = config.get("rope_scaling")
    given = scaling or config.get("rope_parameters") or {}
    where = "rope_scaling" if scaling else "rope_parameters"
    if not isinstance(given, Mapping):
        raise config_error(owner, where, given, "a dict of RoPE parameters, or null")
    params = dict(given)
    for value in params.values():
        if isinstance(value, Mapping):  # nested per layer type: Llama's rotary reads one dict
            raise config_error(owner, where, dict(given), "one RoPE dict for all layers")
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    if config.get("partial_rotary_factor") is not None:
        params.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    params.setdefault("rope_type", params.get("type", "default"))
    if params["rope_type"] in ("llama3", "yarn", "longrope"):
        params.setdefault("original_max_position_embeddings", max_positions)
    if params["rope_type"] not in ROPE_TYPES:
        raise config_error(
            owner, f"{where}.rope_type", params["rope_type"], ", ".join(map(repr, ROPE_TYPES))
        )
    # A zero, negative, non-finite or non-numeric value would give NaN or infinite angles
    # everywhere: refused by name (the top-level key, or the dict's).
    for name, kind in _NUMBERS.items():
        if params.get(name) is not None:
            key = name if name in config and name not in given else f"{where}.{name}"
            params[name] = check_value(owner, key, params[name], kind)
    factor = params.get("partial_rotary_factor")
    if factor is not None and not 0 < factor <= 1:
        raise config_error(owner, "partial_rotary_factor", factor, "a number in (0, 1]")
    low, high = params.get("low_freq_factor"), params.get("high_freq_factor")
    if low is not None and high is not None and not high > low:
        raise config_error(
            owner, f"{where}.high_freq_factor", high, f"a number above low_freq_factor ({low})"
        )
    return params


_NUMBERS = {
    "rope_theta": "positive",
    "factor": "positive",
    "low_freq_factor": "positive",
    "high_freq_factor": "positive",
    "original_max_position_embeddings": "size",
    "attention_factor": "positive",
    "beta_fast": "positive",
    "beta_slow": "positive",
    "partial_rotary_factor": "positive",
}


def _need(owner: str, params: Mapping[str, Any], name: str) -> Any:
    value = params.get(name)
    if value is None:
        raise config_error(
            owner,
            f"rope_parameters.{name}",
            value,
            f"a value: rope_type {params['rope_type']!r} requires {name!r}",
        )
    return value


def _exponents(dim: int) -> np.ndarray:
    return np.arange(0, dim, 2, dtype=np.int64).astype(_F32) / _F32(dim)


def _default(base: float, dim: int) -> np.ndarray:
    return (_F32(1.0) / (_F32(base) ** _exponents(dim))).astype(_F32)


def _yarn(
    params: Mapping[str, Any], base: float, dim: int, max_positions: int
) -> tuple[np.ndarray, float]:
    factor = params.get("factor")
    original = params["original_max_position_embeddings"]
    if factor is None:
        factor = max_positions / original
    attention_factor = params.get("attention_factor")
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")

    def get_mscale(scale: float, m: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(
                get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
            )
        else:
            attention_factor = get_mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=_F32) - _F32(low)) / _F32(high - low), 0, 1)
    pos_freqs = _F32(base) ** _exponents(dim)
    extrapolation = _F32(1.0) / pos_freqs
    interpolation = _F32(1.0) / (_F32(factor) * pos_freqs)
    keep = (_F32(1) - ramp).astype(_F32)
    inv_freq = interpolation * (_F32(1) - keep) + extrapolation * keep
    return inv_freq.astype(_F32), float(attention_factor)


def _llama3(owner: str, params: Mapping[str, Any], base: float, dim: int) -> np.ndarray:
    inv_freq = _default(base, dim)
    factor = _need(owner, params, "factor")
    low_factor = _need(owner, params, "low_freq_factor")
    high_factor = _need(owner, params, "high_freq_factor")
    old_len = params["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low_factor, old_len / high_factor
    wavelen = (_F32(2 * math.pi) / inv_freq).astype(_F32)
    scaled = np.where(wavelen > _F32(low_wavelen), inv_freq / _F32(factor), inv_freq).astype(_F32)
    smooth = (_F32(old_len) / wavelen - _F32(low_factor)) / _F32(high_factor - low_factor)
    smoothed = (_F32(1) - smooth) * scaled / _F32(factor) + smooth * scaled
    medium = ~(wavelen < _F32(high_wavelen)) & ~(wavelen > _F32(low_wavelen))
    return np.where(medium, smoothed, scaled).astype(_F32)


class Rope(Module):
    """Rotary embedding tables of one config: `cos, sin = rope(position_ids, dtype)`.

    Build it with `Rope.from_config`. The inverse frequencies are static tuples, so equal
    configs give equal (and jit-cache-sharing) modules, and nothing appears in a state dict.
    """

    rope_type: str = field(static=True)
    inv_freq: tuple[float, ...] = field(static=True)
    attention_scaling: float = field(static=True)
    long_inv_freq: tuple[float, ...] = field(static=True, default=())
    threshold: int = field(static=True, default=0)
    base: float = field(static=True, default=0.0)
    dim: int = field(static=True, default=0)
    factor: float = field(static=True, default=1.0)

    @classmethod
    def from_config(
        cls,
        owner: str,
        params: Mapping[str, Any],
        head_dim: int,
        max_positions: int,
        *,
        partial_rotary: bool = False,
    ) -> Rope:
        """The tables for standardised RoPE `params` (from `rope_config`).

        Arguments:
            owner: the model class, for messages.
            params: `rope_config`'s dict.
            head_dim: the attention heads' size.
            max_positions: the config's `max_position_embeddings`.
            partial_rotary: the model rotates the first `partial_rotary_factor` of each head with
                every rope type (Phi-3's rotary); else only `"proportional"` reads the factor.

        Returns:
            The `Rope`.
        """
        kind = params["rope_type"]
        base = float(params["rope_theta"])
        if head_dim % 2:
            raise config_error(owner, "head_dim", head_dim, "an even head size for RoPE")
        partial = params.get("partial_rotary_factor", 1.0)
        dim = head_dim if kind == "default" and not partial_rotary else int(head_dim * partial)
        if partial_rotary and (dim % 2 or dim < 2):
            raise config_error(
                owner, "rope_parameters.partial_rotary_factor", partial, "an even rotary size"
            )
        if not partial_rotary and kind != "proportional" and dim != head_dim:
            raise config_error(
                owner,
                "rope_parameters.partial_rotary_factor",
                partial,
                "1.0 with this rope_type (transformers' Llama rotary cannot apply a partial one)",
            )
        scaling: float = 1.0
        extra: dict[str, Any] = {}
        if kind == "default":
            inv_freq = _default(base, dim)
        elif kind == "linear":
            inv_freq = _default(base, dim) / _F32(_need(owner, params, "factor"))
        elif kind == "dynamic":
            inv_freq = _default(base, dim)
            factor = float(_need(owner, params, "factor"))
            extra = {"threshold": max_positions, "base": base, "dim": dim, "factor": factor}
        elif kind == "yarn":
            inv_freq, scaling = _yarn(params, base, dim, max_positions)
        elif kind == "longrope":
            short = np.asarray(_need(owner, params, "short_factor"), _F32)
            long = np.asarray(_need(owner, params, "long_factor"), _F32)
            original = params["original_max_position_embeddings"]
            for name, table in (("short_factor", short), ("long_factor", long)):
                if table.shape != (dim // 2,):
                    raise config_error(
                        owner, f"rope_parameters.{name}", params[name], f"{dim // 2} numbers"
                    )
            given_factor = params.get("factor")
            factor = max_positions / original if given_factor is None else given_factor
            given = params.get("attention_factor")
            if given is not None:
                scaling = float(given)
            elif factor > 1.0:
                scaling = math.sqrt(1 + math.log(factor) / math.log(original))
            powers = _F32(base) ** _exponents(dim)
            inv_freq = _F32(1.0) / (short * powers)
            long_freq = _F32(1.0) / (long * powers)
            extra = {"long_inv_freq": _floats(long_freq), "threshold": original}
        elif kind == "llama3":
            inv_freq = _llama3(owner, params, base, dim)
        else:  # proportional
            angles = int(partial * head_dim // 2)
            exps = np.arange(0, 2 * angles, 2, dtype=np.int64).astype(_F32) / _F32(head_dim)
            rotated = _F32(1.0) / (_F32(base) ** exps)
            inv_freq = np.concatenate([rotated, np.zeros(head_dim // 2 - angles, _F32)])
            inv_freq = inv_freq / _F32(params.get("factor", 1.0))
        return cls(
            rope_type=kind, inv_freq=_floats(inv_freq), attention_scaling=float(scaling), **extra
        )

    def __call__(self, position_ids: Array, dtype: Any) -> tuple[Array, Array]:
        """`cos, sin`, each `(batch, seq, head_dim)` in `dtype`, for integer `position_ids`.

        Arguments:
            position_ids: `(batch, seq)` integer positions.
            dtype: the dtype of the hidden states they multiply.

        Returns:
            The cosine and sine tables, scaled by the type's attention factor.
        """
        inv_freq = jnp.asarray(self.inv_freq, jnp.float32)
        if self.rope_type in ("dynamic", "longrope"):
            seq_len = jnp.max(position_ids) + 1
            longer = seq_len > self.threshold
            if self.rope_type == "longrope":
                inv_freq = jnp.where(longer, jnp.asarray(self.long_inv_freq, jnp.float32), inv_freq)
            else:
                inv_freq = jnp.where(longer, self._dynamic(seq_len), inv_freq)
        freqs = position_ids[..., None].astype(jnp.float32) * inv_freq[None, None]
        emb = jnp.concatenate([freqs, freqs], axis=-1)
        scale = jnp.float32(self.attention_scaling)
        return (jnp.cos(emb) * scale).astype(dtype), (jnp.sin(emb) * scale).astype(dtype)

    def _dynamic(self, seq_len: Array) -> Array:
        # transformers' _compute_dynamic_ntk_parameters with the call's length, in float32.
        length = jnp.maximum(seq_len, self.threshold).astype(jnp.float32)
        factor, dim = jnp.float32(self.factor), self.dim
        ratio = factor * length / jnp.float32(self.threshold) - (factor - 1)
        base = jnp.float32(self.base) * ratio ** jnp.float32(dim / (dim - 2))
        inv_freq: Array = 1.0 / (base ** jnp.asarray(_exponents(dim)))
        return inv_freq


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """Rotate `x` `(batch, seq, heads, head_dim)` by the tables `(batch, seq, head_dim)`.

    Arguments:
        x: queries or keys.
        cos: `Rope`'s cosine table.
        sin: `Rope`'s sine table.

    Returns:
        `x * cos + rotate_half(x) * sin`, as `transformers`' `apply_rotary_pos_emb`; tables
        narrower than `x` (a partial rotary) turn its first features only, as Phi-3's.
    """
    dim = cos.shape[-1]
    if dim < x.shape[-1]:  # partial rotary: the first `dim` features turn, the rest pass
        return jnp.concatenate([apply_rope(x[..., :dim], cos, sin), x[..., dim:]], axis=-1)
    half = dim // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None] + rotated * sin[:, :, None]


def _floats(a: np.ndarray) -> tuple[float, ...]:
    return tuple(float(v) for v in np.asarray(a, _F32))
